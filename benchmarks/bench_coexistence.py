#!/usr/bin/env python3
"""The layer among the host's own work: what a call costs right after the host's NumPy
(OpenBLAS), torch (OpenMP) or MLX op, and what the host's next op costs right after our call,
against each alone. A script that alternates its own attention with our MoE layer pays
both on every layer; thread pools that spin after their work steal each other's cores.

    python benchmarks/bench_coexistence.py                  # f32 and bf16, T = 1 and 256
    python benchmarks/bench_coexistence.py --rounds 400 --tokens 1

Every op is timed alone (a run of it after a pause, so that no thread pool is still
spinning from the other's work) and alternating with the other (host op, layer, host
op, ...), the runs repeated in blocks in one process so that the machine's drift hits
every column alike; medians are reported, and the ratios "after / alone" are what the
layer and the host lose to each other. The host
ops are a 32 MB float32 matrix-vector product (a decode step's projection) and, at
T = 256, a (256, 2048) x (2048, 2048) product, in NumPy and, when installed, torch and MLX, each
on the next of several matrices (256 MB in all), so that it reads cold weights as a
model's next projection does.

Writes a table on stdout and a JSON file (--json, default benchmarks/results/coexistence.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import moe_swift

# Qwen3-30B-A3B's MoE layer with 32 of its 128 experts (the layer benchmark's default).
H, I, E, K = 2048, 768, 32, 8
# The environment variables that change the outcome, reported with it.
KNOBS = ("MOE_CPU_THREADS", "MOE_CPU_SPIN_US", "OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT", "OMP_NUM_THREADS",
         "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def make_layer(dtype, seed=0):
    rng = np.random.default_rng(seed)
    router = rng.standard_normal((E, H), dtype=np.float32) * H ** -0.5
    gate_up = rng.standard_normal((E, 2 * I, H), dtype=np.float32) * H ** -0.5
    down = rng.standard_normal((E, H, I), dtype=np.float32) * I ** -0.5
    if dtype == "bfloat16":
        import ml_dtypes

        gate_up, down = gate_up.astype(ml_dtypes.bfloat16), down.astype(ml_dtypes.bfloat16)
    return moe_swift.MoELayer(router, gate_up_proj=gate_up, down_proj=down, top_k=K, norm_topk_prob=True,
                              backend="cpu")


class Rotating:
    """An op over one of several weight matrices in turn (256 MB in all), so that each call
    finds its matrix out of cache, alone or after the layer alike: a model's projections
    are different weights at every layer, and the layer streams far more than a cache."""

    def __init__(self, op, matrices):
        self.op, self.matrices, self.at = op, matrices, 0

    def __call__(self):
        self.at = (self.at + 1) % len(self.matrices)
        return self.op(self.matrices[self.at])


def host_ops(tokens):
    """{name: op} of the host's own work at `tokens`."""
    rng = np.random.default_rng(1)
    # The host busy elsewhere for 10 ms (its own single-threaded work, I/O, a sampler):
    # our workers have gone to sleep, and the call wakes them.
    ops = {"idle 10 ms": lambda: time.sleep(0.01)}
    rows = 4096 if tokens == 1 else 2048  # 32 MB or 16 MB of float32 weights per op
    mats = [rng.standard_normal((rows, 2048), dtype=np.float32) for _ in range((256 << 20) // (rows * 2048 * 4))]
    if tokens == 1:
        v = rng.standard_normal(2048, dtype=np.float32)
        ops["numpy matvec 32 MB"] = Rotating(lambda a: a @ v, mats)
    else:
        a = rng.standard_normal((tokens, 2048), dtype=np.float32)
        ops[f"numpy ({tokens}x2048)@(2048x2048)"] = Rotating(lambda b: a @ b, mats)
    try:
        import torch
    except ImportError:
        pass
    else:
        tmats = [torch.from_numpy(m) for m in mats]
        if tokens == 1:
            tv = torch.from_numpy(v)
            ops["torch matvec 32 MB"] = Rotating(lambda a: a @ tv, tmats)
        else:
            ta = torch.from_numpy(a)
            ops[f"torch ({tokens}x2048)@(2048x2048)"] = Rotating(lambda b: ta @ b, tmats)
    try:
        import mlx.core as mx
    except ImportError:
        return ops
    # MLX (its CPU backend here, the stream's own thread and its BLAS): evaluated, as a
    # model's step is before its tokens are read.
    mmats = [mx.array(m) for m in mats]
    mx.eval(*mmats)
    if tokens == 1:
        mv = mx.array(v)
        ops["mlx matvec 32 MB"] = Rotating(lambda a: mx.eval(a @ mv), mmats)
    else:
        ma = mx.array(a)
        ops[f"mlx ({tokens}x2048)@(2048x2048)"] = Rotating(lambda b: mx.eval(ma @ b), mmats)
    return ops


def measure(layer, x, host, rounds, blocks=5, idle=0.3):
    """Medians (seconds) of the layer alone, the host op alone, the layer right after the
    host op and the host op right after the layer. "Alone" is a run of the same op after
    `idle` seconds of nothing, so that no pool is still spinning from the other's work
    (OpenBLAS's workers spin for about 0.1 s after each op); the alternating run follows.
    The three runs repeat `blocks` times, so that drift hits every column alike."""
    call = lambda: layer(x)  # noqa: E731
    times = {"layer alone": [], "host alone": [], "layer after host": [], "host after layer": []}

    def timed(f):
        t = time.perf_counter()
        f()
        return time.perf_counter() - t

    for _ in range(3):
        call(), host()
    per_block = max(3, rounds // blocks)
    for _ in range(blocks):
        time.sleep(idle)
        times["layer alone"] += [timed(call) for _ in range(per_block)]
        time.sleep(idle)
        times["host alone"] += [timed(host) for _ in range(per_block)]
        for _ in range(per_block):
            times["layer after host"].append(timed(call))
            times["host after layer"].append(timed(host))
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--tokens", default="1,256")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", default=str(Path(__file__).resolve().parent / "results" / "coexistence.json"))
    args = parser.parse_args(argv)

    rows = []
    header = ("| dtype | T | host op | layer alone ms | after host | host alone ms | after layer |\n"
              "|---|---|---|---|---|---|---|")
    print(f"moe_swift coexistence, Qwen3-30B-A3B layer with {E} experts, cpu backend "
          f"({moe_swift.cpu_instruction_set()}), {os.cpu_count()} cores; "
          + ", ".join(f"{k}={os.environ[k]}" for k in KNOBS if k in os.environ))
    print(header)
    for dtype in args.dtypes.split(","):
        layer = make_layer(dtype)
        for tokens in map(int, args.tokens.split(",")):
            x = np.random.default_rng(2).standard_normal((tokens, H), dtype=np.float32)
            rounds = args.rounds if tokens == 1 else max(20, args.rounds // 10)
            for name, host in host_ops(tokens).items():
                m = measure(layer, x, host, rounds)
                row = dict(dtype=dtype, tokens=tokens, host=name, rounds=rounds, **{k: v for k, v in m.items()})
                rows.append(row)
                print(f"| {dtype} | {tokens} | {name} | {m['layer alone'] * 1e3:.3f} | "
                      f"{m['layer after host'] / m['layer alone']:.2f}x | {m['host alone'] * 1e3:.3f} | "
                      f"{m['host after layer'] / m['host alone']:.2f}x |", flush=True)
        layer.close()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(dict(
        when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine=platform.processor() or platform.machine(),
        cores=os.cpu_count(), isa=moe_swift.cpu_instruction_set(), knobs={k: os.environ.get(k) for k in KNOBS},
        numpy=np.__version__, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
