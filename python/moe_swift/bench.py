"""`python -m moe_swift.bench` was the benchmark suite; it is no longer part of the
package (users need not install it) and lives in the repository's benchmarks/ folder.
Running this module says so instead of failing with a bare ModuleNotFoundError."""

import sys

if __name__ == "__main__":
    sys.exit("moe_swift.bench moved out of the package: from a checkout of moe-swift, run "
             "`python benchmarks/run.py` (same options; docs/performance.md)")
