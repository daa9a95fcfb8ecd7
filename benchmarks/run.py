#!/usr/bin/env python3
"""The benchmark suite's command, run from a checkout: `python benchmarks/run.py --help`.

The suite (benchmarks/moe_bench) is not part of the moe_swift package, so that users do
not install it; running this file puts its folder on the import path.
"""

import sys

from moe_bench.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
