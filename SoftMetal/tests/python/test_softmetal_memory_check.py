"""SoftMetal's memory check (check_memory=True, SOFTMETAL_CHECK_MEMORY=1): planted bugs
that guard pages, poisoning and the permutation race check all miss — far out-of-bounds
accesses, a write just before a buffer, an overflow from one threadgroup array into the
next, races whose outcome does not change the output, unwritten threadgroup memory read
through fmax — each caught with the kernel, the place and the MSL lines; correct
kernels (barriers, simd operations, atomics, simdgroup matrices) pass. (The MoE layer's
kernels run under it in tests/python/test_softmetal_backend.py.)"""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import moe_swift
import softmetal

pytestmark = pytest.mark.skipif("softmetal" not in moe_swift.available_backends(), reason="SoftMetal is Linux-only")

SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

kernel void copy(device const float* x [[buffer(0)]], device float* y [[buffer(1)]], uint i [[thread_position_in_grid]]) {
    y[i] = x[i];
}

kernel void write_far_past_end(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    y[i + 1048576] = 1.0f;                                    // 4 MiB past the start
}

kernel void read_far_past_end(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                              uint i [[thread_position_in_grid]]) {
    y[i] = x[i + 102400];                                     // 400 KB past the start
}

kernel void write_before_start(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    y[int(i) - 1] = 1.0f;                                     // out[-1] for thread 0
}

kernel void neighbour_overflow(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
    threadgroup float a[32];
    threadgroup float b[32];
    a[t] = 1.0f;
    b[t] = 2.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[t] = a[t + 1];                                          // thread 31 reads past a
}

// Each thread reads the slot its left neighbour wrote, with no barrier between.
kernel void missing_barrier(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                            uint t [[thread_index_in_threadgroup]]) {
    threadgroup float s[64];
    s[t] = x[t];
    if (t > 0) y[t] = s[t - 1];
}

kernel void with_barrier(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                         uint t [[thread_index_in_threadgroup]]) {
    threadgroup float s[64];
    s[t] = x[t];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t > 0) y[t] = s[t - 1];
}

// Every threadgroup writes the same value to y[0]: the output never depends on the
// order, so the permutation check passes, but on a GPU it is still a race.
kernel void same_value_race(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
    if (t == 0) y[0] = 1.0f;
}

// The second half of the threadgroup memory is never written; fmax turns the NaN poison
// into 0, so the output looks right.
kernel void unwritten_into_fmax(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
    threadgroup float s[64];
    if (t < 32) s[t] = float(t);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[t] = fmax(s[t], 0.0f);
}

