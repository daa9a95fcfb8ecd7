#!/usr/bin/env python3
"""CPU benchmark of ours vs the grouped NumPy baseline and the float64 reference.

This was the first benchmark; the suite it grew into is `python benchmarks/run.py`
(the grouped NumPy baseline is moe_bench.grouped, the alternating-block timing
moe_bench.runner). This file runs it with the peers this script always had:

    python benchmarks/bench_cpu.py                 # = python benchmarks/run.py --peers ours,numpy,reference
    python benchmarks/bench_cpu.py --no-reference  # ours and NumPy only
    python benchmarks/bench_cpu.py --quick --shapes qwen3-30b-a3b --tokens 1,64

Every other option is `python benchmarks/run.py`'s (see --help); results go to
benchmarks/results/bench_cpu.json unless --json says otherwise.
"""

import sys
from pathlib import Path

from moe_bench.__main__ import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    peers = "ours,numpy,reference"
    if "--no-reference" in argv:
        argv.remove("--no-reference")
        peers = "ours,numpy"
    if not any(a == "--peers" or a.startswith("--peers=") for a in argv):
        argv = ["--peers", peers] + argv
    if not any(a == "--json" or a.startswith("--json=") for a in argv):
        name = "bench_cpu_quick.json" if "--quick" in argv else "bench_cpu.json"
        argv += ["--json", str(Path(__file__).resolve().parent / "results" / name)]
    sys.exit(main(argv))
