#!/usr/bin/env python3
"""Decode-layer time of ggml's block formats on the cpu backend against our MLX q4 / q8 at
the same shape: a quick check of the CPU kernels (formats/ggml.c, ggml_avx2.c), not the
suite (`python benchmarks/run.py`, whose ggml peer is ggml itself).

    python benchmarks/ggml_cpu_decode.py --experts 32 --rounds 9

Qwen3-30B-A3B's expert shape (H 2048, I 768, k 8) with --experts experts; random blocks
(moe_swift.ggml_blocks.random_blocks) and MLX quantizations of random weights. Rounds
interleave the formats; the median of the rounds is printed, with GB/s = bytes of the
experts a call reads (the distinct routed experts' blocks) / time.
"""

import argparse
import time

import numpy as np

import moe_swift
from moe_swift import GGMLQuantized, formats
from moe_swift.ggml_blocks import random_blocks

FORMATS = "q4_0,q4_K,q5_K,q6_K,q8_0,mxfp4_ggml,iq4_nl,mlx_q4,mlx_q8"


def make(fmt, shape, rng):
    if fmt.startswith("mlx_q"):
        w = (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)
        return formats.quantize(w, bits=int(fmt[5:]), group_size=64)
    return GGMLQuantized(random_blocks(rng, fmt, shape, 3 * shape[-1] ** -0.5), type=fmt)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=16, help="calls timed per round")
    ap.add_argument("--formats", default=FORMATS)
    ap.add_argument("--tokens", default="1,8")
    a = ap.parse_args()
    E, H, I, K = a.experts, 2048, 768, 8
    fmts, token_counts = a.formats.split(","), [int(t) for t in a.tokens.split(",")]
    rng = np.random.default_rng(0)
    router = (rng.standard_normal((E, H)) * H ** -0.5).astype(np.float32)
    layers, expert_bytes = {}, {}
    for f in fmts:
        ws = [make(f, (E, I, H), rng), make(f, (E, I, H), rng), make(f, (E, H, I), rng)]
        expert_bytes[f] = sum(w.nbytes for w in ws) / E
        layers[f] = moe_swift.MoELayer(router, *ws, top_k=K, backend="cpu")
    xs = {T: [rng.standard_normal((T, H)).astype(np.float32) for _ in range(a.calls)] for T in token_counts}
    times = {(f, T): [] for f in fmts for T in token_counts}
    for _ in range(a.rounds):
        for f in fmts:
            for T in token_counts:
                layers[f](xs[T][0])
                t0 = time.perf_counter()
                for x in xs[T]:
                    layers[f](x)
                times[(f, T)].append((time.perf_counter() - t0) / a.calls)
    print(f"E={E} H={H} I={I} k={K}, {a.rounds} rounds, isa={moe_swift.cpu_instruction_set()}")
    print(f"{'format':12} {'MB/expert':>9}" + "".join(f" {'T=' + str(T) + ' ms':>9} {'GB/s':>6}" for T in token_counts))
    for f in fmts:
        row = f"{f:12} {expert_bytes[f] / 1e6:9.2f}"
        for T in token_counts:
            t = float(np.median(times[(f, T)]))
            read = np.mean([len(np.unique(layers[f].route(x)[0])) for x in xs[T]]) * expert_bytes[f]
            row += f" {t * 1e3:9.3f} {read / t / 1e9:6.2f}"
        print(row)


if __name__ == "__main__":
    main()
