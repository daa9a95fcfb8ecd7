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
// pair, and does nothing otherwise: each selected expert's rows are read once. Simdgroup
// 0 finds that job (expert, its pairs) once per threadgroup, with simd votes over the
// ids, into threadgroup memory. Each simdgroup then computes MOE_GEMV_ROWS_PER_SIMDGROUP
// consecutive rows for all the job's tokens: per step a lane loads its 8 inputs of each
// token once (float4s, kept in registers for all rows) and 8 weights of each row (one
// load8 per row and matrix: 4 independent loads in flight for down, 8 for gate/up), and
// keeps one accumulator per (row, token[, gate/up]).
// Summation order (unchanged from the one-row-per-simdgroup kernel, so the bits are the
// same): lane l adds the 8-element dot products of its chunks h = 8 l, 8 l + 256, ... in
// increasing order (rows not a multiple of 8 long: single elements h = l, l + 32, ...),
// then simd_sum over the 32 lanes, then the bias.

// The job of threadgroup `pair`: the number of rows it serves (0 when an earlier pair has
// the same expert), the expert, and the rows (pair indices in increasing order, or tokens
// for the shared expert; 0 past n).
struct moe_job {
    uint n;
    uint expert;
    uint rows[MOE_DECODE_MAX_TOKENS];
};

