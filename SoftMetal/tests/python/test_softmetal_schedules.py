"""How SoftMetal runs a threadgroup's threads: the run-ahead schedule (each simdgroup to its
next barrier, forward and reverse) against round robin, the comparison of the two orders
that shows a missing barrier, and the watchdog that stops a kernel which never finishes
(a spin wait) instead of hanging."""

import sys

import numpy as np
import pytest

import softmetal

pytestmark = pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++")


TICKETS = """
#include <metal_stdlib>
using namespace metal;
// Each thread takes a ticket before a simd operation, one after it, and one after a
// threadgroup barrier: the tickets show the order in which the schedule ran the threads.
kernel void tickets(device uint* t [[buffer(0)]], uint tid [[thread_index_in_threadgroup]],
                    uint n [[threads_per_threadgroup]]) {
    threadgroup atomic_uint counter;
    if (tid == 0) atomic_store_explicit(&counter, 0, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    t[tid] = atomic_fetch_add_explicit(&counter, 1, memory_order_relaxed);
    uint one = simd_sum(1u) / 32;
    t[n + tid] = atomic_fetch_add_explicit(&counter, one, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    t[2 * n + tid] = atomic_fetch_add_explicit(&counter, 1, memory_order_relaxed);
}
"""


@pytest.mark.parametrize("schedule,order", [("run-ahead-forward", [0, 1, 2]), ("run-ahead-reverse", [2, 1, 0])])
def test_run_ahead_runs_each_simdgroup_to_the_barrier_before_the_next(schedule, order):
    lib = softmetal.compile(TICKETS)
    t = np.zeros((3, 3, 32), np.uint32)  # [ticket, simdgroup, lane]
    lib.launch("tickets", [t], threadgroups=(1,), threads_per_threadgroup=(96,), schedule=schedule)
    for rank, sg in enumerate(order):
        # Both tickets before the barrier, through the simd_sum, before any other simdgroup's;
        # after the barrier the same order again.
        assert sorted(t[:2, sg].ravel()) == list(range(64 * rank, 64 * rank + 64))
        assert sorted(t[2, sg]) == list(range(192 + 32 * rank, 192 + 32 * rank + 32))
    round_robin = np.zeros_like(t)
    lib.launch("tickets", [round_robin], threadgroups=(1,), threads_per_threadgroup=(96,))
    assert round_robin[1, 0].max() > round_robin[0, 1].min()  # simdgroups interleave at the simd_sum


def test_run_ahead_compares_forward_and_reverse_order(bugs):
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    with pytest.raises(softmetal.RaceError, match="forward order and one in reverse order"):
        bugs.launch("missing_barrier", [x, y], threadgroups=(1,), threads_per_threadgroup=(64,),
                    threadgroup_memory={0: 256}, schedule="run-ahead")
    bugs.launch("with_barrier", [x, y], threadgroups=(1,), threads_per_threadgroup=(64,),
                threadgroup_memory={0: 256}, schedule="run-ahead")
    np.testing.assert_array_equal(y, np.roll(x, -1))
    with pytest.raises(softmetal.InvalidUsageError, match="schedule must be one of"):
        bugs.launch("with_barrier", [x, y], threadgroups=(1,), threads_per_threadgroup=(64,),
                    threadgroup_memory={0: 256}, schedule="sometimes")


SPIN = r'''
import time, numpy as np, moe_swift.softmetal as sm
lib = sm.compile("""
using namespace metal;
kernel void spin(device atomic_uint* flag [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
    if (tid == 0) { while (atomic_load_explicit(flag, memory_order_relaxed) == 0) {} }
    if (tid == 1) atomic_store_explicit(flag, 1u, memory_order_relaxed);
}
""")
t = time.perf_counter()
try:
    lib.launch("spin", [np.zeros(1, np.uint32)], threadgroups=(GROUPS,), threads_per_threadgroup=(THREADS,))
except sm.SoftMetalError as e:
    print(type(e).__name__, e)
print(round(time.perf_counter() - t, 2))
'''


def spin_with_a_one_second_watchdog(groups, threads):
    """(output lines, seconds) of the spin kernel in its own process (the timeout is read
    once per process)."""
    import subprocess

    code = SPIN.replace("GROUPS", str(groups)).replace("THREADS", str(threads))
    env = dict(__import__("os").environ, SOFTMETAL_TIMEOUT_S="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = out.stdout.strip().split("\n")
    assert len(lines) == 2, out.stdout + out.stderr
    return lines[0], float(lines[1])


def test_a_spin_wait_is_stopped_by_the_watchdog_instead_of_hanging():
    # Thread 0 waits for thread 1's flag without a barrier: on SoftMetal a thread runs
    # until it blocks, so the wait never ends; the watchdog stops it.
    message, _ = spin_with_a_one_second_watchdog(1, 2)
    assert "did not finish within 1" in message and "spin" in message, message


def test_the_watchdog_stops_a_whole_dispatch_at_its_timeout():
    # 64 spinning threadgroups in 4 x cores chunks: each chunk used to get its own timeout
    # (4x the timeout on two cores); the dispatch has one deadline.
    message, seconds = spin_with_a_one_second_watchdog(64, 1)
    assert message.startswith("RuntimeFailure") and seconds < 2.0, (message, seconds)