// A reduction over simdgroups: partial sums through threadgroup memory.
kernel void simd_reduction(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                           uint t [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                           uint lane [[thread_index_in_simdgroup]], uint nsg [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    float v = simd_sum(x[t]);
    if (lane == 0) partial[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);     // REMOVED in the planted bug
    if (sg == 0) {
        float p = lane < nsg ? partial[lane] : 0.0f;
        p = simd_sum(p);
        if (lane == 0) y[0] = p;
    }
}

// The same without the barrier (ggml's mat-vec reduction with its barrier removed).
kernel void simd_reduction_no_barrier(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                           uint t [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                           uint lane [[thread_index_in_simdgroup]], uint nsg [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    float v = simd_sum(x[t]);
    if (lane == 0) partial[sg] = v;
    if (sg == 0) {
        float p = lane < nsg ? partial[lane] : 0.0f;
        p = simd_sum(p);
        if (lane == 0) y[0] = p;
    }
}

// Within one simdgroup, a simd operation orders the lanes.
kernel void simd_ordered(device float* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float s[32];
    s[lane] = float(lane);
    simdgroup_barrier(mem_flags::mem_threadgroup);
    y[lane] = s[31 - lane];
}

// The same exchange without the simd operation: lanes of one simdgroup are not ordered
// by being in one simdgroup (the slots are written once before a barrier, so the read
// is of initialised memory: the only fault is the order).
kernel void simd_unordered(device float* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float s[32];
    s[lane] = 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    s[lane] = float(lane);                                    // each lane's slot
    y[lane] = s[31 - lane];                                   // another lane's slot, nothing between
}

kernel void counter(device atomic_uint* c [[buffer(0)]], device uint* out [[buffer(1)]], uint i [[thread_position_in_grid]]) {
    uint slot = atomic_fetch_add_explicit(c, 1u, memory_order_relaxed);
    out[slot] = i;
}

// Reads buffer(0) and writes buffer(1): bound to one buffer, threadgroups race.
kernel void aliased(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                    uint g [[threadgroup_position_in_grid]], uint t [[thread_index_in_threadgroup]]) {
    y[g * 32 + t] = x[((g + 1) % 2) * 32 + t];
}

kernel void gemm8(device const float* a [[buffer(0)]], device const float* b [[buffer(1)]], device float* c [[buffer(2)]],
                  uint sg [[simdgroup_index_in_threadgroup]]) {
    simdgroup_float8x8 ma, mb, mc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    simdgroup_load(ma, a, 8);
    simdgroup_load(mb, b, 8);
    simdgroup_multiply_accumulate(mc, ma, mb, mc);
    simdgroup_store(mc, c, 8);
}
"""


@pytest.fixture(scope="module")
def lib():
    return softmetal.compile(SOURCE)


def lines_of(*markers):
    """MSL line numbers of the source lines containing each marker."""
    lines = SOURCE.split("\n")
    return [next(n for n, text in enumerate(lines, 1) if m in text) for m in markers]


def test_correct_kernels_pass(lib):
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    lib.launch("copy", [x, y], threadgroups=(2,), threads_per_threadgroup=(32,), check_memory=True)
    np.testing.assert_array_equal(y, x)
    lib.launch("with_barrier", [x, y], threadgroups=(1,), threads_per_threadgroup=(64,), check_memory=True)
    np.testing.assert_array_equal(y[1:], x[:-1])
    x = np.ones(128, np.float32)
    lib.launch("simd_reduction", [x, y], threadgroups=(1,), threads_per_threadgroup=(128,), check_memory=True)
    assert y[0] == 128
    lib.launch("simd_ordered", [y], threadgroups=(1,), threads_per_threadgroup=(32,), check_memory=True)
    np.testing.assert_array_equal(y[:32], np.arange(31, -1, -1))
    c, out = np.zeros(1, np.uint32), np.zeros(96, np.uint32)
    lib.launch("counter", [c, out], threadgroups=(3,), threads_per_threadgroup=(32,), check_memory=True)
    assert c[0] == 96 and sorted(out) == list(range(96))
    a, b, m = np.random.default_rng(0).standard_normal((3, 8, 8)).astype(np.float32)
    lib.launch("gemm8", [a, b, m], threadgroups=(1,), threads_per_threadgroup=(32,), check_memory=True)
    np.testing.assert_allclose(m, a @ b, rtol=1e-5, atol=1e-5)


def test_far_out_of_bounds_write_and_read(lib):
    y = np.zeros(64, np.float32)
    with pytest.raises(softmetal.OutOfBoundsError) as e:
        lib.launch("write_far_past_end", [y], threadgroups=(1,), threads_per_threadgroup=(1,), check_memory=True)
    message = str(e.value)
    assert "out-of-bounds write of 4 bytes" in message and "outside every bound buffer" in message
    assert "buffer(0) at byte offset 4194304" in message
    assert f"MSL line {lines_of('4 MiB past')[0]}" in message
    x = np.zeros(64, np.float32)
    with pytest.raises(softmetal.OutOfBoundsError, match="out-of-bounds read of 4 bytes"):
        lib.launch("read_far_past_end", [x, y], threadgroups=(1,), threads_per_threadgroup=(1,), check_memory=True)


def test_write_just_before_a_buffer(lib):
    """Inside the page slack before the data, where no guard page is."""
    y = np.zeros(64, np.float32)
    lib.launch("write_before_start", [y], threadgroups=(1,), threads_per_threadgroup=(1,))  # silent unchecked
    with pytest.raises(softmetal.OutOfBoundsError, match=r"buffer\(0\) at byte offset -4,.*thread 0 of threadgroup \(0, 0, 0\)"):
        lib.launch("write_before_start", [y], threadgroups=(1,), threads_per_threadgroup=(1,), check_memory=True)


def test_overflow_into_the_next_threadgroup_array(lib):
    y = np.zeros(32, np.float32)
    lib.launch("neighbour_overflow", [y], threadgroups=(1,), threads_per_threadgroup=(32,))  # silent unchecked
    with pytest.raises(softmetal.OutOfBoundsError) as e:
        lib.launch("neighbour_overflow", [y], threadgroups=(1,), threads_per_threadgroup=(32,), check_memory=True)
    message = str(e.value)
    assert "byte offset 128 of a 128-byte threadgroup variable" in message and "thread 31" in message
    assert f"MSL line {lines_of('thread 31 reads past a')[0]}" in message


def test_missing_barrier_names_both_threads_and_lines(lib):
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    with pytest.raises(softmetal.RaceError) as e:
        lib.launch("missing_barrier", [x, y], threadgroups=(1,), threads_per_threadgroup=(64,), check_memory=True)
    message = str(e.value)
    write, read = lines_of("s[t] = x[t];", "if (t > 0) y[t] = s[t - 1];")
    assert re.search(rf"thread \d+ of threadgroup \(0, 0, 0\) reads it at MSL line {read}, "
                     rf"thread \d+ of threadgroup \(0, 0, 0\) wrote it at MSL line {write}", message), message
    assert "no threadgroup_barrier between them" in message


def test_lanes_of_one_simdgroup_need_a_simd_operation(lib):
    """Both sides of the simdgroup rule: with simdgroup_barrier between the write and the
    read the exchange is clean (test_correct_kernels_pass); without it, it is a race."""
    y = np.zeros(32, np.float32)
    with pytest.raises(softmetal.RaceError) as e:
        lib.launch("simd_unordered", [y], threadgroups=(1,), threads_per_threadgroup=(32,), check_memory=True)
    write, read = lines_of("// each lane's slot", "// another lane's slot")
    message = str(e.value)
    assert f"MSL line {write}" in message and f"MSL line {read}" in message, message


def test_a_race_that_does_not_change_the_output(lib):
    y = np.zeros(1, np.float32)
    lib.launch("same_value_race", [y], threadgroups=(8,), threads_per_threadgroup=(4,), check_order=True)  # passes
    for check in ("check_races", "check_memory"):
        with pytest.raises(softmetal.RaceError, match="threadgroups of one dispatch are not ordered"):
            lib.launch("same_value_race", [y], threadgroups=(8,), threads_per_threadgroup=(4,), **{check: True})


def test_removed_barrier_in_a_simdgroup_reduction(lib):
    """ggml's mat-vec reduction with its barrier removed: simdgroup 0 reads the partial
    sums of simdgroups that may not have written them yet. Without the check no error is
    raised: the sum is right or NaN (the poison), depending on the schedule."""
    x = np.ones(128, np.float32)
    y = np.zeros(1, np.float32)
    lib.launch("simd_reduction_no_barrier", [x, y], threadgroups=(1,), threads_per_threadgroup=(128,))
    assert y[0] == 128 or np.isnan(y[0])
    with pytest.raises((softmetal.RaceError, softmetal.UninitializedReadError), match="partial|threadgroup variable"):
        lib.launch("simd_reduction_no_barrier", [x, y], threadgroups=(1,), threads_per_threadgroup=(128,), check_memory=True)


def test_unwritten_threadgroup_memory_through_fmax(lib):
    y = np.zeros(64, np.float32)
    lib.launch("unwritten_into_fmax", [y], threadgroups=(1,), threads_per_threadgroup=(64,))
    assert (y[32:] == 0).all()  # the NaN poison vanished: nothing looks wrong
    with pytest.raises(softmetal.UninitializedReadError, match=r"byte offset (1[3-9]\d|2\d\d|128) of a 256-byte threadgroup "
                       r"variable.*thread (3[2-9]|[45]\d|6[0-3]) "):
        lib.launch("unwritten_into_fmax", [y], threadgroups=(1,), threads_per_threadgroup=(64,), check_memory=True)


def test_one_buffer_bound_at_two_indices_is_one_memory(lib):
    data = np.arange(64, dtype=np.float32)
    other = data.copy()
    lib.launch("aliased", {0: data, 1: other}, threadgroups=(2,), threads_per_threadgroup=(32,), check_memory=True)
    np.testing.assert_array_equal(other, np.roll(data, 32))


def test_the_environment_variable_turns_it_on(tmp_path):
    code = ("import numpy as np; from moe_swift import softmetal\n"
            f"lib = softmetal.compile({SOURCE!r})\n"
            "y = np.zeros(1, np.float32)\n"
            "try:\n    lib.launch('same_value_race', [y], threadgroups=(8,), threads_per_threadgroup=(4,))\n"
            "except softmetal.RaceError:\n    print('caught')\n")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, SOFTMETAL_CHECK_MEMORY="1"),
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "caught", out.stderr[-2000:]


def test_an_atomic_initialises_every_byte_it_writes():
    # A counter in [[threadgroup(0)]] memory set and incremented by atomics, then read plainly
    # after a barrier: all four bytes count as written (once only the first one did).
    lib = softmetal.compile("""
using namespace metal;
kernel void count(device uint* y [[buffer(0)]], threadgroup atomic_uint* c [[threadgroup(0)]],
                  uint t [[thread_index_in_threadgroup]]) {
    if (t == 0) atomic_store_explicit(c, 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    atomic_fetch_add_explicit(c, 1u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t == 0) y[0] = *((threadgroup uint*)c);
}
""")
    y = np.zeros(1, np.uint32)
    lib.launch("count", [y], threadgroups=(1,), threads_per_threadgroup=(64,), threadgroup_memory={0: 16},
               check_memory=True)
    assert y[0] == 64


# ---- Apple's memory model across threadgroups ----------------------------------------

# The decode router's hand-off as it was written (moe_router.metal's moe_router_gemv before
# its fix): each threadgroup stores its value with a relaxed atomic, passes a
# threadgroup_barrier(mem_device) and bumps a relaxed counter; the threadgroup that sees
# groups - 1 sums every value with relaxed atomic loads. MSL orders none of it across
# threadgroups: the last one may read the value a location held before (the previous
# dispatch's). FENCE is empty here; the fenced twin puts a device-scope fence there.
HANDOFF = r"""
#include <metal_stdlib>
using namespace metal;

// Thread 0 bumps the counter; true in the threadgroup that saw groups - 1 (it resets the
// counter for the next dispatch).
static bool last_to_finish(device atomic_uint* counter, uint groups, uint t, threadgroup uint& last) {
    threadgroup_barrier(mem_flags::mem_device);
    if (t == 0) {
        FENCE
        const uint done = atomic_fetch_add_explicit(counter, 1u, memory_order_relaxed);
        FENCE
        last = done == groups - 1 ? 1u : 0u;
        if (done == groups - 1) atomic_store_explicit(counter, 0u, memory_order_relaxed);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return last != 0;
}

kernel void handoff(device const float* x [[buffer(0)]], device atomic_uint* partial [[buffer(1)]],
                    device atomic_uint* counter [[buffer(2)]], device float* out [[buffer(3)]],
                    uint g [[threadgroup_position_in_grid]], uint groups [[threadgroups_per_grid]],
                    uint t [[thread_index_in_threadgroup]]) {
    threadgroup uint last;
    if (t == 0) atomic_store_explicit(&partial[g], as_type<uint>(x[g] * 2.0f), memory_order_relaxed);  // hand-off store
    if (!last_to_finish(counter, groups, t, last)) return;
    if (t == 0) {
        float sum = 0.0f;
        for (uint i = 0; i < groups; i++) sum += as_type<float>(atomic_load_explicit(&partial[i], memory_order_relaxed));  // hand-off load
        out[0] = sum;
    }
}

// The same hand-off with plain stores and loads of the values.
kernel void handoff_plain(device const float* x [[buffer(0)]], device float* partial [[buffer(1)]],
                          device atomic_uint* counter [[buffer(2)]], device float* out [[buffer(3)]],
                          uint g [[threadgroup_position_in_grid]], uint groups [[threadgroups_per_grid]],
                          uint t [[thread_index_in_threadgroup]]) {
    threadgroup uint last;
    if (t == 0) partial[g] = x[g] * 2.0f;  // plain store
    if (!last_to_finish(counter, groups, t, last)) return;
    float sum = 0.0f;
    for (uint i = 0; i < groups; i++) sum += partial[i];  // plain load
    if (t == 0) out[0] = sum;
}

// The two-dispatch twin: a dispatch boundary orders everything.
kernel void store_partials(device const float* x [[buffer(0)]], device float* partial [[buffer(1)]],
                           uint g [[threadgroup_position_in_grid]], uint t [[thread_index_in_threadgroup]]) {
    if (t == 0) partial[g] = x[g] * 2.0f;
}
kernel void sum_partials(device const float* partial [[buffer(0)]], device float* out [[buffer(1)]],
                         constant uint& groups [[buffer(2)]]) {
    float sum = 0.0f;
    for (uint i = 0; i < groups; i++) sum += partial[i];
    out[0] = sum;
}
"""
DEVICE_FENCE = "atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope::thread_scope_device);"
GROUPS = 4


@pytest.fixture(scope="module")
def handoff():
    return softmetal.compile(HANDOFF.replace("FENCE", ""))


@pytest.fixture(scope="module")
def handoff_fenced():
    # Device-scope fences: MSL 3.2.
    return softmetal.compile(HANDOFF.replace("FENCE", DEVICE_FENCE), metal_version=320)


def _handoff_buffers():
    x = np.arange(1, GROUPS + 1, dtype=np.float32)
    previous = np.full(GROUPS, 100.0, np.float32)  # the previous call's values
    return x, previous, np.zeros(1, np.uint32), np.zeros(1, np.float32)


def handoff_line(marker):
    return next(n for n, text in enumerate(HANDOFF.split("\n"), 1) if marker in text)


@pytest.mark.parametrize("kernel, load, store", [("handoff", "// hand-off load", "// hand-off store"),
                                                 ("handoff_plain", "// plain load", "// plain store")])
def test_handoff_across_threadgroups_is_reported(handoff, kernel, load, store):
    x, previous, counter, out = _handoff_buffers()
    partial = previous.view(np.uint32).copy() if kernel == "handoff" else previous.copy()
    handoff.launch(kernel, [x, partial, counter, out], threadgroups=(GROUPS,), threads_per_threadgroup=(32,))
    assert out[0] == 2 * x.sum()  # unchecked: x86 shows every store to every later load
    for check in ("check_memory", "check_races"):
        counter[0], partial[:] = 0, previous.view(partial.dtype)
        with pytest.raises(softmetal.RaceError) as e:
            handoff.launch(kernel, [x, partial, counter, out], threadgroups=(GROUPS,), threads_per_threadgroup=(32,),
                           **{check: True})
        message = str(e.value)
        assert f"of threadgroup ({GROUPS - 1}, 0, 0) reads it" in message and "thread 0 of threadgroup (0, 0, 0) wrote it" in message
        assert f"at MSL line {handoff_line(load)}" in message and f"at MSL line {handoff_line(store)}" in message
        assert "threadgroups of one dispatch are not ordered by a threadgroup_barrier" in message
        assert ("reads it with an atomic load" in message) == (kernel == "handoff")


@pytest.mark.parametrize("kernel", ["handoff", "handoff_plain"])
def test_stale_reads_show_the_previous_value(handoff, kernel):
    """The last threadgroup reads its own value and the previous call's for the others."""
    x, previous, counter, out = _handoff_buffers()
    partial = previous.view(np.uint32).copy() if kernel == "handoff" else previous.copy()
    handoff.launch(kernel, [x, partial, counter, out], threadgroups=(GROUPS,), threads_per_threadgroup=(32,),
                   stale_reads=True)
    assert out[0] == 100.0 * (GROUPS - 1) + 2 * x[-1]
    # The stores did land: after the dispatch memory holds every threadgroup's value.
    np.testing.assert_array_equal(partial.view(np.float32), 2 * x)
    assert counter[0] == 0


@pytest.mark.parametrize("kernel", ["handoff", "handoff_plain"])
def test_fenced_handoff_is_clean(handoff_fenced, kernel):
    x, previous, counter, out = _handoff_buffers()
    partial = previous.view(np.uint32).copy() if kernel == "handoff" else previous.copy()
    for checks in ({"check_memory": True}, {"check_races": True}, {"stale_reads": True}, {"checks": "all"}):
        out[0] = 0
        handoff_fenced.launch(kernel, [x, partial, counter, out], threadgroups=(GROUPS,), threads_per_threadgroup=(32,),
                              **checks)
        assert out[0] == 2 * x.sum() and counter[0] == 0, checks


def test_two_dispatch_handoff_is_clean(handoff):
    x, previous, _, out = _handoff_buffers()
    partial = previous.copy()
    handoff.launch("store_partials", [x, partial], threadgroups=(GROUPS,), threads_per_threadgroup=(32,), checks="all")
    handoff.launch("sum_partials", [partial, out, np.uint32(GROUPS).tobytes()], threadgroups=(1,),
                   threads_per_threadgroup=(1,), checks="all", stale_reads=True)
    assert out[0] == 2 * x.sum()


def test_a_fence_at_threadgroup_scope_orders_nothing_across_threadgroups():
    lib = softmetal.compile(HANDOFF.replace("FENCE", DEVICE_FENCE.replace("thread_scope_device", "thread_scope_threadgroup")),
                            metal_version=320)
    x, previous, counter, out = _handoff_buffers()
    for check in ("check_memory", "check_races"):
        counter[0] = 0
        with pytest.raises(softmetal.RaceError, match="not ordered by a threadgroup_barrier"):
            lib.launch("handoff_plain", [x, previous, counter, out], threadgroups=(GROUPS,), threads_per_threadgroup=(32,),
                       **{check: True})


COHERENT = r"""
#include <metal_stdlib>
using namespace metal;
// Each threadgroup stores its value into COHERENT memory, FENCE, and bumps a relaxed counter;
// the last one sums the values without an acquire of its own.
kernel void coherent_handoff(device const float* x [[buffer(0)]], COHERENT device float* partial [[buffer(1)]],
                             device atomic_uint* counter [[buffer(2)]], device float* out [[buffer(3)]],
                             uint g [[threadgroup_position_in_grid]], uint groups [[threadgroups_per_grid]],
                             uint t [[thread_index_in_threadgroup]]) {
    threadgroup uint last;
    if (t == 0) {
        partial[g] = x[g] * 2.0f;  // coherent store
        FENCE
        const uint done = atomic_fetch_add_explicit(counter, 1u, memory_order_relaxed);
        last = done == groups - 1 ? 1u : 0u;
        if (done == groups - 1) atomic_store_explicit(counter, 0u, memory_order_relaxed);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (last == 0 || t != 0) return;
    float sum = 0.0f;
    for (uint i = 0; i < groups; i++) sum += partial[i];  // coherent load
    out[0] = sum;
}
"""


@pytest.mark.parametrize("coherent, fence, clean", [("coherent(device)", DEVICE_FENCE, True),
                                                    ("", DEVICE_FENCE, False),
                                                    ("coherent(device)", "", False)])
def test_coherent_device_memory_is_ordered_by_the_writers_fence(coherent, fence, clean):
    """MSL 3.2's coherent(device): another threadgroup's read of a value written before the
    writer's device-scope fence is ordered; without the qualifier the reader must acquire,
    and without the fence nothing publishes the write."""
    lib = softmetal.compile(COHERENT.replace("COHERENT", coherent).replace("FENCE", fence), metal_version=320)
    x, previous, counter, out = _handoff_buffers()
    for check in ("check_races", "check_memory"):
        counter[0], out[0] = 0, 0
        partial = previous.copy()
        if clean:
            lib.launch("coherent_handoff", [x, partial, counter, out], threadgroups=(GROUPS,),
                       threads_per_threadgroup=(32,), **{check: True})
            assert out[0] == 2 * x.sum()
        else:
            with pytest.raises(softmetal.RaceError, match="not ordered by a threadgroup_barrier") as e:
                lib.launch("coherent_handoff", [x, partial, counter, out], threadgroups=(GROUPS,),
                           threads_per_threadgroup=(32,), **{check: True})
            line = next(n for n, text in enumerate(COHERENT.split("\n"), 1) if "// coherent load" in text)
            assert f"MSL line {line}" in str(e.value)


def test_checks_all_is_checked(lib):
    """checks="all" runs the memory check (a same-value race) and run-ahead."""
    y = np.zeros(1, np.float32)
    with pytest.raises(softmetal.RaceError, match="threadgroups of one dispatch are not ordered"):
        lib.launch("same_value_race", [y], threadgroups=(8,), threads_per_threadgroup=(4,), checks="all")
    with pytest.raises(softmetal.InvalidUsageError, match="checks"):
        lib.launch("copy", [y, y], threadgroups=(1,), checks="some")