// Simdgroup 0 finds the job and hands it to the others through `job` (threadgroup
// memory: n, expert, rows). Every thread of the threadgroup must call it (a barrier).
static inline moe_job moe_decode_job(constant moe_ffn_params& p, device const int* ids, uint pair,
                                     uint sg, uint lane, threadgroup uint* job)
{
    if (sg == 0) {
        if (p.mode == MOE_FFN_SHARED) {
            const uint n = pair == 0 ? min(p.tokens, (uint)MOE_DECODE_MAX_TOKENS) : 0u;
            if (lane < n) job[2 + lane] = lane;
            if (lane == 0) {
                job[0] = n;
                job[1] = 0;
            }
        } else {
            const uint pairs = p.tokens * p.top_k;
            const int e = ids[pair];
            bool seen = false;
            for (uint q = lane; q < pair; q += MOE_SIMD_WIDTH) seen = seen || ids[q] == e;
            uint n = 0;
            if (!simd_any(seen)) {
                for (uint base = pair; base < pairs && n < MOE_DECODE_MAX_TOKENS; base += MOE_SIMD_WIDTH) {
                    const uint q = base + lane;
                    const uint match = q < pairs && ids[q] == e ? 1u : 0u;
                    const uint at = n + simd_prefix_exclusive_sum(match);
                    if (match != 0 && at < MOE_DECODE_MAX_TOKENS) job[2 + at] = q;
                    n += simd_sum(match);
                }
                n = min(n, (uint)MOE_DECODE_MAX_TOKENS);
            }
            if (lane == 0) {
                job[0] = n;
                job[1] = uint(e);
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    moe_job out;
    out.n = job[0];
    out.expert = out.n != 0 ? job[1] : 0u;
    for (uint i = 0; i < MOE_DECODE_MAX_TOKENS; i++) out.rows[i] = i < out.n ? job[2 + i] : 0u;
    return out;
}

#define MOE_GEMV_R MOE_GEMV_ROWS_PER_SIMDGROUP
#define MOE_GEMV_T MOE_DECODE_MAX_TOKENS
static_assert(MOE_GEMV_ROWS == MOE_GEMV_SIMDGROUPS * MOE_GEMV_ROWS_PER_SIMDGROUP &&
              MOE_GEMV_THREADS == MOE_GEMV_SIMDGROUPS * MOE_SIMD_WIDTH, "moe_experts.metal: GEMV sizes");

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
    threadgroup uint job_tg[2 + MOE_DECODE_MAX_TOKENS];
    const moe_job job = moe_decode_job(p, ids, group.y, sg, lane, job_tg);
    const uint n = job.n, expert = job.expert;
    const uint H = p.hidden, I = p.inner;
    const uint r0 = group.x * MOE_GEMV_ROWS + sg * MOE_GEMV_R;
    if (n == 0 || r0 >= I) return;
    thread const uint* rows = job.rows;
    device const float* xs[MOE_GEMV_T];
    for (uint i = 0; i < MOE_GEMV_T; i++) {
        const uint token = p.mode == MOE_FFN_SHARED ? rows[i] : rows[i] / p.top_k;
        xs[i] = x + (ulong)token * H;
    }
    // Rows past I (the last threadgroup) compute row I - 1 again and are not stored.
    moe_wrow wg[MOE_GEMV_R], wu[MOE_GEMV_R];
    for (uint j = 0; j < MOE_GEMV_R; j++) {
        const uint r = min(r0 + j, I - 1);
        wg[j] = moe_row(p.w0, w0, s0, b0, expert, r, H);
        wu[j] = moe_row(p.w1, w1, s1, b1, expert, r, H);
    }
    float g[MOE_GEMV_R][MOE_GEMV_T], u[MOE_GEMV_R][MOE_GEMV_T];
    for (uint j = 0; j < MOE_GEMV_R; j++) {
        for (uint i = 0; i < MOE_GEMV_T; i++) { g[j][i] = 0.0f; u[j][i] = 0.0f; }
    }
    const uint full = H % 8 == 0 ? H : 0;
    for (uint h = lane * 8; h < full; h += 8 * MOE_SIMD_WIDTH) {
        float4 xa[MOE_GEMV_T], xb[MOE_GEMV_T];
        for (uint i = 0; i < MOE_GEMV_T; i++) {
            xa[i] = i < n ? *(device const float4*)(xs[i] + h) : float4(0.0f);
            xb[i] = i < n ? *(device const float4*)(xs[i] + h + 4) : float4(0.0f);
        }
        float gw[MOE_GEMV_R][8], uw[MOE_GEMV_R][8];
        for (uint j = 0; j < MOE_GEMV_R; j++) {
            L::load8(wg[j], h, gw[j]);
            L::load8(wu[j], h, uw[j]);
        }
        for (uint j = 0; j < MOE_GEMV_R; j++) {
            for (uint i = 0; i < MOE_GEMV_T; i++) {
                if (i < n) {
                    g[j][i] += moe_dot8(gw[j], xa[i], xb[i]);
                    u[j][i] += moe_dot8(uw[j], xa[i], xb[i]);
                }
            }
        }
    }
    for (uint h = full + lane; h < H; h += MOE_SIMD_WIDTH) {
        for (uint j = 0; j < MOE_GEMV_R; j++) {
            const float gw = L::load1(wg[j], h), uw = L::load1(wu[j], h);
            for (uint i = 0; i < MOE_GEMV_T; i++) {
                if (i < n) {
                    g[j][i] += gw * xs[i][h];
                    u[j][i] += uw * xs[i][h];
                }
            }
        }
    }
    for (uint j = 0; j < MOE_GEMV_R; j++) {
        const uint r = r0 + j;
        for (uint i = 0; i < MOE_GEMV_T; i++) {
            if (i < n) {
                float gs = simd_sum(g[j][i]);
                float us = simd_sum(u[j][i]);
                if (lane == 0 && r < I) {
                    if (p.has_bias != 0) {
                        gs += bias[(ulong)expert * 2 * I + r];
                        us += bias[(ulong)expert * 2 * I + I + r];
                    }
                    act[(ulong)rows[i] * I + r] = moe_activate(p.activation, gs, us, p.swiglu_alpha, p.swiglu_limit);
                }
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
    threadgroup uint job_tg[2 + MOE_DECODE_MAX_TOKENS];
    const moe_job job = moe_decode_job(p, ids, group.y, sg, lane, job_tg);
    const uint n = job.n, expert = job.expert;
    const uint H = p.hidden, I = p.inner;
    const uint h0 = group.x * MOE_GEMV_ROWS + sg * MOE_GEMV_R;
    if (n == 0 || h0 >= H) return;
    thread const uint* rows = job.rows;
    device const float* as[MOE_GEMV_T];
    for (uint i = 0; i < MOE_GEMV_T; i++) as[i] = act + (ulong)rows[i] * I;
    moe_wrow wd[MOE_GEMV_R];
    for (uint j = 0; j < MOE_GEMV_R; j++) wd[j] = moe_row(p.w0, w0, s0, b0, expert, min(h0 + j, H - 1), I);
    float y[MOE_GEMV_R][MOE_GEMV_T];
    for (uint j = 0; j < MOE_GEMV_R; j++) {
        for (uint i = 0; i < MOE_GEMV_T; i++) y[j][i] = 0.0f;
    }
    const uint full = I % 8 == 0 ? I : 0;
    for (uint k = lane * 8; k < full; k += 8 * MOE_SIMD_WIDTH) {
        float4 aa[MOE_GEMV_T], ab[MOE_GEMV_T];
        for (uint i = 0; i < MOE_GEMV_T; i++) {
            aa[i] = i < n ? *(device const float4*)(as[i] + k) : float4(0.0f);
            ab[i] = i < n ? *(device const float4*)(as[i] + k + 4) : float4(0.0f);
        }
        float wv[MOE_GEMV_R][8];
        for (uint j = 0; j < MOE_GEMV_R; j++) L::load8(wd[j], k, wv[j]);
        for (uint j = 0; j < MOE_GEMV_R; j++) {
            for (uint i = 0; i < MOE_GEMV_T; i++) {
                if (i < n) y[j][i] += moe_dot8(wv[j], aa[i], ab[i]);
            }
        }
    }
    for (uint k = full + lane; k < I; k += MOE_SIMD_WIDTH) {
        for (uint j = 0; j < MOE_GEMV_R; j++) {
            const float wv = L::load1(wd[j], k);
            for (uint i = 0; i < MOE_GEMV_T; i++) {
                if (i < n) y[j][i] += wv * as[i][k];
            }
        }
    }
    for (uint j = 0; j < MOE_GEMV_R; j++) {
        const uint h = h0 + j;
        for (uint i = 0; i < MOE_GEMV_T; i++) {
            if (i < n) {
                float s = simd_sum(y[j][i]);
                if (lane == 0 && h < H) {
                    if (p.has_bias != 0) s += bias[(ulong)expert * H + h];
                    out[(ulong)rows[i] * H + h] = s * row_weight[rows[i]];
                }
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
