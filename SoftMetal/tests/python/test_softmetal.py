"""SoftMetal, the software Metal device, through the kernel-level harness
moe_swift.softmetal: small purpose-written MSL kernels for each feature (barriers, simd
operations over partial simdgroups, atomics, threadgroup arrays, half and bfloat rounding,
vector constructors, simdgroup matrices, indirect dispatch, non-uniform grids), and planted
bugs that each check must catch (out of bounds, unwritten threadgroup memory, barrier
divergence, races)."""

import struct
import sys

import numpy as np
import pytest

import softmetal

pytestmark = pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++")

FEATURES = r"""
#include <metal_stdlib>
#include <metal_simdgroup_matrix>
using namespace metal;

struct Sizes { uint n; uint m; };

// Tree reduction in dynamic threadgroup memory: barriers across several simdgroups.
kernel void tree_sum(device const float* x [[buffer(0)]],
                     device float* out [[buffer(1)]],
                     threadgroup float* sh [[threadgroup(0)]],
                     uint tid [[thread_index_in_threadgroup]],
                     uint group [[threadgroup_position_in_grid]],
                     uint n [[threads_per_threadgroup]]) {
    sh[tid] = x[group * n + tid];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint stride = n / 2; stride > 0; stride >>= 1) {
        if (tid < stride) sh[tid] += sh[tid + stride];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (tid == 0) out[group] = sh[0];
}

// Every simd operation on a partial last simdgroup; threads >= p.m return first.
kernel void simd_ops(device const float* x [[buffer(0)]],
                     device float* out [[buffer(1)]],
                     constant Sizes& p [[buffer(2)]],
                     uint tid [[thread_index_in_threadgroup]],
                     uint lane [[thread_index_in_simdgroup]]) {
    if (tid >= p.m) return;
    float v = x[tid];
    device float* o = out + tid * 16;
    o[0] = simd_sum(v);
    o[1] = simd_max(v);
    o[2] = simd_min(v);
    o[3] = simd_prefix_exclusive_sum(v);
    o[4] = simd_prefix_inclusive_sum(v);
    o[5] = simd_shuffle_down(v, 3);
    o[6] = simd_shuffle_up(v, 2);
    o[7] = simd_shuffle_xor(v, 1);
    o[8] = simd_broadcast(v, 4);
    o[9] = simd_broadcast_first(v);
    o[10] = simd_shuffle(v, (lane + 5) % 32);
    o[11] = as_type<float>(uint(uint64_t(simd_ballot(v > 0.0f)) & 0xffffffffu));
    o[12] = simd_all(v > -100.0f) ? 1.0f : 0.0f;
    o[13] = simd_any(v > 10.0f) ? 1.0f : 0.0f;
    o[14] = simd_is_first() ? 1.0f : 0.0f;
    o[15] = float(simd_sum(int(lane)));
}

// Device atomics from many threadgroups (several OS threads), threadgroup atomics
// declared in the kernel body.
kernel void histogram(device const uint* values [[buffer(0)]],
                      device atomic_uint* bins [[buffer(1)]],
                      device atomic_int* maxima [[buffer(2)]],
                      constant Sizes& p [[buffer(3)]],
                      uint gid [[thread_position_in_grid]],
                      uint tid [[thread_index_in_threadgroup]]) {
    threadgroup atomic_uint local_count;
    if (tid == 0) atomic_store_explicit(&local_count, 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gid < p.n) {
        uint v = values[gid];
        atomic_fetch_add_explicit(&bins[v % p.m], 1u, memory_order_relaxed);
        atomic_fetch_max_explicit(&maxima[0], int(v), memory_order_relaxed);
        atomic_fetch_add_explicit(&local_count, 1u, memory_order_relaxed);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
        int expected = 0;
        // compare-exchange loop: maxima[1] = max over groups of their counts
        int mine = int(atomic_load_explicit(&local_count, memory_order_relaxed));
        expected = atomic_load_explicit(&maxima[1], memory_order_relaxed);
        while (mine > expected && !atomic_compare_exchange_weak_explicit(&maxima[1], &expected, mine,
                                       memory_order_relaxed, memory_order_relaxed)) {}
    }
}

// A 2D threadgroup array declared in the kernel (padded transpose through a tile).
kernel void transpose_tile(device const float* in [[buffer(0)]],
                           device float* out [[buffer(1)]],
                           constant Sizes& p [[buffer(2)]],
                           uint2 gid [[thread_position_in_grid]],
                           uint2 lid [[thread_position_in_threadgroup]],
                           uint2 group [[threadgroup_position_in_grid]]) {
    threadgroup float tile[8][9];
    tile[lid.y][lid.x] = in[gid.y * p.n + gid.x];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint2 o = uint2(group.y * 8 + lid.x, group.x * 8 + lid.y);
    out[o.y * p.m + o.x] = tile[lid.x][lid.y];
}

// half: every operation rounds to half.
kernel void half_chain(device const half* x [[buffer(0)]],
                       device half* out [[buffer(1)]],
                       constant Sizes& p [[buffer(2)]]) {
    half acc = 0.0h;
    half prod = 1.0h;
    for (uint i = 0; i < p.n; i++) {
        acc += x[i];
        prod = prod * x[i] + 0.25h;
    }
    out[0] = acc;
    out[1] = prod;
    half2 v = half2(x[0], x[1]);
    out[2] = v.x * v.y;
}

// bfloat: every operation rounds to bfloat (nearest even).
kernel void bfloat_chain(device const bfloat* x [[buffer(0)]],
                         device bfloat* out [[buffer(1)]],
                         device float* widened [[buffer(2)]],
                         constant Sizes& p [[buffer(3)]]) {
    bfloat acc = bfloat(0.0f);
    bfloat prod = bfloat(1.0f);
    for (uint i = 0; i < p.n; i++) {
        acc += x[i];
        prod = prod * x[i] + bfloat(0.25f);
    }
    out[0] = acc;
    out[1] = prod;
    widened[0] = float(x[0]) * float(x[1]);  // float arithmetic: not rounded to bfloat
    out[2] = bfloat(widened[0]);
}

// bfloat under the usual arithmetic conversions: with float it is float, with an integer
// bfloat; casts to and from half convert (clang's __bf16 and _Float16 do not).
kernel void bfloat_conversions(device const bfloat* x [[buffer(0)]],
                               device float* picked [[buffer(1)]],
                               device bfloat* with_int [[buffer(2)]],
                               device half* halves [[buffer(3)]],
                               device bfloat* from_half [[buffer(4)]],
                               uint i [[thread_position_in_grid]]) {
    float f = 0.1f;
    auto r = (i & 1) ? x[i] : f;
    static_assert(is_same<decltype(r), float>::value, "bfloat : float is float");
    picked[i] = r;
    auto n = x[i] * 3;
    static_assert(is_same<decltype(n), bfloat>::value, "bfloat * int is bfloat");
    with_int[i] = n;
    uint k = i % 3;
    halves[i] = k == 0 ? static_cast<half>(x[i]) : k == 1 ? half(x[i]) : (half)x[i];
    half h = halves[i];
    from_half[i] = k == 0 ? static_cast<bfloat>(h) : k == 1 ? bfloat(h) : (bfloat)h;
}

// MSL vector constructors, conversions and swizzles.
kernel void vectors(device float* out [[buffer(0)]],
                    device const int2* ints [[buffer(1)]]) {
    float4 a = float4(1.0f, 2.0f, 3.0f, 4.0f);
    float2 b = float2(5.0f, 6.0f);
    float4 c = float4(a.xy, b);
    float4 d = float4(b.yx, 7.0f, a.w);
    float4 e = float4(2.5f);
    float2 f = float2(ints[0]);           // converts, does not bit-cast
    float3 g = float3(a.zyx);
    uint3 h = uint3(c.xyz);
    half4 k = half4(a) * half4(0.5h);
    float4 l = float4(k);
    float4 m = float4(float2(8.0f, 9.0f), float2(10.0f, 11.0f));
    int i = 0;
    for (int j = 0; j < 4; j++) out[i++] = c[j];
    for (int j = 0; j < 4; j++) out[i++] = d[j];
    for (int j = 0; j < 4; j++) out[i++] = e[j];
    out[i++] = f.x; out[i++] = f.y;
    out[i++] = g.x; out[i++] = g.y; out[i++] = g.z;
    out[i++] = float(h.x + h.y + h.z);
    for (int j = 0; j < 4; j++) out[i++] = l[j];
    for (int j = 0; j < 4; j++) out[i++] = m[j];
    out[i++] = dot(a, e);
    out[i++] = length(float2(3.0f, 4.0f));
    out[i++] = max(a, float4(2.5f)).x + clamp(a, 1.5f, 3.5f).w;
    out[i++] = select(1.0f, 2.0f, a.x < a.y);
}

// C = A * B with simdgroup matrices: one simdgroup per 8x8 tile of C, K in steps of 8.
kernel void sg_gemm(device const float* A [[buffer(0)]],
                    device const float* B [[buffer(1)]],
                    device float* C [[buffer(2)]],
                    constant uint3& dims [[buffer(3)]],   // M, N, K
                    uint2 group [[threadgroup_position_in_grid]],
                    uint sg [[simdgroup_index_in_threadgroup]],
                    uint nsg [[simdgroups_per_threadgroup]]) {
    const uint M = dims.x, N = dims.y, K = dims.z;
    uint row = group.y * 8;
    uint col = (group.x * nsg + sg) * 8;
    if (row >= M || col >= N) return;
    simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (uint k = 0; k < K; k += 8) {
        simdgroup_float8x8 a, b;
        simdgroup_load(a, A + row * K + k, K);
        simdgroup_load(b, B + k * N + col, N);
        simdgroup_multiply_accumulate(acc, a, b, acc);
    }
    simdgroup_store(acc, C + row * N + col, N);
}

// Half tiles with a float accumulator; thread_elements() and transposed loads.
kernel void sg_elements(device const half* A [[buffer(0)]],
                        device float* out [[buffer(1)]],
                        device float* lanes [[buffer(2)]],
                        uint lane [[thread_index_in_simdgroup]]) {
    simdgroup_half8x8 a;
    simdgroup_half8x8 at;
    simdgroup_load(a, A, 8);
    simdgroup_load(at, A, 8, ulong2(0, 0), true);
    simdgroup_float8x8 c = simdgroup_float8x8(1.0f);   // identity
    simdgroup_multiply_accumulate(c, a, at, c);          // A * A^T + I
    auto e = c.thread_elements();
    lanes[lane * 2] = e[0];
    lanes[lane * 2 + 1] = e[1];
    c.thread_elements()[0] *= 2.0f;                     // doubles the elements held by each lane's slot 0
    simdgroup_store(c, out, 8);
}

// bfloat tiles: C (float) = A * B + C, and the bfloat result of A * B.
kernel void sg_bfloat(device const bfloat* A [[buffer(0)]],
                      device const bfloat* B [[buffer(1)]],
                      device float* C [[buffer(2)]],
                      device bfloat* D [[buffer(3)]]) {
    simdgroup_bfloat8x8 a, b;
    simdgroup_load(a, A, 8);
    simdgroup_load(b, B, 8);
    simdgroup_float8x8 c;
    simdgroup_load(c, C, 8);
    simdgroup_multiply_accumulate(c, a, b, c);
    simdgroup_store(c, C, 8);
    simdgroup_bfloat8x8 d;
    simdgroup_multiply(d, a, b);
    simdgroup_store(d, D, 8);
}

// Writes MTLDispatchThreadgroupsIndirectArguments for the next dispatch.
kernel void write_args(device uint* args [[buffer(0)]], constant Sizes& p [[buffer(1)]]) {
    args[0] = (p.n + 63) / 64;
    args[1] = p.m;
    args[2] = 1;
}

kernel void mark_groups(device uint* out [[buffer(0)]],
                        uint3 groups [[threadgroups_per_grid]],
                        uint3 group [[threadgroup_position_in_grid]],
                        uint3 tptg [[threads_per_threadgroup]],
                        uint3 lpos [[thread_position_in_threadgroup]],
                        uint tid [[thread_index_in_threadgroup]]) {
    if (tid == 0) out[group.y * groups.x + group.x] = 1000 * groups.x + 100 * groups.y + tptg.x;
    if (lpos.x != tid) out[0] = 77777;  // 1D threadgroups: position == index
}

// dispatchThreads with a grid that is not a multiple of the threadgroup size.
kernel void grid_ids(device uint* out [[buffer(0)]],
                     uint3 gid [[thread_position_in_grid]],
                     uint3 grid [[threads_per_grid]],
                     uint3 tptg [[threads_per_threadgroup]],
                     uint3 dtptg [[dispatch_threads_per_threadgroup]],
                     uint3 lpos [[thread_position_in_threadgroup]]) {
    uint i = (gid.z * grid.y + gid.y) * grid.x + gid.x;
    out[2 * i] = tptg.x * 10000 + tptg.y * 100 + tptg.z;
    out[2 * i + 1] = (dtptg.x == 8 && lpos.x < tptg.x) ? 1 : 0;
}
"""


