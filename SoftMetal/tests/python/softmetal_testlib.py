"""What the feature tests (test_softmetal_threads.py, _types, _arguments, _checks,
_schedules, _templates, _language: one file per feature, once all test_softmetal.py) share:
the purpose-written MSL kernels of the features (FEATURES, which their `lib` fixtures
compile) and of the planted bugs that each check must catch (BUGS, their `bugs` fixtures),
and the bfloat16 and parameter helpers. Not a test module."""

import struct

import numpy as np

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
