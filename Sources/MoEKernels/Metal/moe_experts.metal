// moe_experts.metal - the expert matmuls, routed or shared (moe_ffn_params.mode):
//   gate/up:  a = act(Wg x + bg, Wu x + bu)   (gate rows [0, I), up rows [I, 2I) of one
//             (E, 2I, H) weight; the activation is the epilogue, g and u never reach memory)
//   down:     y = w * (Wd a + bd)             (w: the pair's routing weight, or the shared
//             expert's gate factor; applied in the epilogue)
// Decode (few tokens): matrix-vector kernels that read the expert ids from the router's
// output on the GPU. Prefill: tiled GEMMs over the buckets of moe_bucket.metal.
// Each kernel is a template over the weights' loader (moe_formats.h): the weights stay in
// their stored format and are dequantized in registers (GEMV) or into the threadgroup
// tile (GEMM); instances are named <kernel>_<format> (MOE_FOR_EACH_FORMAT). Gate and up
// use one loader: gate and up in two different formats run the `any` instance.
#include "moe_kernel_params.h"
#include "moe_common.h"
#include "moe_formats.h"

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

// Lanes take 8 consecutive weights at a time (one load8) when rows are a multiple of 8
// long - always for quantized weights - and single ones otherwise.
template <typename L>
[[kernel]] void moe_gate_up_gemv(constant moe_ffn_params& p [[buffer(MOE_FFN_BUF_PARAMS)]],
                                 device const float* x [[buffer(MOE_FFN_BUF_INPUT)]],         // (T, H)
                                 device const uchar* w0 [[buffer(MOE_FFN_BUF_W0)]],           // gate (E, I, H)
                                 device const uchar* s0 [[buffer(MOE_FFN_BUF_W0_SCALES)]],
                                 device const uchar* b0 [[buffer(MOE_FFN_BUF_W0_BIASES)]],
                                 device const uchar* w1 [[buffer(MOE_FFN_BUF_W1)]],           // up (E, I, H)
                                 device const uchar* s1 [[buffer(MOE_FFN_BUF_W1_SCALES)]],
                                 device const uchar* b1 [[buffer(MOE_FFN_BUF_W1_BIASES)]],
                                 device const float* bias [[buffer(MOE_FFN_BUF_BIAS)]],       // (E, 2I)
                                 device float* act [[buffer(MOE_FFN_BUF_OUTPUT)]],            // (rows, I)
                                 device const int* ids [[buffer(MOE_FFN_BUF_IDS)]],           // (T * k)
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
    const moe_wrow wg = moe_row(p.w0, w0, s0, b0, expert, r, H);
    const moe_wrow wu = moe_row(p.w1, w1, s1, b1, expert, r, H);
    device const float* xs[MOE_DECODE_MAX_TOKENS];
    for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) {
        const uint token = p.mode == MOE_FFN_SHARED ? rows[i] : rows[i] / p.top_k;
        xs[i] = x + (ulong)(i < n ? token : 0) * H;
    }
    float g[MOE_DECODE_MAX_TOKENS], u[MOE_DECODE_MAX_TOKENS];
    for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) { g[i] = 0.0f; u[i] = 0.0f; }
    const uint full = H % 8 == 0 ? H : 0;
    for (uint h = lane * 8; h < full; h += 8 * MOE_SIMD_WIDTH) {
        float gw[8], uw[8];
        L::load8(wg, h, gw);
        L::load8(wu, h, uw);
        for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) {
            if (i < n) {
                g[i] += moe_dot8(gw, xs[i] + h);
                u[i] += moe_dot8(uw, xs[i] + h);
            }
        }
    }
    for (uint h = full + lane; h < H; h += MOE_SIMD_WIDTH) {
        const float gw = L::load1(wg, h), uw = L::load1(wu, h);
        for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) {
            if (i < n) {
                g[i] += gw * xs[i][h];
                u[i] += uw * xs[i][h];
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

template <typename L>
[[kernel]] void moe_down_gemv(constant moe_ffn_params& p [[buffer(MOE_FFN_BUF_PARAMS)]],
                              device const float* act [[buffer(MOE_FFN_BUF_INPUT)]],          // (rows, I)
                              device const uchar* w0 [[buffer(MOE_FFN_BUF_W0)]],              // down (E, H, I)
                              device const uchar* s0 [[buffer(MOE_FFN_BUF_W0_SCALES)]],
                              device const uchar* b0 [[buffer(MOE_FFN_BUF_W0_BIASES)]],
                              device const float* bias [[buffer(MOE_FFN_BUF_BIAS)]],          // (E, H)
                              device float* out [[buffer(MOE_FFN_BUF_OUTPUT)]],               // (rows, H)
                              device const int* ids [[buffer(MOE_FFN_BUF_IDS)]],              // (T * k)
                              device const float* row_weight [[buffer(MOE_FFN_BUF_ROW_WEIGHT)]], // (rows)
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
    const moe_wrow wd = moe_row(p.w0, w0, s0, b0, expert, h, I);
    device const float* as[MOE_DECODE_MAX_TOKENS];
    for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) as[i] = act + (ulong)(i < n ? rows[i] : 0) * I;
    float y[MOE_DECODE_MAX_TOKENS];
    for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) y[i] = 0.0f;
    const uint full = I % 8 == 0 ? I : 0;
    for (uint k = lane * 8; k < full; k += 8 * MOE_SIMD_WIDTH) {
        float wv[8];
        L::load8(wd, k, wv);
        for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) {
            if (i < n) y[i] += moe_dot8(wv, as[i] + k);
        }
    }
    for (uint k = full + lane; k < I; k += MOE_SIMD_WIDTH) {
        const float wv = L::load1(wd, k);
        for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) {
            if (i < n) y[i] += wv * as[i][k];
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

// --- prefill: tiled GEMM with simdgroup matrices --------------------------------------
//
// Grid: (tiles, column tiles) threadgroups of MOE_GEMM_THREADS threads = 2 x 2
// simdgroups, each owning 16 x 16 of the MOE_GEMM_BM x MOE_GEMM_BN output tile.
// Routed: tile x is tiles[x] of moe_bucket (dispatched indirectly with the count that
// moe_bucket wrote, so every threadgroup has work); its rows are pairs, whose inputs are
// gathered from their tokens' rows. Shared: tile x is tokens [BM x, BM x + BM).
// K advances MOE_GEMM_BK at a time through zero-padded threadgroup tiles; the epilogue
// stores the accumulators to threadgroup memory, applies bias and activation (gate/up) or
// bias and routing weight (down), and scatters the rows to their pairs.

#define MOE_LDS (MOE_GEMM_BK + 4)
// Threadgroup tile sizes in floats. (Named: SoftMetal's translator takes a `*` in a
// threadgroup array's size for a pointer declaration and makes the array thread-private.)
#define MOE_GATE_UP_SMEM (3 * MOE_GEMM_BM * MOE_LDS)
#define MOE_DOWN_SMEM (2 * MOE_GEMM_BM * MOE_LDS)
// The loads and the 2 x 2 simdgroup layout below are written for these sizes.
static_assert(MOE_GEMM_BM == 32 && MOE_GEMM_BN == 32 && MOE_GEMM_BK == 32 && MOE_GEMM_THREADS == 128,
              "moe_experts.metal: GEMM tile sizes");

struct moe_tile {
    uint expert;
    uint first;   // first bucket row (routed) or token (shared)
    uint count;   // rows in the tile
};

static inline moe_tile moe_gemm_tile(constant moe_ffn_params& p, device const uint2* tiles,
                                     device const uint* offsets, uint x)
{
    moe_tile t;
    if (p.mode == MOE_FFN_SHARED) {
        t.expert = 0;
        t.first = x * MOE_GEMM_BM;
        t.count = t.first < p.tokens ? min((uint)MOE_GEMM_BM, p.tokens - t.first) : 0;
    } else {
        const uint2 v = tiles[x];
        t.expert = v.x;
        t.first = v.y;
        t.count = min((uint)MOE_GEMM_BM, offsets[v.x + 1] - v.y);
    }
    return t;
}

// The output row (pair, or token for the shared expert) of tile row i.
static inline uint moe_gemm_row(constant moe_ffn_params& p, device const uint* rows, moe_tile t, uint i) {
    return p.mode == MOE_FFN_SHARED ? t.first + i : rows[t.first + i];
}

// The B tiles (weights) are dequantized by the loader as they are stored into threadgroup
// memory: thread tid takes 8 consecutive k of one row, exactly one load8.
template <typename L>
[[kernel]] void moe_gate_up_gemm(constant moe_ffn_params& p [[buffer(MOE_FFN_BUF_PARAMS)]],
                                 device const float* x [[buffer(MOE_FFN_BUF_INPUT)]],         // (T, H)
                                 device const uchar* w0 [[buffer(MOE_FFN_BUF_W0)]],           // gate (E, I, H)
                                 device const uchar* s0 [[buffer(MOE_FFN_BUF_W0_SCALES)]],
                                 device const uchar* b0 [[buffer(MOE_FFN_BUF_W0_BIASES)]],
                                 device const uchar* w1 [[buffer(MOE_FFN_BUF_W1)]],           // up (E, I, H)
                                 device const uchar* s1 [[buffer(MOE_FFN_BUF_W1_SCALES)]],
                                 device const uchar* b1 [[buffer(MOE_FFN_BUF_W1_BIASES)]],
                                 device const float* bias [[buffer(MOE_FFN_BUF_BIAS)]],       // (E, 2I)
                                 device float* act [[buffer(MOE_FFN_BUF_OUTPUT)]],            // (rows, I)
                                 device const uint* rows [[buffer(MOE_FFN_BUF_ROWS)]],        // bucket row -> pair
                                 device const uint2* tiles [[buffer(MOE_FFN_BUF_TILES)]],
                                 device const uint* offsets [[buffer(MOE_FFN_BUF_OFFSETS)]],  // (E + 1)
                                 uint2 group [[threadgroup_position_in_grid]],
                                 uint tid [[thread_index_in_threadgroup]],
                                 uint sg [[simdgroup_index_in_threadgroup]])
{
    threadgroup float smem[MOE_GATE_UP_SMEM];
    threadgroup float* As = smem;
    threadgroup float* Bg = smem + MOE_GEMM_BM * MOE_LDS;
    threadgroup float* Bu = Bg + MOE_GEMM_BN * MOE_LDS;

    const moe_tile t = moe_gemm_tile(p, tiles, offsets, group.x);
    if (t.count == 0) return;
    const uint H = p.hidden, I = p.inner, n0 = group.y * MOE_GEMM_BN;
    // Loads: thread tid fills row tid / 4 of each tile, 8 consecutive k from (tid % 4) * 8.
    const uint lr = tid / 4, kc = (tid % 4) * 8;
    const bool a_ok = lr < t.count;
    const uint a_row = a_ok ? moe_gemm_row(p, rows, t, lr) : 0;
    device const float* xa = x + (ulong)(p.mode == MOE_FFN_SHARED ? a_row : a_row / p.top_k) * H;
    const bool b_ok = n0 + lr < I;
    const moe_wrow wg = moe_row(p.w0, w0, s0, b0, t.expert, b_ok ? n0 + lr : 0, H);
    const moe_wrow wu = moe_row(p.w1, w1, s1, b1, t.expert, b_ok ? n0 + lr : 0, H);
    const bool vec = H % 8 == 0;

    const uint sy = sg / 2, sx = sg % 2;
    simdgroup_float8x8 g00 = make_filled_simdgroup_matrix<float, 8, 8>(0.0f), g01 = g00, g10 = g00, g11 = g00;
    simdgroup_float8x8 u00 = g00, u01 = g00, u10 = g00, u11 = g00;
    for (uint k0 = 0; k0 < H; k0 += MOE_GEMM_BK) {
        float gv[8], uv[8];
        if (b_ok && vec && k0 + kc < H) {
            L::load8(wg, k0 + kc, gv);
            L::load8(wu, k0 + kc, uv);
        } else {
            for (uint q = 0; q < 8; q++) {
                const bool in = b_ok && k0 + kc + q < H;
                gv[q] = in ? L::load1(wg, k0 + kc + q) : 0.0f;
                uv[q] = in ? L::load1(wu, k0 + kc + q) : 0.0f;
            }
        }
        for (uint q = 0; q < 8; q++) {
            const uint k = k0 + kc + q;
            As[lr * MOE_LDS + kc + q] = a_ok && k < H ? xa[k] : 0.0f;
            Bg[lr * MOE_LDS + kc + q] = gv[q];
            Bu[lr * MOE_LDS + kc + q] = uv[q];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint kk = 0; kk < MOE_GEMM_BK; kk += 8) {
            simdgroup_float8x8 a0, a1, b0, b1;
            simdgroup_load(a0, As + (sy * 16) * MOE_LDS + kk, MOE_LDS);
            simdgroup_load(a1, As + (sy * 16 + 8) * MOE_LDS + kk, MOE_LDS);
            simdgroup_load(b0, Bg + (sx * 16) * MOE_LDS + kk, MOE_LDS, ulong2(0, 0), true);
            simdgroup_load(b1, Bg + (sx * 16 + 8) * MOE_LDS + kk, MOE_LDS, ulong2(0, 0), true);
            simdgroup_multiply_accumulate(g00, a0, b0, g00);
            simdgroup_multiply_accumulate(g01, a0, b1, g01);
            simdgroup_multiply_accumulate(g10, a1, b0, g10);
            simdgroup_multiply_accumulate(g11, a1, b1, g11);
            simdgroup_load(b0, Bu + (sx * 16) * MOE_LDS + kk, MOE_LDS, ulong2(0, 0), true);
            simdgroup_load(b1, Bu + (sx * 16 + 8) * MOE_LDS + kk, MOE_LDS, ulong2(0, 0), true);
            simdgroup_multiply_accumulate(u00, a0, b0, u00);
            simdgroup_multiply_accumulate(u01, a0, b1, u01);
            simdgroup_multiply_accumulate(u10, a1, b0, u10);
            simdgroup_multiply_accumulate(u11, a1, b1, u11);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }

    threadgroup float* Cg = smem;
    threadgroup float* Cu = smem + MOE_GEMM_BM * MOE_LDS;
    threadgroup float* cg = Cg + (sy * 16) * MOE_LDS + sx * 16;
    threadgroup float* cu = Cu + (sy * 16) * MOE_LDS + sx * 16;
    simdgroup_store(g00, cg, MOE_LDS);
    simdgroup_store(g01, cg + 8, MOE_LDS);
    simdgroup_store(g10, cg + 8 * MOE_LDS, MOE_LDS);
    simdgroup_store(g11, cg + 8 * MOE_LDS + 8, MOE_LDS);
    simdgroup_store(u00, cu, MOE_LDS);
    simdgroup_store(u01, cu + 8, MOE_LDS);
    simdgroup_store(u10, cu + 8 * MOE_LDS, MOE_LDS);
    simdgroup_store(u11, cu + 8 * MOE_LDS + 8, MOE_LDS);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint i = tid; i < MOE_GEMM_BM * MOE_GEMM_BN; i += MOE_GEMM_THREADS) {
        const uint r = i / MOE_GEMM_BN, n = n0 + i % MOE_GEMM_BN;
        if (r >= t.count || n >= I) continue;
        float g = Cg[r * MOE_LDS + n - n0], u = Cu[r * MOE_LDS + n - n0];
        if (p.has_bias != 0) {
            g += bias[(ulong)t.expert * 2 * I + n];
            u += bias[(ulong)t.expert * 2 * I + I + n];
        }
        act[(ulong)moe_gemm_row(p, rows, t, r) * I + n] = moe_activate(p.activation, g, u, p.swiglu_alpha, p.swiglu_limit);
    }
}

template <typename L>
[[kernel]] void moe_down_gemm(constant moe_ffn_params& p [[buffer(MOE_FFN_BUF_PARAMS)]],
                              device const float* act [[buffer(MOE_FFN_BUF_INPUT)]],          // (rows, I)
                              device const uchar* w0 [[buffer(MOE_FFN_BUF_W0)]],              // down (E, H, I)
                              device const uchar* s0 [[buffer(MOE_FFN_BUF_W0_SCALES)]],
                              device const uchar* b0 [[buffer(MOE_FFN_BUF_W0_BIASES)]],
                              device const float* bias [[buffer(MOE_FFN_BUF_BIAS)]],          // (E, H)
                              device float* out [[buffer(MOE_FFN_BUF_OUTPUT)]],               // (rows, H)
                              device const uint* rows [[buffer(MOE_FFN_BUF_ROWS)]],
                              device const uint2* tiles [[buffer(MOE_FFN_BUF_TILES)]],
                              device const uint* offsets [[buffer(MOE_FFN_BUF_OFFSETS)]],
                              device const float* row_weight [[buffer(MOE_FFN_BUF_ROW_WEIGHT)]], // (rows)
                              uint2 group [[threadgroup_position_in_grid]],
                              uint tid [[thread_index_in_threadgroup]],
                              uint sg [[simdgroup_index_in_threadgroup]])
{
    threadgroup float smem[MOE_DOWN_SMEM];
    threadgroup float* As = smem;
    threadgroup float* Bs = smem + MOE_GEMM_BM * MOE_LDS;

    const moe_tile t = moe_gemm_tile(p, tiles, offsets, group.x);
    if (t.count == 0) return;
    const uint H = p.hidden, I = p.inner, n0 = group.y * MOE_GEMM_BN;
    const uint lr = tid / 4, kc = (tid % 4) * 8;
    const bool a_ok = lr < t.count;
    device const float* aa = act + (ulong)(a_ok ? moe_gemm_row(p, rows, t, lr) : 0) * I;
    const bool b_ok = n0 + lr < H;
    const moe_wrow wd = moe_row(p.w0, w0, s0, b0, t.expert, b_ok ? n0 + lr : 0, I);
    const bool vec = I % 8 == 0;

    const uint sy = sg / 2, sx = sg % 2;
    simdgroup_float8x8 c00 = make_filled_simdgroup_matrix<float, 8, 8>(0.0f), c01 = c00, c10 = c00, c11 = c00;
    for (uint k0 = 0; k0 < I; k0 += MOE_GEMM_BK) {
        float wv[8];
        if (b_ok && vec && k0 + kc < I) {
            L::load8(wd, k0 + kc, wv);
        } else {
            for (uint q = 0; q < 8; q++) wv[q] = b_ok && k0 + kc + q < I ? L::load1(wd, k0 + kc + q) : 0.0f;
        }
        for (uint q = 0; q < 8; q++) {
            const uint k = k0 + kc + q;
            As[lr * MOE_LDS + kc + q] = a_ok && k < I ? aa[k] : 0.0f;
            Bs[lr * MOE_LDS + kc + q] = wv[q];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint kk = 0; kk < MOE_GEMM_BK; kk += 8) {
            simdgroup_float8x8 a0, a1, b0, b1;
            simdgroup_load(a0, As + (sy * 16) * MOE_LDS + kk, MOE_LDS);
            simdgroup_load(a1, As + (sy * 16 + 8) * MOE_LDS + kk, MOE_LDS);
            simdgroup_load(b0, Bs + (sx * 16) * MOE_LDS + kk, MOE_LDS, ulong2(0, 0), true);
            simdgroup_load(b1, Bs + (sx * 16 + 8) * MOE_LDS + kk, MOE_LDS, ulong2(0, 0), true);
            simdgroup_multiply_accumulate(c00, a0, b0, c00);
            simdgroup_multiply_accumulate(c01, a0, b1, c01);
            simdgroup_multiply_accumulate(c10, a1, b0, c10);
            simdgroup_multiply_accumulate(c11, a1, b1, c11);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }

    threadgroup float* C = smem;
    threadgroup float* c = C + (sy * 16) * MOE_LDS + sx * 16;
    simdgroup_store(c00, c, MOE_LDS);
    simdgroup_store(c01, c + 8, MOE_LDS);
    simdgroup_store(c10, c + 8 * MOE_LDS, MOE_LDS);
    simdgroup_store(c11, c + 8 * MOE_LDS + 8, MOE_LDS);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint i = tid; i < MOE_GEMM_BM * MOE_GEMM_BN; i += MOE_GEMM_THREADS) {
        const uint r = i / MOE_GEMM_BN, n = n0 + i % MOE_GEMM_BN;
        if (r >= t.count || n >= H) continue;
        float y = C[r * MOE_LDS + n - n0];
        if (p.has_bias != 0) y += bias[(ulong)t.expert * H + n];
        const uint row = moe_gemm_row(p, rows, t, r);
        out[(ulong)row * H + n] = y * row_weight[row];
    }
}

#define MOE_INSTANTIATE_EXPERTS(name, L) \
    template [[host_name("moe_gate_up_gemv_" #name)]] [[kernel]] decltype(moe_gate_up_gemv<L>) moe_gate_up_gemv<L>; \
    template [[host_name("moe_down_gemv_" #name)]] [[kernel]] decltype(moe_down_gemv<L>) moe_down_gemv<L>; \
    template [[host_name("moe_gate_up_gemm_" #name)]] [[kernel]] decltype(moe_gate_up_gemm<L>) moe_gate_up_gemm<L>; \
    template [[host_name("moe_down_gemm_" #name)]] [[kernel]] decltype(moe_down_gemm<L>) moe_down_gemm<L>;
MOE_FOR_EACH_FORMAT(MOE_INSTANTIATE_EXPERTS)
