#!/usr/bin/env python3
"""The fused decoder block (issue 13) vs the same work with the norms in NumPy, on the CPU.

For a Qwen3-30B-A3B-shaped layer (E=128, H=2048, I=768, k=8; random weights), per T:
  fused:    h, normed = layer(x, input_norm=(w1, eps), residual="input", next_norm=(w2, eps))
  unfused:  xn = rmsnorm(x) * w1; h = layer(xn, residual=x); normed = rmsnorm(h) * w2  (NumPy float32)
  plain:    layer(x, residual=x) - the layer alone, for the cost of the norms themselves
The variants alternate in blocks (a pause, a warm-up call, then back-to-back calls on fresh
inputs), several rounds; medians per call. A benchmark, not a test: the machine is shared.

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
    ap.add_argument("--rounds", type=int, default=5)
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

    def plain(x):
        return layer(x, residual=x)

    variants = {"fused": fused, "unfused": unfused, "plain": plain}
    print(f"load average at start: {open('/proc/loadavg').read().split()[:3]}")
    print(f"{'T':>5} {'fused ms':>10} {'unfused ms':>11} {'plain ms':>9} {'saving ms':>10} {'saving %':>9}"
          f" {'norms in NumPy ms':>18} {'norms fused ms':>15}")
    for T in (int(t) for t in args.tokens.split(",")):
        calls = 30 if T <= 8 else 4
        inputs = [rng.standard_normal((T, H), dtype=np.float32) for _ in range(calls + 1)]
        # The check: both ways compute the same block.
        a, b = fused(inputs[0]), unfused(inputs[0])
        for u, v in zip(a, b):
            assert np.abs(u - v).max() <= 1e-3 * np.abs(v).max() + 1e-5, np.abs(u - v).max()
        times = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, f in variants.items():
                time.sleep(args.settle)
                f(inputs[0])
                for x in inputs[1:]:
                    s = time.perf_counter()
                    f(x)
                    times[name].append(time.perf_counter() - s)
        med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
        saving = med["unfused"] - med["fused"]
        print(f"{T:>5} {med['fused']:>10.3f} {med['unfused']:>11.3f} {med['plain']:>9.3f} {saving:>10.3f}"
              f" {100 * saving / med['unfused']:>8.1f}% {med['unfused'] - med['plain']:>18.3f}"
              f" {med['fused'] - med['plain']:>15.3f}")
    print(f"load average at end: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
