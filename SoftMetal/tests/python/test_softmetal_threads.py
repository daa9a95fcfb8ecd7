"""SoftMetal, the software Metal device, through the kernel-level harness
moe_swift.softmetal: GPU threads working together, with small purpose-written MSL kernels
(softmetal_testlib.FEATURES): threadgroup barriers across several simdgroups, simd
operations over partial simdgroups, atomics, threadgroup arrays declared in kernels,
indirect dispatch, non-uniform grids."""

import numpy as np
import pytest

import softmetal
from softmetal_testlib import FEATURES, sizes

pytestmark = pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++")


def test_barriers_tree_reduction_over_several_simdgroups(lib):
    rng = np.random.default_rng(0)
    x = rng.integers(-50, 50, 4 * 256).astype(np.float32)
    out = np.zeros(4, np.float32)
    lib.launch("tree_sum", [x, out], threadgroups=(4,), threads_per_threadgroup=(256,),
               threadgroup_memory={0: 256 * 4}, check_races=True)
    np.testing.assert_array_equal(out, x.reshape(4, 256).sum(1))


@pytest.mark.parametrize("threads,active", [(45, 45), (64, 40), (32, 32), (13, 13)])
def test_simd_operations_on_partial_simdgroups(lib, threads, active):
    rng = np.random.default_rng(threads)
    x = rng.integers(-9, 9, threads).astype(np.float32)
    x[::7] = 20  # some lanes above 10
    out = np.full(threads * 16, -1, np.float32)
    lib.launch("simd_ops", [x, out, sizes(threads, active)], threadgroups=(1,), threads_per_threadgroup=(threads,))
    out = out.reshape(threads, 16)
    for tid in range(active):
        sg = tid // 32
        lanes = np.arange(sg * 32, min(sg * 32 + 32, active))
        v = x[lanes]
        lane = tid - sg * 32
        row = out[tid]

        def at(src):  # value of another active lane, own value if that lane is not active
            return x[sg * 32 + src] if 0 <= src < len(lanes) else x[tid]

        assert row[0] == v.sum() and row[1] == v.max() and row[2] == v.min()
        assert row[3] == v[:lane].sum() and row[4] == v[: lane + 1].sum()
        assert row[5] == at(lane + 3) and row[6] == (at(lane - 2) if lane >= 2 else x[tid])
        assert row[7] == at(lane ^ 1) and row[8] == at(4) and row[9] == v[0]
        assert row[10] == at((lane + 5) % 32)
        assert row[11:12].view(np.uint32)[0] == sum(1 << i for i, val in enumerate(v) if val > 0)
        assert row[12] == 1 and row[13] == float((v > 10).any()) and row[14] == float(lane == 0)
        assert row[15] == sum(range(len(lanes)))
    assert (out[active:] == -1).all(), "returned threads wrote nothing"


def test_atomics_device_and_threadgroup(lib):
    rng = np.random.default_rng(1)
    n, bins_n = 5000, 7
    values = rng.integers(0, 1000, n).astype(np.uint32)
    bins = np.zeros(bins_n, np.uint32)
    maxima = np.zeros(2, np.int32)
    lib.launch("histogram", [values, bins, maxima, sizes(n, bins_n)], grid=(n,), threads_per_threadgroup=(128,))
    np.testing.assert_array_equal(bins, np.bincount(values % bins_n, minlength=bins_n))
    assert maxima[0] == values.max() and maxima[1] == 128


def test_threadgroup_array_declared_in_kernel(lib):
    rows, cols = 16, 24
    a = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    out = np.zeros((cols, rows), np.float32)
    lib.launch("transpose_tile", [a, out, sizes(cols, rows)], threadgroups=(cols // 8, rows // 8),
               threads_per_threadgroup=(8, 8), check_races=True)
    np.testing.assert_array_equal(out, a.T)


def test_threadgroup_array_with_an_arithmetic_bound_is_shared():
    # `*` and `(` inside the bounds are arithmetic, not a pointer or function declarator:
    # the array must be one per threadgroup (a private copy per thread would leave the
    # other threads reading poison).
    lib = softmetal.compile("""
#include <metal_stdlib>
using namespace metal;
constant uint N = 4;
kernel void rotate(device float* out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float t[2 * (N + 4)];
    t[tid] = float(tid) * 10.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[tid] = t[(tid + 1) % (2 * (N + 4))];
}
""")
    out = np.zeros(16, np.float32)
    lib.launch("rotate", [out], threadgroups=(1,), threads_per_threadgroup=(16,), check_races=True)
    np.testing.assert_array_equal(out, (np.arange(1, 17) % 16) * 10.0)


def test_indirect_dispatch(lib):
    args = np.zeros(4, np.uint32)
    lib.launch("write_args", [args, sizes(300, 3)], threadgroups=(1,), threads_per_threadgroup=(1,))
    assert list(args[:3]) == [5, 3, 1]
    out = np.zeros(16, np.uint32)
    lib.launch("mark_groups", [out], indirect=(args, 0), threads_per_threadgroup=(64,))
    np.testing.assert_array_equal(out[:15], np.full(15, 5000 + 300 + 64))
    assert out[15] == 0
    # an offset into the arguments buffer
    args2 = np.array([0, 2, 1, 1], np.uint32)
    out[:] = 0
    lib.launch("mark_groups", [out], indirect=(args2, 4), threads_per_threadgroup=(8,))
    np.testing.assert_array_equal(out[:3], [2108, 2108, 0])


def test_non_uniform_grid_has_partial_edge_threadgroups(lib):
    gx, gy, gz = 21, 5, 3
    out = np.zeros(2 * gx * gy * gz + 8, np.uint32)
    lib.launch("grid_ids", [out], grid=(gx, gy, gz), threads_per_threadgroup=(8, 2, 2))
    got = out[: 2 * gx * gy * gz].reshape(gz, gy, gx, 2)
    for z in range(gz):
        for y in range(gy):
            for x in range(gx):
                tx = 8 if x < 16 else gx - 16
                ty = 2 if y < 4 else gy - 4
                tz = 2 if z < 2 else gz - 2
                assert got[z, y, x, 0] == tx * 10000 + ty * 100 + tz, (x, y, z)
                assert got[z, y, x, 1] == 1
    assert (out[2 * gx * gy * gz:] == 0).all()
