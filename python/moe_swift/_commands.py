"""What the `python -m moe_swift.*` commands share: how they end. A bad argument is one line
and exit code 2 (argparse's own usage errors too), a failure one line and exit code 1
(MOE_SWIFT_TRACEBACK=1 shows the traceback instead), Ctrl-C exit code 130."""

from __future__ import annotations

import os
import sys


class UsageError(Exception):
    """A bad argument: said in one line, exit code 2."""


def run(prog, body) -> int:
    """Runs `body()` as command `prog` and returns its exit code."""
    try:
        body()
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if os.environ.get("MOE_SWIFT_TRACEBACK"):
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(f"{prog}: error: {type(exc).__name__}: {first} (MOE_SWIFT_TRACEBACK=1 shows where)", file=sys.stderr)
        return 1
    return 0
