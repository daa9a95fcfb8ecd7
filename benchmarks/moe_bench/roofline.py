"""The machine's roofline, measured in the same run on all cores: read bandwidth (a
STREAM-like read probe with NumPy and with the native library, and a large NumPy
matrix-vector product) and the peak of a large SGEMM.

The bandwidth roof is the best of the read measurements: the probe streams a 1 GiB
buffer with one thread per core, each reducing its contiguous part with a NumPy
reduction (bitwise or of uint64 words and a float32 sum; NumPy's SIMD loops, GIL
released), and with the native library's own probe (moe_measure_read_bandwidth: the CPU
backend's worker threads and its kernels' loads, 512- and 256-bit, on huge pages); OpenBLAS's GEMV
over a 1 GiB matrix is measured too and counts when it reads faster. No implementation
should read its weights faster than the best of these, so "% of roof" is a ceiling; a
peer above 100% is flagged (the roof is then wrong, or its bytes over-counted).

Decode points (T <= DECODE_MAX_T) are compared with the bandwidth: bytes of weights a
forward must read (the distinct experts chosen across the T tokens x gate, up and down
(+ biases), plus the router and shared expert) per second. Prefill points with the GEMM
peak: FLOPs of the router, the three expert matmuls over all (token, slot) pairs and
the shared expert, per second.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

DECODE_MAX_T = 8
SLOW_OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def env_warnings() -> list[str]:
    """Environment that distorts NumPy's OpenBLAS (and so the baseline and the roofline)."""
    out = []
    for var in SLOW_OPENBLAS_VARS:
        if os.environ.get(var):
            out.append(f"WARNING: {var}={os.environ[var]} is set: it makes a current NumPy's OpenBLAS pick "
                       "slower kernels / blocking, so the NumPy baseline and the roofline read low; unset it.")
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(var):
            out.append(f"note: {var}={os.environ[var]} is set (limits the BLAS threads of NumPy / torch).")
    return out


def blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info
        return "; ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture', '')} "
                         f"{i.get('num_threads')} threads" for i in threadpool_info()
                         if i.get("user_api") == "blas")
    except Exception:  # noqa: BLE001 - threadpoolctl is optional
        return ""


def _best(fn, runs, settle):
    times = []
    for _ in range(runs):
        time.sleep(settle)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def measure(*, gemv_bytes=1 << 30, gemm_n=4096, runs=10, settle=0.05, quick=False) -> dict:
    """Bandwidth (GB/s) of y = A @ v with a `gemv_bytes` float32 A, and GFLOP/s of a
    `gemm_n`^3 SGEMM, both NumPy on all cores: best and median of `runs` (a GEMV call is
    ~40 ms: on a loaded machine single calls lose milliseconds waiting for the second
    BLAS thread, hence best-of-many)."""
    if quick:
        gemm_n = min(gemm_n, 3072)
    n = int(round((gemv_bytes / 4) ** 0.5))
    A = np.empty((n, n), np.float32)
    A[...] = 1.0 / n  # touch every page; values do not matter for the speed
    v = np.ones(n, np.float32)
    A @ v  # warm-up (first-touch of BLAS buffers)
    t = _best(lambda: A @ v, runs, settle)
    gbs = [A.nbytes / s / 1e9 for s in t]
    stream = stream_read(A, runs=runs, settle=settle)
    del A, v
    rng = np.random.default_rng(0)
    B = rng.standard_normal((gemm_n, gemm_n), dtype=np.float32)
    C = rng.standard_normal((gemm_n, gemm_n), dtype=np.float32)
    B @ C
    t = _best(lambda: B @ C, 5, settle)
    gf = [2.0 * gemm_n ** 3 / s / 1e9 for s in t]
    return dict(gemv_matrix_bytes=n * n * 4, gemv_GBps_best=max(gbs), gemv_GBps_median=float(np.median(gbs)),
                stream_GBps_best=stream["best"], stream_GBps_median=stream["median"], stream_method=stream["method"],
                gemm_n=gemm_n, gemm_GFLOPs_best=max(gf), gemm_GFLOPs_median=float(np.median(gf)),
                gemv_GBps_all=gbs, gemm_GFLOPs_all=gf)


