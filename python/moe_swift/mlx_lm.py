"""python -m moe_swift.mlx_lm generate|chat|server ...: mlx-lm's own commands, with every
SwitchGLU of the model patched to run on moe_swift.

The arguments are mlx-lm's (`python -m moe_swift.mlx_lm generate --help`); the backend is
chosen with the environment variable MOE_SWIFT_BACKEND (default "auto"). mlx-lm prints the
prompt's and the generation's tokens/s. A --model Hub id with the network down is used from
the cache, or fails in seconds. Needs mlx-lm.
"""

from __future__ import annotations

import importlib
import os
import sys

from ._commands import looks_like_hub_id, prepare_hub_model, run

COMMANDS = ("generate", "chat", "server")


def _patched(load, backend):
    """mlx-lm's `load` (or `sharded_load`), patching the model it returns."""
    from .integrations.mlx_lm import patch

    def load_and_patch(*args, **kwargs):
        result = load(*args, **kwargs)
        model = result[0] if isinstance(result, tuple) else result
        replaced = patch(model, backend=backend)
        print(f"moe_swift: {replaced} SwitchGLU layer(s) run on moe_swift ({backend})", file=sys.stderr)
        return result

    return load_and_patch


def _model_argument(argv):
    """The value of --model in mlx-lm's arguments, or None."""
    for i, arg in enumerate(argv):
        if arg == "--model" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    return None


def _usage():
    return (f"usage: python -m moe_swift.mlx_lm {{{','.join(COMMANDS)}}} [mlx-lm's arguments]\n\n"
            + __doc__.split("\n\n")[1])


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if not argv or argv[0] not in COMMANDS:
        given = f"unknown command {argv[0]!r}\n" if argv else ""
        print(given + _usage(), file=sys.stderr)
        return 2
    prog = f"python -m moe_swift.mlx_lm {argv[0]}"
    model = _model_argument(argv)
    if model is not None and looks_like_hub_id(model):
        code = run(prog, lambda: prepare_hub_model(prog, model))  # before mlx-lm imports huggingface_hub
        if code:
            return code
    try:
        module = importlib.import_module(f"mlx_lm.{argv[0]}")
    except ImportError as exc:
        print(f"python -m moe_swift.mlx_lm needs mlx-lm (`pip install mlx-lm`; on Linux with "
              f"`mlx[cpu]`): {exc}", file=sys.stderr)
        return 2
    backend = os.environ.get("MOE_SWIFT_BACKEND", "auto")
    for name in ("load", "sharded_load"):
        if hasattr(module, name):
            setattr(module, name, _patched(getattr(module, name), backend))
    sys.argv = [f"mlx_lm.{argv[0]}"] + argv[1:]
    # mlx-lm's own argument errors exit 2 through its argparse.
    return run(prog, module.main)


if __name__ == "__main__":
    sys.exit(main())
