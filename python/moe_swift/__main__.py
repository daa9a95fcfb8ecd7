"""python -m moe_swift --pkg-config-path | --include-dir | --library: where the installed
native library is, for C programs:

    export PKG_CONFIG_PATH=$(python3 -m moe_swift --pkg-config-path)
    cc app.c -o app $(pkg-config --cflags --libs moe_swift)
"""

import argparse

from . import _native


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m moe_swift", description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--pkg-config-path", action="store_true", help="the folder holding moe_swift.pc")
    group.add_argument("--include-dir", action="store_true", help="the folder holding moe_swift.h")
    group.add_argument("--library", action="store_true", help="the path of libMoESwift")
    args = parser.parse_args(argv)
    if args.pkg_config_path:
        print(_native.NATIVE_DIR)
    elif args.include_dir:
        print(_native.header_path().parent)
    else:
        print(_native.library_path())


if __name__ == "__main__":
    main()
