"""Planted bugs that each of SoftMetal's checks must catch (softmetal_testlib.BUGS): out of
bounds (buffers, threadgroup memory, a wild index), unwritten threadgroup memory, barrier
and simd divergence, races within and across threadgroups, order-dependent atomics, usage
errors, the guard pages after another fault handler is installed, integer division by zero
(a value, as on a GPU, unless a check is on)."""

import numpy as np
import pytest

import softmetal
from softmetal_testlib import BUGS

pytestmark = pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++")


def test_out_of_bounds_read_names_kernel_buffer_and_offset(bugs):
    x = np.ones(100, np.float32)
    y = np.zeros(128, np.float32)
    with pytest.raises(softmetal.OutOfBoundsError) as e:
        bugs.launch("read_past_end", [x, y], threadgroups=(4,), threads_per_threadgroup=(32,))
    message = str(e.value)
    assert "out-of-bounds" in message and "read_past_end" in message
    assert "buffer(0) at byte offset 400" in message


def test_out_of_bounds_write_is_caught(bugs):
    x = np.ones(64, np.float32)
    y = np.zeros(64, np.float32)
    with pytest.raises(softmetal.OutOfBoundsError, match=r"write_past_end: out-of-bounds access to buffer\(1\) at byte offset 256"):
        bugs.launch("write_past_end", [x, y], threadgroups=(2,), threads_per_threadgroup=(32,))


def test_out_of_bounds_threadgroup_memory_is_caught(bugs):
    y = np.zeros(64, np.float32)
    with pytest.raises(softmetal.OutOfBoundsError, match=r"threadgroup\(0\)"):
        bugs.launch("threadgroup_overflow", [y], threadgroups=(1,), threads_per_threadgroup=(64,),
                    threadgroup_memory={0: 256})


def test_unwritten_threadgroup_memory_reads_as_nan(bugs):
    y = np.zeros(2, np.float32)
    bugs.launch("reads_unwritten", [y], threadgroups=(1,), threads_per_threadgroup=(64,), threadgroup_memory={0: 256})
    assert np.isnan(y).all(), y
    # Without poisoning (memory zeroed) the bug is invisible here.
    bugs.launch("reads_unwritten", [y], threadgroups=(1,), threads_per_threadgroup=(64,), threadgroup_memory={0: 256},
                poison_threadgroup_memory=False)
    assert np.isfinite(y).all(), y


def test_wild_access_from_a_poisoned_index_is_reported_not_a_crash(bugs):
    y = np.zeros(64, np.float32)
    with pytest.raises(softmetal.OutOfBoundsError) as e:
        bugs.launch("poisoned_index", [y], threadgroups=(1,), threads_per_threadgroup=(64,))
    message = str(e.value)
    # 16 GiB past the buffer: inside its guard space, so the buffer is named exactly. (Once
    # the guard space's budget is spent, a fault out there is reported as "invalid memory
    # access ..., far from every buffer; nearest: buffer(0) at byte offset ...".)
    if "invalid memory access" in message:
        assert "poisoned_index: invalid memory access" in message
        assert f"nearest: buffer(0) at byte offset {0xFFFFFFFF * 4}" in message, message
    else:
        assert f"poisoned_index: out-of-bounds access to buffer(0) at byte offset {0xFFFFFFFF * 4}" in message, message


def test_barrier_reached_by_some_threads_is_divergence(bugs):
    y = np.zeros(64, np.float32)
    with pytest.raises(softmetal.BarrierDivergenceError) as e:
        bugs.launch("barrier_in_branch", [y], threadgroups=(1,), threads_per_threadgroup=(64,))
    message = str(e.value)
    assert "barrier divergence" in message and "barrier_in_branch" in message
    assert "threads 0-15" in message and "threads 16-63" in message


def test_different_barriers_are_divergence_with_lines(bugs):
    y = np.zeros(64, np.float32)
    with pytest.raises(softmetal.BarrierDivergenceError) as e:
        bugs.launch("different_barriers", [y], threadgroups=(1,), threads_per_threadgroup=(64,))
    message = str(e.value)
    lines = [i + 1 for i, line in enumerate(BUGS.splitlines()) if "threadgroup_barrier(mem_flags::mem_device)" in line]
    assert all(f"line {n}" in message for n in lines), message


def test_simd_operations_at_different_places_are_divergence(bugs):
    y = np.arange(32, dtype=np.float32)
    with pytest.raises(softmetal.BarrierDivergenceError, match="simd divergence.*simd_sum.*simd_max"):
        bugs.launch("simd_in_branch", [y], threadgroups=(1,), threads_per_threadgroup=(32,))
    with pytest.raises(softmetal.BarrierDivergenceError, match="simd_sum.*threadgroup_barrier"):
        bugs.launch("simd_vs_barrier", [y], threadgroups=(1,), threads_per_threadgroup=(32,))


