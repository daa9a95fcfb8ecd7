#!/usr/bin/env python3
"""The fused decoder block (issue 13) vs the same work with the norms in NumPy, on the CPU.

For a Qwen3-30B-A3B-shaped layer (E=128, H=2048, I=768, k=8; random weights), per T:
  fused:    h, normed = layer(x, input_norm=(w1, eps), residual="input", next_norm=(w2, eps))
  unfused:  xn = rmsnorm(x) * w1; h = layer(xn, residual=x); normed = rmsnorm(h) * w2  (NumPy float32)
  plain:    layer(xn, residual=x) with xn normalised beforehand (untimed) - the layer alone
            on the same rows, so all three read the same experts: the cost of the norms
The variants alternate call by call on the same input (the order rotating, so that none
always comes first after a pause), so each triple reads the same experts under the same
load; the table gives medians per call and the median of the paired differences. A
benchmark, not a test: the machine is shared, compare within one run.

    PYTHONPATH=python python3 benchmarks/bench_fused_norms.py [--format f32|q4] [--tokens 1,512] [--rounds 5]
"""

import argparse
import statistics
import time

import numpy as np

import moe_swift
from moe_swift import formats

E, H, I, K = 128, 2048, 768, 8
EPS = 1e-6


def rmsnorm(x, w, eps):
    """The usual float32 RMSNorm of a decoder (Qwen3RMSNorm in float32)."""
    return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * w


def make_layer(fmt, rng):
    def w(*shape):
        a = (rng.standard_normal(shape, dtype=np.float32) * 0.02)
        return formats.quantize(a, bits=4) if fmt == "q4" else a
    return moe_swift.MoELayer(w(E, H) if fmt == "f32" else rng.standard_normal((E, H), dtype=np.float32) * 0.02,
                              w(E, I, H), w(E, I, H), w(E, H, I), top_k=K, backend="cpu")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--format", default="f32", choices=["f32", "q4"])
    ap.add_argument("--tokens", default="1,512")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--settle", type=float, default=0.3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    layer = make_layer(args.format, rng)
    print(f"Qwen3-30B-A3B-shaped layer, {args.format}, cpu backend; built in {time.perf_counter() - t0:.1f} s")
    w1 = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    w2 = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)

    def fused(x):
        return layer(x, input_norm=(w1, EPS), residual="input", next_norm=(w2, EPS))

    def unfused(x):
        h = layer(rmsnorm(x, w1, EPS), residual=x)
        return h, rmsnorm(h, w2, EPS)

    normalised = {}

    def plain(x):
        return layer(normalised[id(x)], residual=x)

    variants = {"fused": fused, "unfused": unfused, "plain": plain}
    print(f"load average at start: {open('/proc/loadavg').read().split()[:3]}")
    print(f"{'T':>5} {'fused ms':>10} {'unfused ms':>11} {'plain ms':>9} {'saving ms (paired)':>19}"
          f" {'saving %':>9} {'fused - plain ms':>17} {'NumPy norms alone ms':>21}")
    names = list(variants)
    for T in (int(t) for t in args.tokens.split(",")):
        calls = 40 if T <= 8 else 3
        inputs = [rng.standard_normal((T, H), dtype=np.float32) for _ in range(calls)]
        normalised.clear()
        normalised.update({id(x): rmsnorm(x, w1, EPS) for x in inputs})
        # The check: both ways compute the same block.
        a, b = fused(inputs[0]), unfused(inputs[0])
        for u, v in zip(a, b):
            assert np.abs(u - v).max() <= 1e-3 * np.abs(v).max() + 1e-5, np.abs(u - v).max()
        times = {name: [] for name in names}
        for _ in range(args.rounds):
            time.sleep(args.settle)
            plain(inputs[-1])  # warm-up
            for i, x in enumerate(inputs):
                for name in names[i % 3:] + names[:i % 3]:
                    s = time.perf_counter()
                    variants[name](x)
                    times[name].append(time.perf_counter() - s)
        med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
        paired = statistics.median(u - f for u, f in zip(times["unfused"], times["fused"])) * 1e3
        over_plain = statistics.median(f - p for f, p in zip(times["fused"], times["plain"])) * 1e3
        x = inputs[0]
        norm_times = []
        for _ in range(20):
            s = time.perf_counter()
            rmsnorm(rmsnorm(x, w1, EPS), w2, EPS)
            norm_times.append(time.perf_counter() - s)
        print(f"{T:>5} {med['fused']:>10.3f} {med['unfused']:>11.3f} {med['plain']:>9.3f} {paired:>19.3f}"
              f" {100 * paired / med['unfused']:>8.1f}% {over_plain:>17.3f} {statistics.median(norm_times) * 1e3:>21.3f}")
    print(f"load average at end: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
