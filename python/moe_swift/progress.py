"""Progress of long work: loading a checkpoint's layers, an integration building its layers.

Work shorter than DELAY seconds shows nothing, so short calls (and the tests) stay quiet.
Past that, on a terminal (stderr a tty) a bar: tqdm's when it is installed (transformers
and huggingface_hub bring it), else one line of our own rewritten in place; when stderr is
not a terminal, INFO records of the "moe_swift" logger (shown where logging is configured
to show them). Every function that reports progress takes `progress`: None (the default)
follows the environment variable MOE_SWIFT_PROGRESS (0/false/off: silent, 1/true/on:
shown from the first step, unset: after DELAY), False is silent, True shows it from the
first step.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

__all__ = ["Progress", "Waiting", "ENVIRONMENT", "DELAY"]

logger = logging.getLogger("moe_swift")
ENVIRONMENT = "MOE_SWIFT_PROGRESS"
DELAY = 2.0
# Without a terminal, a record this often at the most: a log is read later, not watched.
LOG_EVERY = 10.0

_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


def setting(progress=None):
    """False (silent), True (shown from the first step) or None (shown after DELAY)."""
    if progress is None:
        value = os.environ.get(ENVIRONMENT, "").strip().lower()
        if value in _OFF:
            return False
        if value in _ON:
            return True
        if value:
            raise ValueError(f"{ENVIRONMENT} must be one of {_OFF + _ON} or unset, got {value!r}")
        return None
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None, got {type(progress).__name__}")
    return progress


def _is_terminal(stream):
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """Counts the steps of one piece of work (`total` of them, or an unknown number) and
    shows them as the module docstring says; `close()` (or leaving a `with`) ends it."""

    def __init__(self, description, total=None, *, unit="layer", progress=None, stream=None):
        self.mode = setting(progress)
        self.description, self.total, self.unit = description, total, unit
        self.count = 0
        self.stream = sys.stderr if stream is None else stream
        self._start = time.monotonic()
        self._shown = False
        self._bar = None
        self._logged_at = None
        self._terminal = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def update(self, n=1):
        self.count += n
        if self.mode is False:
            return
        now = time.monotonic()
        if not self._shown:
            if self.mode is None and now - self._start < DELAY:
                return
            self._show(done_before=self.count - n)
        if self._bar is not None:
            self._bar.update(n)
        elif self._terminal:
            self._line(now)
        elif now - self._logged_at >= LOG_EVERY:
            self._log(now)

    def close(self):
        if not self._shown:
            return
        self._shown = False
        now = time.monotonic()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._terminal:
            self._line(now)
            self.stream.write("\n")
            self.stream.flush()
        else:
            logger.info("%s: done, %d %s in %.1f s", self.description, self.count, self._units(self.count),
                        now - self._start)

    def _show(self, done_before):
        self._shown = True
        self._terminal = _is_terminal(self.stream)
        if not self._terminal:
            self._log(time.monotonic())
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        # The step that made the bar appear is added by update() like every later one.
        self._bar = tqdm(total=self.total, initial=done_before, desc=self.description,
                         unit=self.unit, file=self.stream, dynamic_ncols=True)

    def _units(self, n):
        return self.unit if n == 1 else self.unit + "s"

    def _counted(self):
        """'3/48 layers', or '3 layers' when the total is not known."""
        n = self.count if self.total is None else self.total
        return (f"{self.count}/{self.total}" if self.total is not None else str(self.count)) + " " + self._units(n)

    def _line(self, now):
        self.stream.write(f"\r{self.description}: {self._counted()}, {now - self._start:.0f} s")
        self.stream.flush()

    def _log(self, now):
        self._logged_at = now
        logger.info("%s: %s after %.1f s", self.description, self._counted(), now - self._start)


class Waiting:
    """One native call that may be long (e.g. SoftMetal compiling its kernels): after DELAY
    seconds still inside it (from the start with progress=True), a line saying `what` —
    written on stderr when it is a terminal, else an INFO record — and, at the end, one
    saying how long it took. A timer thread writes the first line: the call releases the GIL."""

    def __init__(self, what, *, progress=None, stream=None):
        self.what, self.mode = what, setting(progress)
        self.stream = sys.stderr if stream is None else stream
        self._timer = None
        self._said = False
        self._lock = threading.Lock()

    def __enter__(self):
        self._start = time.monotonic()
        delay = 0.0 if self.mode else DELAY
        if self.mode is not False and delay < float("inf"):
            self._timer = threading.Timer(delay, self._say)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc):
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            said, self._said = self._said, True  # a timer firing now stays quiet
        if said:
            self._write(f"{self.what}: done in {time.monotonic() - self._start:.1f} s")
        return False

    def _say(self):
        with self._lock:
            if self._said:
                return
            self._said = True
        self._write(f"{self.what}...")

    def _write(self, line):
        if _is_terminal(self.stream):
            self.stream.write(line + "\n")
            self.stream.flush()
        else:
            logger.info("%s", line)
