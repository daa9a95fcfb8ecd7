// moe_experts.metal - the expert matmuls, routed or shared (moe_ffn_params.mode):
//   gate/up:  a = act(Wg x + bg, Wu x + bu)   (gate rows [0, I), up rows [I, 2I) of one
//             (E, 2I, H) weight; the activation is the epilogue, g and u never reach memory)
//   down:     y = w * (Wd a + bd)             (w: the pair's routing weight, or the shared
//             expert's gate factor; applied in the epilogue)
// Decode (few tokens): matrix-vector kernels that read the expert ids from the router's
// output on the GPU. Prefill: tiled GEMMs over the buckets of moe_bucket.metal.
#include "moe_kernel_params.h"
#include "moe_common.h"

// --- decode: matrix-vector ----------------------------------------------------------
//
// Grid: (ceil(rows / MOE_GEMV_ROWS), pairs) threadgroups of MOE_GEMV_THREADS threads
// (rows = I for gate/up, H for down; pairs = T * k routed, 1 shared). Threadgroup y
// serves pair y's expert for every token that chose it, if y is that expert's first
// pair, and does nothing otherwise: each selected expert's rows are read once. Each
// simdgroup computes one row: lanes stride over the inputs, a simd_sum reduces.

// The rows (pair indices, or tokens for the shared expert) that threadgroup `pair`
// serves, and their expert; 0 when an earlier pair has the same expert.
static inline uint moe_decode_rows(constant moe_ffn_params& p, device const int* ids, uint pair,
                                   thread uint& expert, thread uint* rows)
{
    if (p.mode == MOE_FFN_SHARED) {
        expert = 0;
        const uint n = min(p.tokens, (uint)MOE_DECODE_MAX_TOKENS);
        for (uint i = 0; i < n; i++) rows[i] = i;
        return pair == 0 ? n : 0;
    }
    const uint pairs = p.tokens * p.top_k;
    const int e = ids[pair];
    for (uint q = 0; q < pair; q++) {
        if (ids[q] == e) return 0;
    }
    uint n = 0;
    for (uint q = pair; q < pairs && n < MOE_DECODE_MAX_TOKENS; q++) {
        if (ids[q] == e) rows[n++] = q;
    }
    expert = uint(e);
    return n;
}

kernel void moe_gate_up_gemv(constant moe_ffn_params& p [[buffer(0)]],
                             device const float* x [[buffer(1)]],       // (T, H)
                             device const float* w [[buffer(2)]],       // (E, 2I, H)
                             device const float* bias [[buffer(3)]],    // (E, 2I)
                             device float* act [[buffer(4)]],           // (rows, I)
                             device const int* ids [[buffer(5)]],       // (T * k)
                             uint2 group [[threadgroup_position_in_grid]],
                             uint sg [[simdgroup_index_in_threadgroup]],
                             uint lane [[thread_index_in_simdgroup]])
{
    uint expert = 0;
    uint rows[MOE_DECODE_MAX_TOKENS];
    const uint n = moe_decode_rows(p, ids, group.y, expert, rows);
    const uint H = p.hidden, I = p.inner;
    const uint r = group.x * MOE_GEMV_ROWS + sg;
    if (n == 0 || r >= I) return;
    device const float* wg = w + ((ulong)expert * 2 * I + r) * H;
    device const float* wu = wg + (ulong)I * H;
    device const float* xs[MOE_DECODE_MAX_TOKENS];
    for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) {
        const uint token = p.mode == MOE_FFN_SHARED ? rows[i] : rows[i] / p.top_k;
        xs[i] = x + (ulong)(i < n ? token : 0) * H;
    }
    float g[MOE_DECODE_MAX_TOKENS], u[MOE_DECODE_MAX_TOKENS];
    for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) { g[i] = 0.0f; u[i] = 0.0f; }
    if ((H & 3u) == 0) {
        for (uint h = lane * 4; h < H; h += 4 * MOE_SIMD_WIDTH) {
            const float4 gw = *(device const float4*)(wg + h);
            const float4 uw = *(device const float4*)(wu + h);
            for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) {
                if (i < n) {
                    const float4 xv = *(device const float4*)(xs[i] + h);
                    g[i] += dot(gw, xv);
                    u[i] += dot(uw, xv);
                }
            }
        }
    } else {
        for (uint h = lane; h < H; h += MOE_SIMD_WIDTH) {
            const float gw = wg[h], uw = wu[h];
            for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) {
                if (i < n) {
                    g[i] += gw * xs[i][h];
                    u[i] += uw * xs[i][h];
                }
            }
        }
    }
    for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) {
        if (i < n) {
            float gs = simd_sum(g[i]);
            float us = simd_sum(u[i]);
            if (lane == 0) {
                if (p.has_bias != 0) {
                    gs += bias[(ulong)expert * 2 * I + r];
                    us += bias[(ulong)expert * 2 * I + I + r];
                }
                act[(ulong)rows[i] * I + r] = moe_activate(p.activation, gs, us, p.swiglu_alpha, p.swiglu_limit);
            }
        }
    }
}

kernel void moe_down_gemv(constant moe_ffn_params& p [[buffer(0)]],
                          device const float* act [[buffer(1)]],        // (rows, I)
                          device const float* w [[buffer(2)]],          // (E, H, I)
                          device const float* bias [[buffer(3)]],       // (E, H)
                          device float* out [[buffer(4)]],              // (rows, H)
                          device const int* ids [[buffer(5)]],          // (T * k)
                          device const float* row_weight [[buffer(8)]], // (rows)
                          uint2 group [[threadgroup_position_in_grid]],
                          uint sg [[simdgroup_index_in_threadgroup]],
                          uint lane [[thread_index_in_simdgroup]])
{
    uint expert = 0;
    uint rows[MOE_DECODE_MAX_TOKENS];
    const uint n = moe_decode_rows(p, ids, group.y, expert, rows);
    const uint H = p.hidden, I = p.inner;
    const uint h = group.x * MOE_GEMV_ROWS + sg;
    if (n == 0 || h >= H) return;
    device const float* wd = w + ((ulong)expert * H + h) * I;
    device const float* as[MOE_DECODE_MAX_TOKENS];
    for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) as[i] = act + (ulong)(i < n ? rows[i] : 0) * I;
    float y[MOE_DECODE_MAX_TOKENS];
    for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) y[i] = 0.0f;
    if ((I & 3u) == 0) {
        for (uint k = lane * 4; k < I; k += 4 * MOE_SIMD_WIDTH) {
            const float4 wv = *(device const float4*)(wd + k);
            for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) {
                if (i < n) y[i] += dot(wv, *(device const float4*)(as[i] + k));
            }
        }
    } else {
        for (uint k = lane; k < I; k += MOE_SIMD_WIDTH) {
            const float wv = wd[k];
            for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) {
                if (i < n) y[i] += wv * as[i][k];
            }
        }
    }
    for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) {
        if (i < n) {
            float s = simd_sum(y[i]);
            if (lane == 0) {
                if (p.has_bias != 0) s += bias[(ulong)expert * H + h];
                out[(ulong)rows[i] * H + h] = s * row_weight[rows[i]];
            }
        }
    }
}