def bf16_round(values):
    """float32 -> bfloat16 (round to nearest even) -> float32, like the runtime."""
    u = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def to_bf16_bits(values):
    return (bf16_round(values).view(np.uint32) >> 16).astype(np.uint16)


def from_bf16_bits(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def sizes(n, m=0):
    return struct.pack("II", n, m)


@pytest.fixture(scope="module")
def lib():
    return softmetal.compile(FEATURES)


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


def test_half_rounds_every_operation(lib):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(50) * 0.9).astype(np.float16)
    out = np.zeros(3, np.float16)
    lib.launch("half_chain", [x, out, sizes(len(x))], threadgroups=(1,), threads_per_threadgroup=(1,))
    acc, prod = np.float16(0), np.float16(1)
    for v in x:
        acc = np.float16(acc + v)
        prod = np.float16(np.float16(prod * v) + np.float16(0.25))
    assert out[0] == acc and out[1] == prod and out[2] == np.float16(x[0] * x[1])
    # and it is not float arithmetic rounded once at the end
    assert out[0] != np.float16(x.astype(np.float32).sum()) or acc == np.float16(x.astype(np.float32).sum())


def test_bfloat_rounds_every_operation(lib):
    rng = np.random.default_rng(3)
    xf = rng.standard_normal(40).astype(np.float32) * 3
    x = to_bf16_bits(xf)
    out = np.zeros(3, np.uint16)
    widened = np.zeros(1, np.float32)
    lib.launch("bfloat_chain", [x, out, widened, sizes(len(x))], threadgroups=(1,), threads_per_threadgroup=(1,))
    xs = from_bf16_bits(x)
    acc, prod = np.float32(0), np.float32(1)
    for v in xs:
        acc = bf16_round(acc + v)[()]
        prod = bf16_round(bf16_round(prod * v) + np.float32(0.25))[()]
    got = from_bf16_bits(out)
    assert got[0] == acc and got[1] == prod
    assert widened[0] == np.float32(xs[0] * xs[1])
    assert got[2] == bf16_round(widened)[0]
    naive = bf16_round([xs.sum()])[0]
    assert got[0] != naive or acc == naive


