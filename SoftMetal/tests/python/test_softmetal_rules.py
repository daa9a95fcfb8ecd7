"""Both sides of the rules SoftMetal's checks state (README, "Checks"): for each, a small
kernel that breaks the rule is reported, naming what the README says the report names, and
its nearest legal twin passes under the same check. The rules tested elsewhere on both
sides (test_softmetal_memory_check.py: a missing threadgroup barrier, the simdgroup rule,
unwritten threadgroup memory, a far out-of-bounds access, hand-offs across threadgroups with
and without device-scope fences, coherent(device); test_softmetal_checks.py: the order
check's atomics, barrier divergence; test_third_party_mlx.py: a struct copy's stores) are
not repeated here."""

import numpy as np
import pytest

import moe_swift
import softmetal

pytestmark = pytest.mark.skipif("softmetal" not in moe_swift.available_backends(), reason="SoftMetal is Linux-only")

SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// An 8-byte read at element `at` of x: the last whole pair, or one straddling the end.
kernel void pair_at(device const float* x [[buffer(0)]], device float2* y [[buffer(1)]],
                    constant uint& at [[buffer(2)]]) {
    y[0] = *((device const float2*)(x + at));                  // the pair read
}

// Thread 0 reads a[-shift]: with shift 1, the red zone before the first threadgroup variable.
kernel void before_first_variable(device float* y [[buffer(0)]], constant int& shift [[buffer(1)]],
                                  uint t [[thread_index_in_threadgroup]]) {
    threadgroup float a[32];
    a[t] = float(t);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[t] = a[int(t) - shift];                                  // the red-zone read
}

// A 32-byte struct copy (clang's llvm.memcpy, checked byte by byte in the checked build).
struct alignas(32) V8 { float v[8]; };
kernel void struct_copy_at(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                           constant uint& at [[buffer(2)]]) {
    *((device V8*)y) = *((device const V8*)(x + at));          // the struct copy
}

// Threads of one threadgroup exchanging through device memory: a threadgroup barrier
// with mem_device orders them; nothing between is a race.
kernel void device_exchange_fenced(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
    y[t] = float(t);
    threadgroup_barrier(mem_flags::mem_device);
    y[64 + t] = y[t ^ 1];
}
kernel void device_exchange_unfenced(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
    y[t] = float(t);                                           // the device store
    y[64 + t] = y[t ^ 1];                                      // the neighbour's, unordered
}

// A simd operation orders the lanes of its own simdgroup only: with 64 threads, lane t
// reading the slot of thread 63 - t reads the other simdgroup's.
kernel void exchange_across_simdgroups(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
    threadgroup float s[64];
    s[t] = 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    s[t] = float(t);                                           // the slot store
    simdgroup_barrier(mem_flags::mem_threadgroup);
    y[t] = s[63 - t];                                          // the other simdgroup's slot
}
kernel void exchange_across_simdgroups_barrier(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
    threadgroup float s[64];
    s[t] = 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    s[t] = float(t);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[t] = s[63 - t];
}

// A threadgroup counter set with a plain store, then counted with atomics: the barrier
// between them is what orders the store before the other threads' atomics.
kernel void plain_init_then_atomics(device uint* y [[buffer(0)]], threadgroup atomic_uint* c [[threadgroup(0)]],
                                    constant uint& fenced [[buffer(1)]], uint t [[thread_index_in_threadgroup]]) {
    if (t == 0) *((threadgroup uint*)c) = 0u;                  // the plain store
    if (fenced != 0) threadgroup_barrier(mem_flags::mem_threadgroup);
    atomic_fetch_add_explicit(c, 1u, memory_order_relaxed);    // the atomic
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t == 0) y[0] = atomic_load_explicit(c, memory_order_relaxed);
}

// Atomics counted, then read plainly by another thread: a barrier between, or a race.
kernel void atomics_then_plain_read(device uint* y [[buffer(0)]], threadgroup atomic_uint* c [[threadgroup(0)]],
                                    constant uint& fenced [[buffer(1)]], uint t [[thread_index_in_threadgroup]]) {
    if (t == 0) atomic_store_explicit(c, 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t != 0) atomic_fetch_add_explicit(c, 1u, memory_order_relaxed);
    if (fenced != 0) threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t == 0) y[0] = *((threadgroup uint*)c);                // the plain read
}

// Threadgroup 0 adds to y[0] atomically; the others write it plainly or atomically.
kernel void atomic_and_plain_across_threadgroups(device atomic_uint* y [[buffer(0)]], constant uint& plain [[buffer(1)]],
                                                 uint g [[threadgroup_position_in_grid]],
                                                 uint t [[thread_index_in_threadgroup]]) {
    if (t != 0) return;
    if (g == 0 || plain == 0) atomic_fetch_add_explicit(y, 1u, memory_order_relaxed);
    else *((device uint*)y) = 7u;                              // the plain write
}

