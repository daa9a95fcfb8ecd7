"""python -m moe_swift.mlx_lm generate|chat|server ...: mlx-lm's own commands, with every
SwitchGLU of the model patched to run on moe_swift.

The arguments are mlx-lm's (`python -m moe_swift.mlx_lm generate --help`); the backend is
chosen with the environment variable MOE_SWIFT_BACKEND (default "auto"). Needs mlx-lm.
"""

from __future__ import annotations

import importlib
import os
import sys

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


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m moe_swift.mlx_lm {{{','.join(COMMANDS)}}} [mlx-lm's arguments]\n"
              + __doc__.split("\n\n")[1], file=sys.stderr)
        return 2
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
    module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