def test_missing_barrier_is_a_race(bugs):
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    with pytest.raises(softmetal.RaceError, match="missing_barrier: data race on threadgroup"):
        bugs.launch("missing_barrier", [x, y], threadgroups=(1,), threads_per_threadgroup=(64,),
                    threadgroup_memory={0: 256}, check_races=True)
    # The permuted rerun sees it by its output, without naming the lines.
    with pytest.raises(softmetal.RaceError, match="depends on execution order.*buffer\\(1\\)"):
        bugs.launch("missing_barrier", [x, y], threadgroups=(1,), threads_per_threadgroup=(64,),
                    threadgroup_memory={0: 256}, check_order=True)
    bugs.launch("with_barrier", [x, y], threadgroups=(1,), threads_per_threadgroup=(64,),
                threadgroup_memory={0: 256}, check_races=True)
    np.testing.assert_array_equal(y, np.roll(x, -1))


def test_a_threadgroup_variables_initializer_is_not_relied_on():
    """Apple's compiler accepts `threadgroup T x[N] = {...};`, but neither the MSL specification
    nor Metal says it runs (SoftMetal/README.md): SoftMetal drops it, so the variable
    starts poisoned and a read before any write is reported by the memory check."""
    lib = softmetal.compile("""
#include <metal_stdlib>
using namespace metal;
kernel void k(device float* y [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float partial[32] = {0};
    threadgroup float written[32] = {
        1.0f };
    written[tid] = 2.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[tid] = written[31 - tid] + partial[tid];
}
""")
    y = np.zeros(32, np.float32)
    lib.launch("k", [y], threadgroups=(1,), threads_per_threadgroup=(32,))
    assert np.isnan(y).all()  # poison, not the initializer's zeros
    with pytest.raises(softmetal.UninitializedReadError, match="MSL line 10"):
        lib.launch("k", [y], threadgroups=(1,), threads_per_threadgroup=(32,), check_memory=True)


def test_racing_threadgroups_are_a_race(bugs):
    y = np.zeros(8, np.uint32)
    bugs.launch("last_group_wins", [y], threadgroups=(64,), threads_per_threadgroup=(4,))  # silent without the check
    with pytest.raises(softmetal.RaceError, match="last_group_wins"):
        bugs.launch("last_group_wins", [y], threadgroups=(64,), threads_per_threadgroup=(4,), check_races=True)


def test_order_dependent_atomics_are_reported(bugs):
    counter = np.zeros(1, np.uint32)
    out = np.zeros(256, np.uint32)
    with pytest.raises(softmetal.RaceError):
        bugs.launch("atomic_slots", [counter, out], threadgroups=(8,), threads_per_threadgroup=(32,), check_order=True)
    # No access races (each slot is claimed once), so the race detector passes it.
    counter[:] = 0
    bugs.launch("atomic_slots", [counter, out], threadgroups=(8,), threads_per_threadgroup=(32,), check_races=True)


def test_unbound_buffer_and_unknown_kernel_are_usage_errors(bugs):
    with pytest.raises(softmetal.InvalidUsageError, match=r"buffer\(1\)"):
        bugs.launch("read_past_end", [np.ones(4, np.float32)], threadgroups=(1,), threads_per_threadgroup=(1,))
    with pytest.raises(softmetal.InvalidUsageError, match="no kernel named"):
        bugs.launch("nope", [], threadgroups=(1,))
    with pytest.raises(softmetal.InvalidUsageError, match=r"threadgroup\(0\)"):
        bugs.launch("with_barrier", [np.ones(4, np.float32), np.ones(4, np.float32)], threadgroups=(1,),
                    threads_per_threadgroup=(4,))


def test_guard_pages_still_work_after_another_fault_handler_is_installed(bugs):
    import faulthandler

    was_enabled = faulthandler.is_enabled()
    faulthandler.disable()
    faulthandler.enable()  # puts Python's SIGSEGV handler in front of SoftMetal's
    try:
        with pytest.raises(softmetal.OutOfBoundsError, match=r"buffer\(0\)"):
            bugs.launch("read_past_end", [np.ones(8, np.float32), np.zeros(64, np.float32)], threadgroups=(1,),
                        threads_per_threadgroup=(64,))
    finally:
        if not was_enabled:
            faulthandler.disable()


