"""python -m moe_swift: what this installation has — the native library, its backends, the
commands and integrations that can run here. For C programs, where the library is:
--pkg-config-path | --include-dir | --library, e.g.

    export PKG_CONFIG_PATH=$(python3 -m moe_swift --pkg-config-path)
    cc app.c -o app $(pkg-config --cflags --libs moe_swift)
"""

import argparse
import importlib.util

from . import _native

# (command, what it does, the package it needs)
COMMANDS = (
    ("python -m moe_swift.mlx_lm generate|chat|server ...", "mlx-lm's commands with every SwitchGLU on moe_swift", "mlx_lm"),
    ("python -m moe_swift.transformers generate|chat --model M [--prompt P]",
     "text from a transformers model, experts on moe_swift", "transformers"),
)


def _listing() -> str:
    from . import __version__, available_backends, cpu_instruction_set

    lines = [f"moe_swift {__version__}", f"  library:   {_native.library_path()}",
             f"  backends:  {', '.join(available_backends())} (\"auto\" picks the first)",
             f"  cpu kernels: {cpu_instruction_set()}", "", "commands:"]
    for command, what, needs in COMMANDS:
        here = importlib.util.find_spec(needs) is not None
        lines.append(f"  {command}\n      {what}" + ("" if here else f" (needs {needs}: not installed)"))
    lines += ["", "for C programs: python -m moe_swift --pkg-config-path | --include-dir | --library"]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m moe_swift", description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--pkg-config-path", action="store_true", help="the folder holding moe_swift.pc")
    group.add_argument("--include-dir", action="store_true", help="the folder holding moe_swift.h")
    group.add_argument("--library", action="store_true", help="the path of libMoESwift")
    args = parser.parse_args(argv)
    if args.pkg_config_path:
        print(_native.NATIVE_DIR)
    elif args.include_dir:
        print(_native.header_path().parent)
    elif args.library:
        print(_native.library_path())
    else:
        print(_listing())


if __name__ == "__main__":
    main()
