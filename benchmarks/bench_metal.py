#!/usr/bin/env python3
"""The Metal backend's first measurements: latency per forward (decode and prefill), what
each call did on the device (moe_swift.last_stats: dispatches, command buffers, waits,
allocations), and run_layers of a stack vs one forward per layer - against "cpu".

    python benchmarks/bench_metal.py                   # "metal" if available, else "softmetal"
    python benchmarks/bench_metal.py --backend metal --hidden 2048 --inter 768 --experts 128 --top-k 8 \
        --tokens 1,4,64,512 --layers 8

On Linux "softmetal" is a CPU emulation of the GPU (far slower than "cpu"): its times say
nothing about a GPU, the device counters do. The defaults are small so that it finishes
there; use the Qwen3-30B-A3B shape above on a Mac.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import moe_swift


def best_of(fn, repeats):
    fn()  # warm-up: the first forward of a shape allocates its buffers
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    available = moe_swift.available_backends()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="metal" if "metal" in available else "softmetal")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=128)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--shared", type=int, default=0, help="shared expert width (0: none)")
    ap.add_argument("--tokens", default="1,4,64")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()

    rng = np.random.default_rng(0)
    H, I, E, k = a.hidden, a.inter, a.experts, a.top_k

    def layer_args(seed):
        r = np.random.default_rng(seed)
        w = lambda *s: (r.standard_normal(s) * s[-1] ** -0.5).astype(np.float32)
        args = dict(router_weight=w(E, H), gate_proj=w(E, I, H), up_proj=w(E, I, H), down_proj=w(E, H, I), top_k=k)
        if a.shared:
            args["shared_expert"] = dict(gate_proj=w(a.shared, H), up_proj=w(a.shared, H), down_proj=w(H, a.shared))
        return args

    stack = [layer_args(n) for n in range(a.layers)]
    print(f"backend {a.backend} (available: {available}); H={H} I={I} E={E} k={k} shared={a.shared}")
    layers = {name: [moe_swift.MoELayer(**s, backend=name) for s in stack] for name in (a.backend, "cpu")}
    for T in [int(t) for t in a.tokens.split(",")]:
        x = rng.standard_normal((T, H)).astype(np.float32)
        for name, ls in layers.items():
            one = best_of(lambda: ls[0](x), a.repeats)
            stats = moe_swift.last_stats()
            loop = best_of(lambda: [l(x, residual=x) for l in ls], a.repeats)
            stacked = best_of(lambda: moe_swift.run_layers(ls, x), a.repeats)
            s2 = moe_swift.last_stats()
            print(f"T={T:5d} {name:9s} forward {one * 1e3:9.3f} ms  [dispatches {stats['dispatches']}, "
                  f"command buffers {stats['command_buffers']}, waits {stats['cpu_waits']}, "
                  f"allocations {stats['allocations']}]   {a.layers} layers: separate {loop * 1e3:9.3f} ms, "
                  f"run_layers {stacked * 1e3:9.3f} ms [dispatches {s2['dispatches']}, "
                  f"command buffers {s2['command_buffers']}, waits {s2['cpu_waits']}]")
    for ls in layers.values():
        for l in ls:
            l.close()


if __name__ == "__main__":
    main()