def stream_read(buf, *, runs=10, settle=0.05, threads=None) -> dict:
    """Read bandwidth (GB/s) of `buf` (any contiguous array of >= 64 MB) with one thread
    per core, each reducing its contiguous share: the best of a bitwise-or over uint64
    words and a float32 sum, best and median of `runs` each."""
    from .peers import cores
    threads = threads or cores()
    flat = buf.reshape(-1)
    parts = {"uint64 or-reduce": (np.bitwise_or.reduce, np.array_split(flat.view(np.uint64), threads)),
             "float32 sum": (np.add.reduce, np.array_split(flat.view(np.float32), threads))}
    best, out = None, {}
    with ThreadPoolExecutor(threads) as pool:
        for name, (fn, chunks) in parts.items():
            list(pool.map(fn, chunks))  # warm-up
            t = _best(lambda: list(pool.map(fn, chunks)), runs, settle)
            gbs = [flat.nbytes / s / 1e9 for s in t]
            out[name] = gbs
            if best is None or max(gbs) > max(out[best]):
                best = name
    native = native_read(flat.nbytes, runs)
    if native is not None:
        name = f"libMoESwift {native[1]} loads"
        out[name] = [native[0]]
        if native[0] > max(out[best]):
            best = name
    return dict(best=max(out[best]), median=float(np.median(out[best])),
                method=f"{best}, {threads} threads over {flat.nbytes / 2**30:.2f} GiB", all=out)


def native_read(nbytes: int, repeats: int):
    """(best GB/s, instruction set) of moe_measure_read_bandwidth: the CPU backend's own
    worker threads streaming `nbytes` with its kernels' loads; None if the library
    cannot be loaded (its ABI error is not a roofline)."""
    try:
        from moe_swift import _native
        ffi, lib, _ = _native.load()
        out = ffi.new("double *")
        _native.check(lib.moe_measure_read_bandwidth(nbytes, repeats, out))
        return float(out[0]), ffi.string(lib.moe_cpu_instruction_set()).decode()
    except Exception:  # noqa: BLE001
        return None


def native_read_time(arrays):
    """(seconds, bytes read) of moe_measure_read_time over the C-contiguous NumPy
    `arrays`: the CPU backend's threads reading them once, in 64 KiB pieces; None if
    the library cannot be loaded."""
    try:
        from moe_swift import _native
        ffi, lib, _ = _native.load()
    except Exception:  # noqa: BLE001
        return None
    for a in arrays:
        if not a.flags.c_contiguous:
            raise ValueError(f"native_read_time reads contiguous arrays, got strides {a.strides}")
    starts = ffi.new("void *[]", [ffi.cast("void *", a.ctypes.data) for a in arrays] or [ffi.NULL])
    sizes = ffi.new("int64_t[]", [a.nbytes for a in arrays] or [0])
    seconds, nbytes = ffi.new("double *"), ffi.new("int64_t *")
    _native.check(lib.moe_measure_read_time(starts, sizes, len(arrays), seconds, nbytes))
    return float(seconds[0]), int(nbytes[0])


def combine(first: dict, last: dict | None) -> dict:
    """The roofline used for the fractions: the best of the measurements at the start
    and at the end of the run (the machine is shared; the best is closest to its peak).
    GBps: the best of the read probe and GEMV; GEMV_GBps: GEMV's alone."""
    runs = [first] + ([last] if last else [])
    gemv = max(r["gemv_GBps_best"] for r in runs)
    stream = max(r.get("stream_GBps_best", 0.0) for r in runs)
    return dict(GBps=max(gemv, stream), GEMV_GBps=gemv, stream_GBps=stream,
                GFLOPs=max(r["gemm_GFLOPs_best"] for r in runs))


def bound(T: int) -> str:
    return "bandwidth" if T <= DECODE_MAX_T else "gemm"


def fraction(T: int, ms: float | None, bytes_read: float, flops: float, roof: dict) -> float | None:
    """Fraction of the roofline reached: bytes/s over bandwidth (T <= 8), FLOP/s over
    the GEMM peak (larger T)."""
    if ms is None or ms <= 0:
        return None
    s = ms * 1e-3
    if bound(T) == "bandwidth":
        return bytes_read / s / 1e9 / roof["GBps"]
    return flops / s / 1e9 / roof["GFLOPs"]


def roofline_tokens_per_s(T: int, bytes_read: float, flops: float, roof: dict) -> float:
    """Best throughput the machine allows for T tokens: neither faster than reading the
    weights at the bandwidth nor than the FLOPs at the GEMM peak."""
    t = max(bytes_read / (roof["GBps"] * 1e9), flops / (roof["GFLOPs"] * 1e9))
    return T / t