def test_vector_constructors_and_swizzles(lib):
    out = np.zeros(32, np.float32)
    ints = np.array([-3, 1 << 20], np.int32)
    lib.launch("vectors", [out, ints], threadgroups=(1,), threads_per_threadgroup=(1,))
    expected = [1, 2, 5, 6, 6, 5, 7, 4, 2.5, 2.5, 2.5, 2.5, -3, 1 << 20, 3, 2, 1, 1 + 2 + 5,
                0.5, 1, 1.5, 2, 8, 9, 10, 11, 25, 5, 2.5 + 3.5, 2]
    np.testing.assert_array_equal(out[: len(expected)], np.array(expected, np.float32))


@pytest.mark.parametrize("m,n,k", [(8, 8, 8), (16, 32, 24), (24, 64, 40)])
def test_simdgroup_matrix_gemm_matches_numpy(lib, m, n, k):
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    sgs = 2 if (n // 8) % 2 == 0 else 1
    lib.launch("sg_gemm", [a, b, c, np.array([m, n, k, 0], np.uint32)],
               threadgroups=(n // 8 // sgs, m // 8), threads_per_threadgroup=(32 * sgs,), check_races=True)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_simdgroup_matrix_thread_elements_layout_and_transpose(lib):
    rng = np.random.default_rng(4)
    a = rng.integers(-4, 4, (8, 8)).astype(np.float16)
    out = np.zeros((8, 8), np.float32)
    lanes = np.zeros(64, np.float32)
    lib.launch("sg_elements", [a, out, lanes], threadgroups=(1,), threads_per_threadgroup=(32,))
    want = a.astype(np.float32) @ a.T.astype(np.float32) + np.eye(8, dtype=np.float32)
    for lane in range(32):
        q = lane // 4
        row = (q & 4) + (lane // 2) % 4
        col = (q & 2) * 2 + (lane % 2) * 2
        assert lanes[2 * lane] == want[row, col] and lanes[2 * lane + 1] == want[row, col + 1]
        want[row, col] *= 2
    np.testing.assert_array_equal(out, want)


def test_simdgroup_matrix_bfloat(lib):
    rng = np.random.default_rng(5)
    a = to_bf16_bits(rng.standard_normal((8, 8)))
    b = to_bf16_bits(rng.standard_normal((8, 8)))
    c0 = rng.standard_normal((8, 8)).astype(np.float32)
    c = c0.copy()
    d = np.zeros((8, 8), np.uint16)
    lib.launch("sg_bfloat", [a, b, c, d], threadgroups=(1,), threads_per_threadgroup=(32,))
    product = from_bf16_bits(a).astype(np.float64) @ from_bf16_bits(b).astype(np.float64)
    np.testing.assert_allclose(c, product + c0, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(from_bf16_bits(d), bf16_round(product.astype(np.float32)))


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


# --- errors and planted bugs --------------------------------------------------------

BUGS = r"""
#include <metal_stdlib>
using namespace metal;

kernel void read_past_end(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                          uint gid [[thread_position_in_grid]]) {
    y[gid] = x[gid] * 2.0f;          // the grid is larger than x
}

kernel void write_past_end(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                           uint gid [[thread_position_in_grid]]) {
    y[gid + 1] = x[gid];             // off by one
}

kernel void threadgroup_overflow(device float* y [[buffer(0)]], threadgroup float* sh [[threadgroup(0)]],
                                 uint tid [[thread_index_in_threadgroup]]) {
    sh[tid * 1024] = 1.0f;           // far past the threadgroup memory
    y[tid] = sh[tid];
}

// Reads threadgroup memory that no thread wrote: only even slots are written.
kernel void reads_unwritten(device float* y [[buffer(0)]], threadgroup float* sh [[threadgroup(0)]],
                            uint tid [[thread_index_in_threadgroup]], uint n [[threads_per_threadgroup]]) {
    threadgroup float table[64];
    if (tid % 2 == 0) { sh[tid] = 1.0f; table[tid] = 1.0f; }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
        float s = 0.0f, t = 0.0f;
        for (uint i = 0; i < n; i++) { s += sh[i]; t += table[i]; }
        y[0] = s;
        y[1] = t;
    }
}

// An index read from threadgroup memory that no thread wrote (poison: 0xFFFFFFFF).
kernel void poisoned_index(device float* y [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
    threadgroup uint where_to[64];
    if (tid < 32) where_to[tid] = tid;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[where_to[tid]] = 1.0f;
}

kernel void barrier_in_branch(device float* y [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
    if (tid < 16) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
        y[tid] = 1.0f;
    }
    y[tid] += 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

kernel void different_barriers(device float* y [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
    if (tid < 40) {
        y[tid] = 1.0f;
        threadgroup_barrier(mem_flags::mem_device);
    } else {
        y[tid] = 2.0f;
        threadgroup_barrier(mem_flags::mem_device);
    }
}

kernel void simd_in_branch(device float* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
    float v = y[lane];
    if (lane < 16) v = simd_sum(v);
    else v = simd_max(v);
    y[lane] = v;
}

kernel void simd_vs_barrier(device float* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
    float v = y[lane];
    if (lane % 2 == 0) v = simd_sum(v);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[lane] = v;
}

// Missing barrier: each thread reads its neighbour's slot right after writing its own.
kernel void missing_barrier(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                            threadgroup float* sh [[threadgroup(0)]],
                            uint tid [[thread_index_in_threadgroup]], uint n [[threads_per_threadgroup]]) {
    sh[tid] = x[tid];
    y[tid] = sh[(tid + 1) % n];
}

// The same with the barrier: correct, and the race check must not complain.
kernel void with_barrier(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                         threadgroup float* sh [[threadgroup(0)]],
                         uint tid [[thread_index_in_threadgroup]], uint n [[threads_per_threadgroup]]) {
    sh[tid] = x[tid];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[tid] = sh[(tid + 1) % n];
}

// Threadgroups race on 8 elements: the last one to write each wins.
kernel void last_group_wins(device uint* y [[buffer(0)]], uint group [[threadgroup_position_in_grid]],
                            uint tid [[thread_index_in_threadgroup]]) {
    if (tid == 0) y[group % 8] = group;
}

// Slots claimed with an atomic counter: the order of the output depends on thread order.
kernel void atomic_slots(device atomic_uint* counter [[buffer(0)]], device uint* out [[buffer(1)]],
                         uint gid [[thread_position_in_grid]]) {
    uint slot = atomic_fetch_add_explicit(counter, 1u, memory_order_relaxed);
    out[slot] = gid;
}
"""


@pytest.fixture(scope="module")
def bugs():
    return softmetal.compile(BUGS)


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


def test_compile_error_is_a_compile_error_with_the_msl_line():
    source = "#include <metal_stdlib>\nusing namespace metal;\n\nkernel void k(device float* y [[buffer(0)]]) {\n    y[0] = not_declared + 1.0f;\n}\n"
    with pytest.raises(softmetal.CompileError) as e:
        softmetal.compile(source)
    message = str(e.value)
    assert "compile error" in message and "source.metal:5" in message and "not_declared" in message
    assert "MSL line 5: y[0] = not_declared + 1.0f;" in message


def test_unbound_buffer_and_unknown_kernel_are_usage_errors(bugs):
    with pytest.raises(softmetal.InvalidUsageError, match=r"buffer\(1\)"):
        bugs.launch("read_past_end", [np.ones(4, np.float32)], threadgroups=(1,), threads_per_threadgroup=(1,))
    with pytest.raises(softmetal.InvalidUsageError, match="no kernel named"):
        bugs.launch("nope", [], threadgroups=(1,))
    with pytest.raises(softmetal.InvalidUsageError, match=r"threadgroup\(0\)"):
        bugs.launch("with_barrier", [np.ones(4, np.float32), np.ones(4, np.float32)], threadgroups=(1,),
                    threads_per_threadgroup=(4,))


def test_dict_buffers_and_input_only_bytes(lib):
    x = np.arange(64, dtype=np.float32)
    out = np.zeros(1, np.float32)
    lib.launch("tree_sum", {1: out, 0: x.copy()}, threadgroups=(1,), threads_per_threadgroup=(64,),
               threadgroup_memory={0: 64 * 4})
    assert out[0] == x.sum()
    frozen = np.zeros(2, np.uint32)
    frozen.flags.writeable = False
    lib.launch("write_args", [np.zeros(4, np.uint32), frozen], threadgroups=(1,), threads_per_threadgroup=(1,))


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


def test_types_need_no_using_namespace():
    lib = softmetal.compile("""
#include <metal_stdlib>
kernel void k(device float* x [[buffer(0)]], device half* h [[buffer(1)]], uint i [[thread_position_in_grid]]) {
    float4 v = float4(float2(1.0f, 2.0f), 3.0f, 4.0f);
    x[i] = v[i] + metal::exp(0.0f);
    h[i] = half(v[i]) * 0.5h;
}
""")
    x = np.zeros(4, np.float32)
    h = np.zeros(4, np.float16)
    lib.launch("k", [x, h], threadgroups=(1,), threads_per_threadgroup=(4,))
    np.testing.assert_array_equal(x, [2, 3, 4, 5])
    np.testing.assert_array_equal(h, [0.5, 1, 1.5, 2])



def test_a_vector_from_a_packed_vector_converts_each_component():
    """`float4(packed_char4)` (ggml's dequantize_q8_0): four components, not a splat of the first."""
    lib = softmetal.compile("""
#include <metal_stdlib>
using namespace metal;
kernel void k(device const char* x [[buffer(0)]], device float4* out [[buffer(1)]]) {
    device const packed_char4* q = (device const packed_char4*) x;
    out[0] = float4(q[0]) * 0.5f;
    out[1] = float4(packed_float3(float3(1.0f, 2.0f, 3.0f)), 4.0f);
}
""")
    out = np.zeros((2, 4), np.float32)
    lib.launch("k", [np.array([-8, 3, 0, 127], np.int8), out], threadgroups=(1,), threads_per_threadgroup=(1,))
    np.testing.assert_array_equal(out, [[-4, 1.5, 0, 63.5], [1, 2, 3, 4]])


def test_bfloat_takes_part_in_the_usual_arithmetic_conversions(lib):
    xf = np.array([1.5, 0.3, -2.75, 1e-3, 3.0e38, 7.0, -0.0, 65504.0], np.float32)
    x = to_bf16_bits(xf)
    xs = from_bf16_bits(x)
    n = len(x)
    picked, halves = np.zeros(n, np.float32), np.zeros(n, np.float16)
    with_int, from_half = np.zeros(n, np.uint16), np.zeros(n, np.uint16)
    lib.launch("bfloat_conversions", [x, picked, with_int, halves, from_half], threadgroups=(1,),
               threads_per_threadgroup=(n,))
    odd = np.arange(n) % 2 == 1
    np.testing.assert_array_equal(picked, np.where(odd, xs, np.float32(0.1)))  # 0.1 not rounded to bfloat
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(from_bf16_bits(with_int), bf16_round(xs * 3))
        h = xs.astype(np.float16)
    np.testing.assert_array_equal(halves, h)
    np.testing.assert_array_equal(from_bf16_bits(from_half), bf16_round(h.astype(np.float32)))

# ---- templated kernels, the preprocessor, includes (MLX-style MSL) ----

QUANT_HEADER = r"""
#pragma once
#include <metal_stdlib>
#include "dequant.h"
using namespace metal;

// y[row] = sum_k dequant(w[row, k]) * x[k]; w packs 32 / BITS codes per uint.
template <typename T, int BITS>
[[kernel, max_total_threads_per_threadgroup(64)]] void qmv(
    device const uint* w [[buffer(0)]], device const T* scales [[buffer(1)]],
    device const T* x [[buffer(2)]], device T* y [[buffer(3)]],
    constant uint& k [[buffer(4)]], uint row [[thread_position_in_grid]]) {
    constexpr uint per_word = 32 / BITS;
    float acc = 0.0f;
    for (uint i = 0; i < k; ++i) {
        uint word = w[(row * k + i) / per_word];
        acc += DEQUANT(word, i % per_word, BITS) * float(scales[row]) * float(x[i]);
    }
    y[row] = T(acc);
}
"""

QUANT_SOURCE = r"""
#include "quant/qmv.h"
#define instantiate_qmv(tname, T, bits) \
  template [[host_name("qmv_" #tname "_" #bits)]] [[kernel]] decltype(qmv<T, bits>) qmv<T, bits>;
instantiate_qmv(float32, float, 4)
instantiate_qmv(float16, half, 4)
// One more level so that QBITS (a -D define) expands before # stringizes it.
#define instantiate_qmv_expanded(tname, T, bits) instantiate_qmv(tname, T, bits)
#if defined(__HAVE_BFLOAT__) && __METAL_VERSION__ >= 310
instantiate_qmv_expanded(bfloat16, bfloat, QBITS)
#endif
"""


def quant_include_dir(tmp_path):
    """include/quant/qmv.h includes "dequant.h" next to itself (found only relative to it)."""
    (tmp_path / "include" / "quant").mkdir(parents=True)
    (tmp_path / "include" / "quant" / "qmv.h").write_text(QUANT_HEADER)
    (tmp_path / "include" / "quant" / "dequant.h").write_text(
        "#pragma once\n#define DEQUANT(word, j, bits) float(((word) >> ((j) * (bits))) & ((1u << (bits)) - 1))\n")
    return tmp_path / "include"


def qmv_reference(codes, scales, x):
    return (codes.astype(np.float32) * scales[:, None].astype(np.float32)) @ x.astype(np.float32)


def pack(codes, bits):
    per_word = 32 // bits
    flat = codes.reshape(-1, per_word).astype(np.uint32)
    return (flat << (np.arange(per_word, dtype=np.uint32) * bits)).sum(1).astype(np.uint32)


@pytest.mark.parametrize("name,dtype,bits", [("qmv_float32_4", np.float32, 4), ("qmv_float16_4", np.float16, 4),
                                             ("qmv_bfloat16_8", "bf16", 8)])
def test_template_instances_from_an_included_header_run_under_their_host_names(tmp_path, name, dtype, bits):
    lib = softmetal.compile(QUANT_SOURCE, include_dirs=[quant_include_dir(tmp_path)], defines={"QBITS": 8})
    rows, k = 8, 16
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, (rows, k))
    scales = np.array([0.5, 0.25, 1, 2, 0.125, 1.5, 0.75, 1], np.float32)
    x = rng.integers(-4, 5, k).astype(np.float32)
    if dtype == "bf16":  # exact in bfloat: small integers and powers of two
        s_in, x_in, y = to_bf16_bits(scales), to_bf16_bits(x), np.zeros(rows, np.uint16)
    else:
        s_in, x_in, y = scales.astype(dtype), x.astype(dtype), np.zeros(rows, dtype)
    lib.launch(name, [pack(codes, bits), s_in, x_in, y, struct.pack("I", k)], grid=(rows,),
               threads_per_threadgroup=(4,))
    got = from_bf16_bits(y) if dtype == "bf16" else y.astype(np.float32)
    np.testing.assert_allclose(got, qmv_reference(codes, scales, x), rtol=1e-2)


def test_no_bfloat_instances_before_msl_3_1_and_the_template_is_not_a_kernel(tmp_path):
    lib = softmetal.compile(QUANT_SOURCE, include_dirs=[str(quant_include_dir(tmp_path))], defines={"QBITS": 8},
                            metal_version=300)
    with pytest.raises(softmetal.InvalidUsageError, match=r"no kernel named qmv_bfloat16_8.*qmv_float16_4"):
        lib.launch("qmv_bfloat16_8", [], grid=(1,))
    with pytest.raises(softmetal.InvalidUsageError, match="no kernel named qmv "):
        lib.launch("qmv", [], grid=(1,))


def test_combined_kernel_attribute_limits_threads_per_threadgroup(tmp_path):
    lib = softmetal.compile(QUANT_SOURCE, include_dirs=[quant_include_dir(tmp_path)], defines={"QBITS": 8})
    with pytest.raises(softmetal.InvalidUsageError, match="exceeds maxTotalThreadsPerThreadgroup 64"):
        lib.launch("qmv_float32_4", [np.zeros(64, np.uint32), np.zeros(128, np.float32), np.zeros(16, np.float32),
                                     np.zeros(128, np.float32), struct.pack("I", 16)],
                   grid=(128,), threads_per_threadgroup=(128,))


def test_defines_and_predefined_macros():
    source = r"""
    kernel void macros(device int* out [[buffer(0)]]) {
        out[0] = __METAL_VERSION__;
    #ifdef __HAVE_BFLOAT__
        out[1] = __HAVE_BFLOAT__;
    #endif
        out[2] = WIDTH;
    #if FLAG
        out[3] = 1;
    #endif
    }
    """
    out = np.zeros(4, np.int32)
    softmetal.compile(source, defines={"WIDTH": 7, "FLAG": None}).launch("macros", [out], grid=(1,))
    assert out.tolist() == [310, 1, 7, 1]
    out[:] = 0
    softmetal.compile(source, defines={"WIDTH": "2 * 3", "FLAG": False}, metal_version=300).launch("macros", [out], grid=(1,))
    assert out.tolist() == [300, 0, 6, 0]


def test_unsupported_kernel_attribute_is_a_compile_error_with_the_msl_line():
    source = "#include <metal_stdlib>\n\ntemplate <typename T>\n[[kernel, visible]] void f(device T* x [[buffer(0)]]) {}\n"
    with pytest.raises(softmetal.CompileError) as e:
        softmetal.compile(source)
    message = str(e.value)
    assert "source.metal:4: error: the kernel attribute [[visible]] is not supported by SoftMetal" in message
    assert "MSL line 4: [[kernel, visible]]" in message
    assert "softmetal-generated" not in message


def test_compile_errors_in_an_included_header_name_its_file_and_line(tmp_path):
    include = quant_include_dir(tmp_path)
    header = include / "quant" / "qmv.h"
    header.write_text(QUANT_HEADER.replace("acc += DEQUANT", "acc += undeclared_scale * DEQUANT"))
    line = QUANT_HEADER.split("\n").index("        acc += DEQUANT(word, i % per_word, BITS) * float(scales[row]) * float(x[i]);") + 1
    with pytest.raises(softmetal.CompileError) as e:
        softmetal.compile(QUANT_SOURCE, include_dirs=[include], defines={"QBITS": 8})
    message = str(e.value)
    assert f"{header}:{line}:" in message and "undeclared_scale" in message, message
    assert f"qmv.h line {line}: acc += undeclared_scale" in message, message


def test_missing_include_is_a_compile_error():
    with pytest.raises(softmetal.CompileError, match=r"source.metal:2:\d+: (fatal )?error: 'nowhere.h' file not found"):
        softmetal.compile("// x\n#include \"nowhere.h\"\n")


def test_the_standard_library_declares_msl_names_only():
    """MSL has no erf: a stand-in metal::erf silently changed which erf a third-party
    kernel that brings its own (as MLX does) called."""
    src = """
    #include <metal_stdlib>
    using namespace metal;
    float erf(float a) { return a * 2; }
    kernel void k(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = erf(y[i]); }
    """
    y = np.ones(4, np.float32)
    softmetal.compile(src).launch("k", [y], grid=(4,), threads_per_threadgroup=(4,))
    assert y.tolist() == [2, 2, 2, 2]
    with pytest.raises(softmetal.CompileError, match="undeclared identifier 'erf'"):
        softmetal.compile("#include <metal_stdlib>\nusing namespace metal;\n"
                          "kernel void k(device float* y [[buffer(0)]]) { y[0] = erf(y[0]); }")


FUNCTION_CONSTANTS = """
#include <metal_stdlib>
using namespace metal;
constant bool has_bias [[function_constant(0)]];
constant int scale [[function_constant(1)]];
constant half half_step [[function_constant(2)]];
constant bool has_scale = is_function_constant_defined(scale);
kernel void affine(device float* y [[buffer(0)]], device const float* bias [[buffer(1), function_constant(has_bias)]],
                   uint i [[thread_position_in_grid]]) {
    float v = float(i) * (has_scale ? float(scale) : 1.0f) + float(half_step);
    if (has_bias) v += bias[i];
    y[i] = v;
}
"""


def test_function_constants_through_the_harness():
    lib = softmetal.compile(FUNCTION_CONSTANTS)
    y = np.zeros(8, np.float32)
    bias = np.full(8, 100.0, np.float32)
    # By index and by name; the bias buffer exists only when has_bias is true.
    lib.launch("affine", {0: y, 1: bias}, threadgroups=(1,), threads_per_threadgroup=(8,),
               constants={0: True, "scale": 3, 2: 0.5})
    np.testing.assert_array_equal(y, np.arange(8) * 3 + 0.5 + 100)
    lib.launch("affine", [y], threadgroups=(1,), threads_per_threadgroup=(8,), constants={"has_bias": False})
    np.testing.assert_array_equal(y, np.arange(8))  # scale undefined: 1; half_step: 0
    with pytest.raises(softmetal.InvalidUsageError, match="no function constant with index 7.*has_bias \\(0, bool\\)"):
        lib.launch("affine", [y], threadgroups=(1,), threads_per_threadgroup=(8,), constants={7: 1})
    with pytest.raises(softmetal.InvalidUsageError, match="scale is int: 2.5 is not a value of that type"):
        lib.launch("affine", [y], threadgroups=(1,), threads_per_threadgroup=(8,), constants={"scale": 2.5})
    with pytest.raises(softmetal.InvalidUsageError, match="a key must be"):
        lib.launch("affine", [y], threadgroups=(1,), threads_per_threadgroup=(8,), constants={(0,): 1})


def test_compile_errors_come_whole_and_before_warnings():
    # A helper that warns (a path without a return) before a kernel with many errors: the
    # message starts with the errors and is not cut (the last-error slot once kept 1023 bytes).
    body = "\n".join(f"    y[{i}] = undeclared_{i};" for i in range(15))
    source = ("float f(float a) { if (a > 0.0f) return a; }\n"
              f"kernel void k(device float* y [[buffer(0)]]) {{\n{body}\n}}\n")
    with pytest.raises(softmetal.CompileError) as e:
        softmetal.compile(source)
    message = str(e.value)
    assert len(message) > 1100 and "undeclared_14" in message, len(message)
    assert "warning:" in message and message.index("error:") < message.index("warning:"), message[:600]


def test_noexcept_is_accepted_as_apples_compiler_accepts_it():
    # MLX's steel/utils/integral_constant.h: `constexpr operator value_type() const thread noexcept`.
    lib = softmetal.compile("""
template <typename T, T v> struct constant_value {
    static constexpr constant T value = v;
    constexpr operator T() const thread noexcept { return value; }
};
static inline float twice(float x) noexcept { return 2.0f * x; }
kernel void k(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    y[i] = twice(float(i)) + float(constant_value<int, 3>{}) + (noexcept(twice(1.0f)) ? 1.0f : 0.0f);
}
""")
    y = np.zeros(4, np.float32)
    lib.launch("k", [y], threadgroups=(1,), threads_per_threadgroup=(4,))
    np.testing.assert_array_equal(y, 2.0 * np.arange(4) + 4.0)
    with pytest.raises(softmetal.CompileError, match=r"source.metal:1.*`throw`.*not part of MSL"):
        softmetal.compile("static inline float f(float x) { if (x < 0.0f) throw 1; return x; }\n"
                          "kernel void k(device float* y [[buffer(0)]]) { y[0] = f(1.0f); }\n")


@pytest.mark.parametrize("statement,word", [
    ("thread float* p = new float[4];", "new"), ("goto done; done: ;", "goto"), ("try { } catch (...) { }", "try"),
    ("thread_local int t = 0;", "thread_local"), ("register int r = 0;", "register"),
])
def test_cpp_that_msl_excludes_is_a_compile_error(statement, word):
    source = f"kernel void k(device float* y [[buffer(0)]]) {{\n    {statement}\n}}\n"
    with pytest.raises(softmetal.CompileError, match=rf"source.metal:2.*`{word}`.*not part of MSL"):
        softmetal.compile(source)
    # A deleted function is not the delete operator; virtual in a struct is refused too.
    softmetal.compile("struct S { S(thread const S&) = delete; };\nkernel void k(device float* y [[buffer(0)]]) { y[0] = 1.0f; }\n")
    with pytest.raises(softmetal.CompileError, match="virtual"):
        softmetal.compile("struct S { virtual float f(); };\nkernel void k(device float* y [[buffer(0)]]) { }\n")


_RESTRICTED_CPP = """\
int fact(int n) { return n <= 1 ? 1 : n * fact(n - 1); }
int odd(int n);
int even(int n) { return n == 0 ? 1 : odd(n - 1); }
int odd(int n) { return n == 0 ? 0 : even(n - 1); }
template <int K> int depth(int n) { if constexpr (K > 0) { return depth<K - 1>(n) + 1; } else { return n; } }
template <typename T> T twice(T x) { return x + x; }
template <typename T, int (*f)(int)> T apply(T x) { return f(x); }
kernel void k(device int* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    int (*fp)(int) = i ? twice<int> : fact;
    auto add = [&](int x) { return x + (int)i; };
    out[i] = fact(4) + even(4) + depth<3>(1) + fp(1) + add(1) + apply<int, twice<int>>(1);
}
"""


@pytest.mark.parametrize("version,refused", [
    (220, ["function pointers: k calls through one (line 11)", "lambda expressions: the lambda at line 10",
           "recursion: even calls odd (line 3), odd calls even (line 4)", "recursion: fact calls itself (line 1)"]),
    (230, ["lambda", "recursion: even calls odd", "recursion: fact calls itself"]),
    (240, ["lambda expressions: the lambda at line 10"]),
    (310, ["lambda expressions: the lambda at line 10"]),
    (320, []),
])
def test_recursion_function_pointers_and_lambdas_follow_the_msl_version(version, refused):
    # MSL specification (version 4), section 1.5.4: lambdas from MSL 3.2 on, function
    # pointers from 2.3 on, recursion in compute functions from 2.4 on. A template calling
    # another instance of itself (depth<3> -> depth<2>) is not recursion, and a function
    # pointer as a template argument (apply<int, twice<int>>) is a direct call.
    if not refused:
        out = np.zeros(4, np.int32)
        softmetal.compile(_RESTRICTED_CPP, metal_version=version).launch(
            "k", [out], threadgroups=(1,), threads_per_threadgroup=(4,))
        np.testing.assert_array_equal(out, [24 + 1 + 4 + 1 + 1 + 2] + [24 + 1 + 4 + 2 + 1 + i + 2 for i in (1, 2, 3)])
        return
    with pytest.raises(softmetal.CompileError) as e:
        softmetal.compile(_RESTRICTED_CPP, metal_version=version)
    message = str(e.value)
    for part in refused:
        assert part in message, message
    assert f"MSL {version // 100}.{version % 100 // 10} does not allow" in message, message
    assert ("recursion" in message) == (version < 240) and ("function pointers" in message) == (version < 230), message


def test_strict_cpp_applies_every_restriction(monkeypatch):
    monkeypatch.setenv("SOFTMETAL_STRICT_CPP", "1")
    with pytest.raises(softmetal.CompileError, match=r"source.metal:1: error: MSL before 2.4 does not allow recursion: "
                       r"fact calls itself \(line 1\)"):
        softmetal.compile(_RESTRICTED_CPP, metal_version=320)


def test_parameters_the_kernel_never_uses_need_not_be_bound():
    # As in Metal: an argument the body never names may stay unbound; a used one may not.
    lib = softmetal.compile("""
kernel void k(device float* y [[buffer(0)]], device const float* spare [[buffer(1)]],
              threadgroup float* scratch [[threadgroup(0)]], uint i [[thread_position_in_grid]]) {
    y[i] = 2.0f;
}
kernel void uses(device float* y [[buffer(0)]], device const float* x [[buffer(1)]], uint i [[thread_position_in_grid]]) {
    y[i] = x[i];
}
""")
    y = np.zeros(4, np.float32)
    lib.launch("k", {0: y}, threadgroups=(1,), threads_per_threadgroup=(4,))
    np.testing.assert_array_equal(y, 2.0)
    with pytest.raises(softmetal.InvalidUsageError, match=r"buffer\(1\) \(`const float\* x`\) is not bound"):
        lib.launch("uses", {0: y}, threadgroups=(1,), threads_per_threadgroup=(4,))


_SPECIALIZED = """
constant bool use_x [[function_constant(0)]];
template <bool B> static inline void add(device float* y, device const float* b, uint i) {
    if (B) y[i] += b[i];
}
template <bool HasBias>
[[kernel]] void affine(device float* y [[buffer(0)]], device const float* bias [[buffer(1)]],
                       device const float* x [[buffer(2)]], constant int& n [[buffer(3)]],
                       threadgroup float* scratch [[threadgroup(0)]], uint i [[thread_position_in_grid]]) {
    y[i] = 2.0f;
    if constexpr (HasBias) { scratch[i] = bias[i]; y[i] += scratch[i]; }
    add<HasBias>(y, bias, i);
    if (use_x) y[i] += x[i];
}
template [[host_name("affine_plain")]] [[kernel]] decltype(affine<false>) affine<false>;
template [[host_name("affine_bias")]] [[kernel]] decltype(affine<true>) affine<true>;
kernel void runtime_branch(device float* y [[buffer(0)]], device const float* x [[buffer(1)]],
                           constant int& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    y[i] = n > 100 ? x[i] : 1.0f;
}
"""


def test_arguments_inactive_after_specialization_need_not_be_bound():
    # As Metal's reflection after specialization says (MTLArgument.isActive): an argument
    # whose every use a template argument or function constant removes (MLX launches gemv
    # without its bias) may stay unbound; an active one may not, whether or not this
    # dispatch's path reaches it (Metal's validation refuses it on every path).
    lib = softmetal.compile(_SPECIALIZED)
    y = np.zeros(4, np.float32)
    lib.launch("affine_plain", {0: y, 3: struct.pack("i", 4)}, threadgroups=(1,), threads_per_threadgroup=(4,),
               constants={"use_x": False})
    np.testing.assert_array_equal(y, 2.0)
    bias, x = np.arange(4, dtype=np.float32), np.full(4, 10, np.float32)
    lib.launch("affine_plain", {0: y, 2: x, 3: struct.pack("i", 4)}, threadgroups=(1,), threads_per_threadgroup=(4,),
               constants={"use_x": True})
    np.testing.assert_array_equal(y, 12.0)
    # The function constant makes x active: unbound, refused.
    with pytest.raises(softmetal.InvalidUsageError, match=r"kernel affine_plain: buffer\(2\) \(`const float\* x`\) is not bound"):
        lib.launch("affine_plain", {0: y, 3: struct.pack("i", 4)}, threadgroups=(1,), threads_per_threadgroup=(4,),
                   constants={"use_x": True})
    # The template argument makes bias and the threadgroup memory active.
    with pytest.raises(softmetal.InvalidUsageError, match=r"kernel affine_bias: buffer\(1\) \(`const float\* bias`\) is not bound"):
        lib.launch("affine_bias", {0: y, 3: struct.pack("i", 4)}, threadgroups=(1,), threads_per_threadgroup=(4,),
                   threadgroup_memory={0: 16}, constants={"use_x": False})
    with pytest.raises(softmetal.InvalidUsageError, match=r"kernel affine_bias: threadgroup\(0\) .* has no memory"):
        lib.launch("affine_bias", {0: y, 1: bias, 3: struct.pack("i", 4)}, threadgroups=(1,), threads_per_threadgroup=(4,),
                   constants={"use_x": False})
    lib.launch("affine_bias", {0: y, 1: bias, 3: struct.pack("i", 4)}, threadgroups=(1,), threads_per_threadgroup=(4,),
               threadgroup_memory={0: 16}, constants={"use_x": False})
    np.testing.assert_array_equal(y, 2.0 + 2 * bias)
    # A runtime condition keeps the argument active, though this launch never takes the branch.
    with pytest.raises(softmetal.InvalidUsageError, match=r"kernel runtime_branch: buffer\(1\) \(`const float\* x`\) is not bound"):
        lib.launch("runtime_branch", {0: y, 2: struct.pack("i", 4)}, threadgroups=(1,), threads_per_threadgroup=(4,))


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