_DIVISION = """
kernel void divide(device const int* a [[buffer(0)]], device const int* b [[buffer(1)]],
                   device int* q [[buffer(2)]], device int* r [[buffer(3)]],
                   device const long* la [[buffer(4)]], device const long* lb [[buffer(5)]],
                   device long* lq [[buffer(6)]], device long* lr [[buffer(7)]],
                   device const uint* ua [[buffer(8)]], device const uint* ub [[buffer(9)]],
                   device uint* uq [[buffer(10)]], device uint* ur [[buffer(11)]],
                   uint i [[thread_position_in_grid]]) {
    q[i] = a[i] / b[i];
    r[i] = a[i] % b[i];
    lq[i] = la[i] / lb[i];
    lr[i] = la[i] % lb[i];
    uq[i] = ua[i] / ub[i];
    ur[i] = ua[i] % ub[i];
}
kernel void divide4(device const int4* a [[buffer(0)]], device const int4* b [[buffer(1)]],
                    device int4* q [[buffer(2)]], device int4* r [[buffer(3)]], uint i [[thread_position_in_grid]]) {
    q[i] = a[i] / b[i];
    r[i] = a[i] % b[i];
}
"""


def test_integer_division_by_zero_gives_a_value_and_is_reported_only_by_the_checks():
    # A GPU does not trap (ggml's soft_max takes `i % ne12` with ne12 = 0 and never uses
    # it); SoftMetal gives what Apple's CPUs give: x / 0 = 0, x % 0 = x, INT_MIN / -1 = INT_MIN.
    lib = softmetal.compile(_DIVISION)
    imin, lmin = np.iinfo(np.int32).min, np.iinfo(np.int64).min
    a = np.array([7, -7, imin, 9, imin, 0], np.int32)
    b = np.array([0, 0, 0, 2, -1, 0], np.int32)
    la = np.array([7, -7, lmin, 9, lmin, 1 << 40], np.int64)
    lb = np.array([0, 0, 0, 2, -1, 0], np.int64)
    ua = np.array([7, 0xFFFFFFFF, 5, 9, 3, 1], np.uint32)
    ub = np.array([0, 0, 0, 2, 0, 0], np.uint32)
    outs = [np.full(6, 12345, t) for t in (np.int32, np.int32, np.int64, np.int64, np.uint32, np.uint32)]
    buffers = [a, b, outs[0], outs[1], la, lb, outs[2], outs[3], ua, ub, outs[4], outs[5]]
    lib.launch("divide", buffers, threadgroups=(1,), threads_per_threadgroup=(6,))
    np.testing.assert_array_equal(outs[0], [0, 0, 0, 4, imin, 0])
    np.testing.assert_array_equal(outs[1], [7, -7, imin, 1, 0, 0])
    np.testing.assert_array_equal(outs[2], [0, 0, 0, 4, lmin, 0])
    np.testing.assert_array_equal(outs[3], [7, -7, lmin, 1, 0, 1 << 40])
    np.testing.assert_array_equal(outs[4], [0, 0, 0, 4, 0, 0])
    np.testing.assert_array_equal(outs[5], [7, 0xFFFFFFFF, 5, 1, 3, 1])

    # Vectors divide lane by lane (clang scalarises them into one div per lane).
    a4 = np.array([[8, -8, 5, 6]], np.int32)
    b4 = np.array([[0, 3, 0, -1]], np.int32)
    q4, r4 = np.zeros((1, 4), np.int32), np.zeros((1, 4), np.int32)
    lib.launch("divide4", [a4, b4, q4, r4], threadgroups=(1,), threads_per_threadgroup=(1,))
    np.testing.assert_array_equal(q4, [[0, -2, 0, -6]])
    np.testing.assert_array_equal(r4, [[8, -2, 5, 0]])

    # Under the checks it is an error: the division check alone, and the memory check with the MSL line.
    with pytest.raises(softmetal.SoftMetalError, match=r"kernel divide: an integer division or remainder by zero"):
        lib.launch("divide", buffers, threadgroups=(1,), threads_per_threadgroup=(6,), check_division=True)
    with pytest.raises(softmetal.SoftMetalError, match=r"kernel divide: an integer division or remainder by zero.* at MSL line (9|10)\b"):
        lib.launch("divide", buffers, threadgroups=(1,), threads_per_threadgroup=(6,), check_memory=True)
    # Divisors without a zero or an overflow pass the checks.
    ok = [a, np.array([1, 2, 3, 2, 5, 7], np.int32)] + [np.zeros(6, np.int32)] * 2 + \
         [la, np.array([1, 2, 3, 2, 5, 7], np.int64)] + [np.zeros(6, np.int64)] * 2 + \
         [ua, np.array([1, 2, 3, 2, 5, 7], np.uint32)] + [np.zeros(6, np.uint32)] * 2
    lib.launch("divide", [x.copy() for x in ok], threadgroups=(1,), threads_per_threadgroup=(6,), check_memory=True)
