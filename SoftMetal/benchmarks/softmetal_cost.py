"""What SoftMetal emulation costs: one fiber switch, one blocking collective per GPU
thread, a 64x512x512 simdgroup-matrix GEMM, and the price of each check.

    python SoftMetal/benchmarks/softmetal_cost.py  # prints a table, writes SoftMetal/benchmarks/results/softmetal_cost.json

Numbers are for this machine at the time of the run (2 cores here); SoftMetal's README
quotes one run.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from moe_swift import softmetal

SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// 8x8 tiles of C = A * B: one simdgroup per tile, 4 simdgroups per threadgroup.
kernel void sg_gemm(device const float* A [[buffer(0)]], device const float* B [[buffer(1)]],
                    device float* C [[buffer(2)]], constant uint3& dims [[buffer(3)]],
                    uint2 group [[threadgroup_position_in_grid]],
                    uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]]) {
    const uint N = dims.y, K = dims.z;
    uint row = group.y * 8, col = (group.x * nsg + sg) * 8;
    simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (uint k = 0; k < K; k += 8) {
        simdgroup_float8x8 a, b;
        simdgroup_load(a, A + row * K + k, K);
        simdgroup_load(b, B + k * N + col, N);
        simdgroup_multiply_accumulate(acc, a, b, acc);
    }
    simdgroup_store(acc, C + row * N + col, N);
}

// Each thread passes `n` simdgroup barriers: the cost of a blocking collective.
kernel void barriers(device float* y [[buffer(0)]], constant uint& n [[buffer(1)]],
                     uint tid [[thread_index_in_threadgroup]]) {
    float v = float(tid);
    for (uint i = 0; i < n; i++) { simdgroup_barrier(mem_flags::mem_none); v += 1.0f; }
    y[tid] = v;
}

// Threadgroup memory heavy: 32 KiB per threadgroup, each thread touches a little.
kernel void tg_heavy(device float* y [[buffer(0)]], threadgroup float* sh [[threadgroup(0)]],
                     uint tid [[thread_index_in_threadgroup]], uint group [[threadgroup_position_in_grid]]) {
    sh[tid] = float(tid);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[group * 64 + tid] = sh[63 - tid];
}

kernel void empty(device float* y [[buffer(0)]]) {}
"""


def best(f, repeat=5):
    times = []
    for _ in range(repeat):
        times.append(f())
    return min(times)


def main() -> dict:
    results: dict = {}
    # Compile cost: cold (empty cache directory) and cached.
    old = os.environ.get("SOFTMETAL_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cold_dir:
        os.environ["SOFTMETAL_CACHE_DIR"] = cold_dir
        t = time.perf_counter()
        lib = softmetal.compile(SOURCE + f"\nconstant int unique_{time.time_ns()} = 0;\n")
        results["compile_cold_s"] = time.perf_counter() - t
    if old is None:
        os.environ.pop("SOFTMETAL_CACHE_DIR", None)
    else:
        os.environ["SOFTMETAL_CACHE_DIR"] = old
    softmetal.compile(SOURCE)
    t = time.perf_counter()
    lib = softmetal.compile(SOURCE)
    results["compile_cached_s"] = time.perf_counter() - t

    results["fiber_switch_ns"] = min(lib.fiber_switch_ns(2_000_000) for _ in range(5))

    n, threads = 2000, 1024
    y = np.zeros(threads, np.float32)
    secs = best(lambda: lib.launch("barriers", [y, struct.pack("I", n)], threadgroups=(1,), threads_per_threadgroup=(threads,)))
    results["collective_per_thread_ns"] = secs / (n * threads) * 1e9

    M, N, K = 64, 512, 512
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    c = np.zeros((M, N), np.float32)
    dims = np.array([M, N, K, 0], np.uint32)
    args = dict(threadgroups=(N // 32, M // 8), threads_per_threadgroup=(128,))
    results["gemm_64x512x512_s"] = best(lambda: lib.launch("sg_gemm", [a, b, c, dims], **args))
    results["gemm_max_abs_error"] = float(np.abs(c - a @ b).max())
    results["gemm_gflops"] = 2 * M * N * K / results["gemm_64x512x512_s"] / 1e9
    results["gemm_order_checked_s"] = best(lambda: lib.launch("sg_gemm", [a, b, c, dims], check_order=True, **args), 3)
    results["gemm_run_ahead_reverse_s"] = best(lambda: lib.launch("sg_gemm", [a, b, c, dims], schedule="run-ahead-reverse", **args))
    results["gemm_run_ahead_s"] = best(lambda: lib.launch("sg_gemm", [a, b, c, dims], schedule="run-ahead", **args), 3)
    lib.launch("sg_gemm", [a, b, c, dims], check_memory=True, **args)  # compiles the checked build
    results["gemm_memory_checked_s"] = best(lambda: lib.launch("sg_gemm", [a, b, c, dims], check_memory=True, **args), 3)

    groups = 512
    y = np.zeros(groups * 64, np.float32)
    tg = dict(threadgroups=(groups,), threads_per_threadgroup=(64,), threadgroup_memory={0: 32768})
    results["tg_heavy_poison_s"] = best(lambda: lib.launch("tg_heavy", [y], **tg))
    results["tg_heavy_no_poison_s"] = best(lambda: lib.launch("tg_heavy", [y], poison_threadgroup_memory=False, **tg))
    results["tg_heavy_order_checked_s"] = best(lambda: lib.launch("tg_heavy", [y], check_order=True, **tg))
    results["tg_heavy_run_ahead_s"] = best(lambda: lib.launch("tg_heavy", [y], schedule="run-ahead", **tg))
    results["tg_heavy_memory_checked_s"] = best(lambda: lib.launch("tg_heavy", [y], check_memory=True, **tg), 3)

    # Guard pages cost nothing while kernels run (the MMU checks); they cost a mapping per
    # buffer. An empty kernel with 1 and with 30 small buffers (each copied in and out):
    one = [np.zeros(16, np.float32)]
    many = [np.zeros(16, np.float32) for _ in range(30)]
    results["launch_1_buffer_us"] = best(lambda: timed(lambda: lib.launch("empty", one, threadgroups=(1,)))) * 1e6
    results["launch_30_buffers_us"] = best(lambda: timed(lambda: lib.launch("empty", many, threadgroups=(1,)))) * 1e6
    return results


def timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


if __name__ == "__main__":
    if not softmetal.available():
        sys.exit("SoftMetal needs Linux and clang++")
    r = main()
    width = max(len(k) for k in r)
    for k, v in r.items():
        print(f"{k:<{width}}  {v:.4g}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "softmetal_cost.json").write_text(json.dumps(r, indent=2) + "\n")
