#!/usr/bin/env python3
"""A checkpoint stored one tensor per expert (Qwen3-MoE, Mixtral, DeepSeek, OLMoE as
published, in bf16), read where it lies against the same layer copied: the memory each
costs, and what reaching the experts through a per-expert table costs in speed.

    python benchmarks/bench_per_expert.py                   # 32 experts, cpu and softmetal
    python benchmarks/bench_per_expert.py --experts 128 --rounds 40

Writes a Qwen3-30B-A3B-shaped layer (H = 2048, I = 768, top-8, bf16, one tensor per
expert) into a temporary folder, then in a fresh process per backend loads it mapped
(`from_pretrained`: the experts read in place through the table) and copied
(`copy_weights=True`: stacked copies, as every per-expert checkpoint was loaded before the
table), reports the anonymous memory each load adds, and times forwards at T = 1 and 64,
the two layers alternating so that the machine's drift hits both alike (medians). The
softmetal figures are the software device's, which runs the Metal kernels on the CPU: the
table's cost on a GPU is not measured by them.

Writes a table on stdout and a JSON file (--json, default benchmarks/results/per_expert.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASURE = """
import json, statistics, sys, time
from pathlib import Path
import numpy as np
import moe_swift

def anonymous():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

folder, backend, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
moe_swift.from_pretrained(folder, 0, backend=backend).close()  # the backend's one-time start-up
layers, memory = {}, {}
for name, copy in (("table", False), ("copied", True)):
    before = anonymous()
    layers[name] = moe_swift.from_pretrained(folder, 0, backend=backend, copy_weights=copy)
    memory[name] = anonymous() - before
rng = np.random.default_rng(0)
times = {}
for tokens in (1, 64):
    x = rng.standard_normal((tokens, layers["table"].hidden_size)).astype(np.float32)
    runs = {name: [] for name in layers}
    n = rounds if backend == "cpu" or tokens == 1 else max(2, rounds // 10)
    for _ in range(n):
        for name, layer in layers.items():
            t = time.perf_counter()
            layer(x)
            runs[name].append(time.perf_counter() - t)
    times[tokens] = {name: statistics.median(r) * 1e3 for name, r in runs.items()}
print(json.dumps({"memory": memory, "ms": times}))
"""


def make_checkpoint(folder: Path, experts: int) -> int:
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    import make_checkpoints as fixtures

    fixtures.H, fixtures.LAYERS = 2048, 1
    fixtures.CASES["per_expert"] = ("qwen3_moe", "per_expert", "bfloat16", experts, 8, 768,
                                    {"norm_topk_prob": True, "mlp_only_layers": []})
    fixtures.make("per_expert", folder)
    return 3 * experts * 768 * 2048 * 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--backends", default="cpu,softmetal")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "per_expert.json"))
    args = parser.parse_args()
    results = {"machine": platform.processor() or platform.machine(), "experts": args.experts, "backends": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "per_expert"
        expert_bytes = make_checkpoint(folder, args.experts)
        results["expert_bytes"] = expert_bytes
        print(f"Qwen3-30B-A3B-shaped layer, {args.experts} experts stored one bf16 tensor each: "
              f"{expert_bytes / 1e6:.0f} MB of experts")
        print(f"{'backend':10} {'anon. memory, table':>20} {'copied':>10} {'T=1 table/copied':>22} {'T=64 table/copied':>24}")
        for backend in args.backends.split(","):
            run = subprocess.run([sys.executable, "-c", MEASURE, str(folder), backend, str(args.rounds)],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{backend:10} failed: {run.stderr.strip().splitlines()[-1] if run.stderr else run.returncode}")
                continue
            r = json.loads(run.stdout.strip().splitlines()[-1])
            results["backends"][backend] = r
            ms = r["ms"]
            cells = [f"{ms[t]['table']:.2f}/{ms[t]['copied']:.2f} ms {ms[t]['table'] / ms[t]['copied']:.2f}x"
                     for t in ("1", "64")]
            print(f"{backend:10} {r['memory']['table'] / 1e6:>17.1f} MB {r['memory']['copied'] / 1e6:>7.1f} MB "
                  f"{cells[0]:>22} {cells[1]:>24}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
