"""What two of SoftMetal's Apple-like behaviours cost: the argument-activity analysis (one extra
clang++ run when a dispatch leaves a named argument unbound, then cached), on MLX's gemv launched
without its bias as MLX launches it; and an integer division by zero, which traps on x86 and is
given a value by the signal handler.

    python SoftMetal/benchmarks/false_alarm_costs.py   # with SOFTMETAL_CACHE_DIR empty for the cold numbers

Numbers are for this machine at the time of the run.
"""

import time
from pathlib import Path

import numpy as np
import softmetal as sm

MLX = Path(__file__).resolve().parents[1] / "tests" / "third_party" / "mlx"
src = (MLX / "mlx/backend/metal/kernels/gemv.metal").read_text()
def one(v, t): return np.array([v], t).tobytes()
m, k = 100, 300
mat = np.random.standard_normal((m, k)).astype(np.float32); vec = np.random.standard_normal(k).astype(np.float32)
name = "gemv_float32_bm4_bn1_sm1_sn32_tm4_tn4_nc0_axpby0"
base = {0: mat, 1: vec, 4: one(k, np.int32), 5: one(m, np.int32), 6: one(k, np.int32), 9: one(1, np.int32),
        10: np.array([1], np.int32), 11: np.array([0], np.int64), 12: np.array([0], np.int64)}
lib = sm.compile(src, include_dirs=[str(MLX)])
def run(unbound):
    b = dict(base); b[3] = np.zeros(m, np.float32)
    if not unbound:
        b.update({2: np.zeros(m, np.float32), 7: one(1, np.float32), 8: one(0, np.float32), 13: np.array([0], np.int64), 14: one(1, np.int32)})
    t = time.perf_counter(); lib.launch(name, b, threadgroups=(-(-m // 16), 1, 1), threads_per_threadgroup=(32, 1, 4)); return time.perf_counter() - t
print(f"gemv launch, all bound (first in the process): {run(False)*1e3:.1f} ms")
print(f"gemv launch, bias/alpha/beta unbound, first (activity analysis, or its disk cache): {run(True)*1e3:.0f} ms")
print(f"gemv launch, bias/alpha/beta unbound, again: {run(True)*1e3:.1f} ms")
div = sm.compile("""kernel void d(device const int* a [[buffer(0)]], device const int* b [[buffer(1)]], device int* q [[buffer(2)]], uint i [[thread_position_in_grid]]) { q[i] = a[i] / b[i] + a[i] % b[i]; }""")
n = 1 << 16
a = np.arange(n, dtype=np.int32); q = np.zeros(n, np.int32)
for label, b in (("nonzero divisors", np.ones(n, np.int32)), ("zero divisors (2 traps per thread)", np.zeros(n, np.int32))):
    div.launch("d", [a, b, q], grid=(n,), threads_per_threadgroup=(256,))
    t = time.perf_counter(); div.launch("d", [a, b, q], grid=(n,), threads_per_threadgroup=(256,)); dt = time.perf_counter() - t
    print(f"{n} threads dividing, {label}: {dt*1e3:.1f} ms")
