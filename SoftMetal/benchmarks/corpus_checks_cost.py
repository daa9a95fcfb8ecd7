"""What the third-party corpus costs under its checks, cold: each corpus test file run by
pytest with an empty SoftMetal cache (every kernel, its instrumented build and its
language and address-space checks compiled), once as the normal run chooses the checks
(the first case of each test function under checks="all", the rest under the default
checks: tests/python/conftest.py) and once with SOFTMETAL_CORPUS_CHECKS=all (every case
under checks="all").

    python SoftMetal/benchmarks/corpus_checks_cost.py [--only family|all] [--durations 30]

Prints wall and CPU seconds per file and mode, and each run's slowest tests (pytest
--durations). Needs the harness library (MOE_SWIFT_LIBRARY, or an installed moe-swift).

One run (2 cores shared with four other helpers' builds and tests, and the runs of a mode
made beside other test runs of the same session, so the numbers are rough and only their
ratio means much):

| file | checks | tests | wall (s) | CPU, pytest and its clang++ runs (s) |
| --- | --- | --- | --- | --- |
| test_third_party_kernels.py | every case under checks="all" (before) | 107 passed, 2 xfailed | 1633 | 497 |
| test_third_party_kernels.py | first case of each family (now) | 107 passed, 2 xfailed | 1238 | 405 |
| test_third_party_mlx.py | first case of each family (now) | 112 passed | 1390 | 312 |

(These rows were timed with `/usr/bin/time` around the same pytest command this script runs.)
The MLX file under every check was not timed alone; with test_softmetal.py in the same
pytest run it took 1671 s of wall time. Cold, most of the time is compiling: ggml's
kernels are compiled one by one, each with its language and address-space checks, so
the first case of a family (its normal and instrumented builds) dominates; the other
cases now skip the instrumented build and the memory check's 15-30x.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests" / "python"
FILES = ("test_third_party_mlx.py", "test_third_party_kernels.py")
MODES = {"family": {}, "all": {"SOFTMETAL_CORPUS_CHECKS": "all"}}


def run(path: Path, extra_env: dict, durations: int) -> tuple[float, float, str]:
    with tempfile.TemporaryDirectory(prefix="softmetal-cold-") as cache:
        env = dict(os.environ, SOFTMETAL_CACHE_DIR=cache, **extra_env)
        env.pop("SOFTMETAL_CHECKS", None)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path),
                              f"--durations={durations}"], env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return wall, cpu, out.stdout[-6000:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(MODES))
    parser.add_argument("--durations", type=int, default=30)
    args = parser.parse_args()
    rows = []
    for mode, env in MODES.items():
        if args.only and mode != args.only:
            continue
        for name in FILES:
            wall, cpu, tail = run(TESTS / name, env, args.durations)
            print(f"== {name}, {mode}: {wall:.0f} s wall, {cpu:.0f} s CPU\n{tail}", flush=True)
            rows.append((name, mode, wall, cpu))
    print("| file | checks | wall (s) | CPU (s) |\n| --- | --- | --- | --- |")
    for name, mode, wall, cpu in rows:
        print(f"| {name} | {mode} | {wall:.0f} | {cpu:.0f} |")


if __name__ == "__main__":
    main()