// Every thread counts once: the count is the same in every order.
kernel void atomic_count(device atomic_uint* c [[buffer(0)]]) {
    atomic_fetch_add_explicit(c, 1u, memory_order_relaxed);
}
"""


@pytest.fixture(scope="module")
def lib():
    return softmetal.compile(SOURCE)


def line(marker):
    return next(n for n, text in enumerate(SOURCE.split("\n"), 1) if marker in text)


def u32(v):
    return np.uint32(v).tobytes()


def test_an_access_partly_past_the_end(lib):
    x, y = np.arange(64, dtype=np.float32), np.zeros(2, np.float32)
    lib.launch("pair_at", [x, y, u32(62)], threadgroups=(1,), threads_per_threadgroup=(1,), check_memory=True)
    assert list(y) == [62, 63]
    with pytest.raises(softmetal.OutOfBoundsError) as e:
        lib.launch("pair_at", [x, y, u32(63)], threadgroups=(1,), threads_per_threadgroup=(1,), check_memory=True)
    message = str(e.value)
    assert "out-of-bounds read of 8 bytes" in message and "buffer(0) at byte offset 252" in message, message
    assert f"MSL line {line('// the pair read')}" in message, message


def test_the_red_zone_before_the_first_threadgroup_variable(lib):
    y = np.zeros(32, np.float32)
    lib.launch("before_first_variable", [y, np.int32(0).tobytes()], threadgroups=(1,), threads_per_threadgroup=(32,),
               check_memory=True)
    np.testing.assert_array_equal(y, np.arange(32))
    with pytest.raises(softmetal.OutOfBoundsError) as e:
        lib.launch("before_first_variable", [y, np.int32(1).tobytes()], threadgroups=(1,),
                   threads_per_threadgroup=(32,), check_memory=True)
    message = str(e.value)
    assert "byte offset -4 of a 128-byte threadgroup variable" in message and "thread 0 " in message, message
    assert f"MSL line {line('// the red-zone read')}" in message, message


def test_a_struct_copy_is_checked_for_bounds(lib):
    x, y = np.arange(64, dtype=np.float32), np.zeros(8, np.float32)
    lib.launch("struct_copy_at", [x, y, u32(56)], threadgroups=(1,), threads_per_threadgroup=(1,), check_memory=True)
    np.testing.assert_array_equal(y, np.arange(56, 64))
    with pytest.raises(softmetal.OutOfBoundsError) as e:
        lib.launch("struct_copy_at", [x, y, u32(60)], threadgroups=(1,), threads_per_threadgroup=(1,),
                   check_memory=True)
    message = str(e.value)
    assert "out-of-bounds read" in message and "buffer(0) at byte offset 256" in message, message
    assert f"MSL line {line('// the struct copy')}" in message, message


def test_a_mem_device_barrier_orders_device_memory_within_a_threadgroup(lib):
    y = np.zeros(128, np.float32)
    for check in ("check_races", "check_memory"):
        lib.launch("device_exchange_fenced", [y], threadgroups=(1,), threads_per_threadgroup=(64,), **{check: True})
        np.testing.assert_array_equal(y[64:], np.arange(64) ^ 1)
        with pytest.raises(softmetal.RaceError) as e:
            lib.launch("device_exchange_unfenced", [y], threadgroups=(1,), threads_per_threadgroup=(64,),
                       **{check: True})
        message = str(e.value)
        assert "buffer(0)" in message and f"MSL line {line('// the device store')}" in message, message
        assert f"MSL line {line('// the neighbour')}" in message, message


def test_a_simd_operation_does_not_order_lanes_of_another_simdgroup(lib):
    y = np.zeros(64, np.float32)
    lib.launch("exchange_across_simdgroups_barrier", [y], threadgroups=(1,), threads_per_threadgroup=(64,),
               check_races=True)
    np.testing.assert_array_equal(y, np.arange(63, -1, -1))
    with pytest.raises(softmetal.RaceError) as e:
        lib.launch("exchange_across_simdgroups", [y], threadgroups=(1,), threads_per_threadgroup=(64,),
                   check_races=True)
    message = str(e.value)
    assert f"MSL line {line('// the slot store')}" in message and f"MSL line {line('// the other simdgroup')}" in message


@pytest.mark.parametrize("kernel, plain, atomic", [("plain_init_then_atomics", "// the plain store", "// the atomic"),
                                                   ("atomics_then_plain_read", "// the plain read", None)])
def test_an_atomic_and_a_plain_access_race_unless_ordered(lib, kernel, plain, atomic):
    """Atomics never race with atomics (each kernel's atomics are unordered among
    themselves and pass); an atomic and another thread's plain access of the same location
    are a race unless a barrier orders them."""
    y = np.zeros(1, np.uint32)
    for check in ("check_races", "check_memory"):
        lib.launch(kernel, [y, u32(1)], threadgroups=(1,), threads_per_threadgroup=(64,),
                   threadgroup_memory={0: 16}, **{check: True})
        assert y[0] == (64 if kernel == "plain_init_then_atomics" else 63)
        with pytest.raises(softmetal.RaceError) as e:
            lib.launch(kernel, [y, u32(0)], threadgroups=(1,), threads_per_threadgroup=(64,),
                       threadgroup_memory={0: 16}, **{check: True})
        message = str(e.value)
        assert "data race" in message and f"MSL line {line(plain)}" in message, message
        if atomic:
            assert f"MSL line {line(atomic)}" in message, message


def test_an_atomic_and_a_plain_write_race_across_threadgroups(lib):
    y = np.zeros(1, np.uint32)
    lib.launch("atomic_and_plain_across_threadgroups", [y, u32(0)], threadgroups=(4,), threads_per_threadgroup=(32,),
               check_races=True)
    assert y[0] == 4
    with pytest.raises(softmetal.RaceError, match="not ordered by a threadgroup_barrier") as e:
        lib.launch("atomic_and_plain_across_threadgroups", [y, u32(1)], threadgroups=(4,),
                   threads_per_threadgroup=(32,), check_races=True)
    assert f"MSL line {line('// the plain write')}" in str(e.value)


def test_atomics_whose_result_is_the_same_in_every_order_pass_the_order_check(lib):
    """The negative side of test_order_dependent_atomics_are_reported (test_softmetal_checks.py)."""
    c = np.zeros(1, np.uint32)
    lib.launch("atomic_count", [c], threadgroups=(8,), threads_per_threadgroup=(32,), check_order=True)
    assert c[0] == 256
