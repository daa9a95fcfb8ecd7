"""What the `python -m moe_swift.*` commands share: how they end. A bad argument is one line
and exit code 2 (argparse's own usage errors too), a failure one line and exit code 1
(MOE_SWIFT_TRACEBACK=1 shows the traceback instead), Ctrl-C exit code 130."""

from __future__ import annotations

import os
import sys


class UsageError(Exception):
    """A bad argument: said in one line, exit code 2."""


class CommandError(Exception):
    """A failure whose message says all (no traceback is of use): one line, exit code 1."""


def run(prog, body) -> int:
    """Runs `body()` as command `prog` and returns its exit code."""
    try:
        body()
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except CommandError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if os.environ.get("MOE_SWIFT_TRACEBACK"):
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(f"{prog}: error: {type(exc).__name__}: {first} (MOE_SWIFT_TRACEBACK=1 shows where)", file=sys.stderr)
        return 1
    return 0


# How long the commands wait for the Hub's host before deciding the network is down.
HUB_PROBE_SECONDS = 3.0


def _hub_endpoint():
    """(host, port) of the Hub endpoint huggingface_hub would use (HF_ENDPOINT or huggingface.co)."""
    from urllib.parse import urlsplit
    url = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def _hub_reachable():
    """None when the Hub's host answers a TCP connection within HUB_PROBE_SECONDS, else why not.
    Without this, a download library retries a dead network for most of a minute."""
    import socket
    host, port = _hub_endpoint()
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_SECONDS).close()
        return None
    except OSError as exc:
        return f"{host}:{port} did not answer ({type(exc).__name__}: {exc})"


def looks_like_hub_id(model):
    """True for "org/name" that is not a path here (from_pretrained's rule for a Hub id)."""
    from .checkpoint import _REPO_ID
    return isinstance(model, str) and "/" in model and bool(_REPO_ID.match(model)) and not os.path.exists(model)


def prepare_hub_model(prog, model, required="config.json"):
    """Before a framework touches the Hub for `model` (a Hub id): a down network is found in
    seconds, not after the download library's retries. With no answer from the Hub, the
    command goes on offline (HF_HUB_OFFLINE=1, set before huggingface_hub is imported) when
    the cache holds the model, and otherwise fails in one line saying what was tried."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    why = None if offline else _hub_reachable()
    if why is not None:
        os.environ["HF_HUB_OFFLINE"] = "1"
    if not offline and why is None:
        return
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        raise UsageError(f"--model {model}: a Hub id needs huggingface_hub (pip install huggingface_hub)") from None
    cached = try_to_load_from_cache(model, required)
    if isinstance(cached, str):
        if why is not None:
            print(f"{prog}: the Hub cannot be reached ({why}): using {model} from the cache {HF_HUB_CACHE}",
                  file=sys.stderr)
        return
    tried = "HF_HUB_OFFLINE is set" if why is None else f"the Hub cannot be reached: {why}"
    raise CommandError(f"--model {model}: not in the cache {HF_HUB_CACHE} and {tried}; connect to the network "
                     "to download it once, or give a local folder")
