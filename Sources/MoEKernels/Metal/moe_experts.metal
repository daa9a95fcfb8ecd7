// moe_experts.metal - the expert matmuls, routed or shared (moe_ffn_params.mode):
//   gate/up:  a = act(Wg x + bg, Wu x + bu)   (gate rows [0, I), up rows [I, 2I) of one
//             (E, 2I, H) weight; the activation is the epilogue, g and u never reach memory)
//   down:     y = w * (Wd a + bd)             (w: the pair's routing weight, or the shared
//             expert's gate factor; applied in the epilogue)
// Decode (few tokens): matrix-vector kernels that read the expert ids from the router's
// output on the GPU. Prefill: tiled GEMMs over the buckets of moe_bucket.metal.
// Each kernel is a template over the weights' loader (moe_formats.h): the weights stay in
// their stored format and are dequantized in registers (GEMV) or into the threadgroup
// tile (GEMM); instances are named <kernel>_<suffix> (MOE_SPECIALISATION_ROWS). Gate and up
// use one loader: gate and up in two different formats run the `any` instance.
#include "moe_kernel_params.h"
#include "moe_common.h"
#include "moe_formats.h"

// The gate/up epilogue: act = activation(g, u) into `out`, or by p.gate_up_pass only the
// gate product (first of two dispatches), or the activation of the gate product kept there
// and this dispatch's u (second). The same thread reads and writes the element.
static inline void moe_gate_up_store(constant moe_ffn_params& p, float g, float u, device float* out) {
    if (p.gate_up_pass == MOE_GATE_UP_KEEP_GATE) {
        *out = g;
        return;
    }
    if (p.gate_up_pass == MOE_GATE_UP_WITH_KEPT_GATE) g = *out;
    *out = moe_activate(p.activation, g, u, p.swiglu_alpha, p.swiglu_limit);
}

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
            // An expert not held (moe_held_place) selects nothing: its pairs are skipped
            // here and in the combine, never read as an expert past the weights.
            const uint place = moe_held_place(e, p.expert_base, p.expert_stride, p.experts);
            if (!simd_any(seen) && place != MOE_NONE) {
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
                job[1] = place;
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
                                 device const moe_expert_parts* t0 [[buffer(MOE_FFN_BUF_W0_EXPERTS)]],
                                 device const uchar* w1 [[buffer(MOE_FFN_BUF_W1)]],           // up (E, I, H)
                                 device const uchar* s1 [[buffer(MOE_FFN_BUF_W1_SCALES)]],
                                 device const uchar* b1 [[buffer(MOE_FFN_BUF_W1_BIASES)]],
                                 device const moe_expert_parts* t1 [[buffer(MOE_FFN_BUF_W1_EXPERTS)]],
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
        wg[j] = moe_row(p.w0, w0, s0, b0, t0, expert, r, H);
        wu[j] = moe_row(p.w1, w1, s1, b1, t1, expert, r, H);
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
                    moe_gate_up_store(p, gs, us, act + (ulong)rows[i] * I + r);
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
                              device const moe_expert_parts* t0 [[buffer(MOE_FFN_BUF_W0_EXPERTS)]],
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
    for (uint j = 0; j < MOE_GEMV_R; j++) wd[j] = moe_row(p.w0, w0, s0, b0, t0, expert, min(h0 + j, H - 1), I);
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
// simdgroups. Both kernels compute one MOE_GEMM_BM x 64 product tile per threadgroup
// (moe_gemm_product; each simdgroup 16 x 32, 2 x 4 simdgroup_float8x8 accumulators): down
// MOE_GEMM_BM rows x MOE_GEMM_DOWN_BN (64) outputs, gate/up MOE_GEMM_BM rows x
// MOE_GEMM_GATE_UP_BN (32) gate columns next to the same 32 up columns.
// Routed: tile x is tiles[x] of moe_bucket (dispatched indirectly with the count that
// moe_bucket wrote, so every threadgroup has work); its rows are pairs, whose inputs are
// gathered from their tokens' rows. Shared: tile x is tokens [BM x, BM x + BM).
// K advances MOE_GEMM_BK at a time through two threadgroup stages: while the simdgroups
// multiply step s from one, each thread has already loaded step s + 1 from device memory
// into registers, and stores it into the other stage after the multiplies; one barrier
// per step. Interior tiles (all rows, all columns, a full K step, rows a multiple of 8
// long) take vector loads with no bounds checks; edge tiles pad with zeros. The weights are
// dequantized by the loader on their way into threadgroup memory (one load8 per weight row
// and thread per step). The epilogue reads the product tile from threadgroup memory,
// applies bias and activation (gate/up) or bias and routing weight (down), and scatters the
// rows to their pairs.
// Summation order per output element: K steps in increasing order, 8 k at a time per
// simdgroup_multiply_accumulate (as in the earlier single-buffered 32 x 32 kernels).

#define MOE_LDS (MOE_GEMM_BK + 4)
#define MOE_GEMM_BP (2 * MOE_GEMM_GATE_UP_BN)   // weight rows of the product tile: 64
#define MOE_LDC (MOE_GEMM_BP + 4)
// One K step in threadgroup memory: MOE_GEMM_BM input rows, then MOE_GEMM_BP weight rows,
// MOE_LDS floats each; two of them, as float4s. (Named: SoftMetal's translator takes a `*`
// in a threadgroup array's size for a pointer declaration and makes the array thread-private.)
#define MOE_GEMM_STAGE ((MOE_GEMM_BM + MOE_GEMM_BP) * MOE_LDS)
#define MOE_GEMM_SMEM4 (MOE_GEMM_STAGE / 2)
// The loads and the 2 x 2 simdgroup layout below are written for these sizes.
static_assert(MOE_GEMM_BM == 32 && MOE_GEMM_GATE_UP_BN == 32 && MOE_GEMM_DOWN_BN == MOE_GEMM_BP &&
              MOE_GEMM_BK == 32 && MOE_GEMM_THREADS == 128, "moe_experts.metal: GEMM tile sizes");
static_assert(MOE_GEMM_BM * MOE_LDC <= 2 * MOE_GEMM_STAGE, "the product tile fits the stages");

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

// Elements k .. k + 7 of an input row `a` (K long) or (moe_gemm_load_b) of a weight row
// through the loader: vector loads (one load8) inside the row when K % 8 == 0, with no
// check at all in interior tiles; zeros past K or for a row the tile does not have (!ok).
static inline void moe_gemm_load_a(device const float* a, bool ok, uint k, uint K, bool interior, bool vec,
                                   thread float* v)
{
    if (interior || (ok && vec && k < K)) {
        const float4 lo = *(device const float4*)(a + k), hi = *(device const float4*)(a + k + 4);
        for (uint q = 0; q < 4; q++) { v[q] = lo[q]; v[4 + q] = hi[q]; }
        return;
    }
    for (uint q = 0; q < 8; q++) v[q] = ok && k + q < K ? a[k + q] : 0.0f;
}

template <typename L>
static inline void moe_gemm_load_b(moe_wrow w, bool ok, uint k, uint K, bool interior, bool vec, thread float* v) {
    if (interior || (ok && vec && k < K)) {
        L::load8(w, k, v);
        return;
    }
    for (uint q = 0; q < 8; q++) v[q] = ok && k + q < K ? L::load1(w, k + q) : 0.0f;
}

// The product tile C = A W^T (MOE_GEMM_BM x MOE_GEMM_BP, K deep) of one threadgroup, left
// in threadgroup memory at smem[r * MOE_LDC + c]. Thread tid supplies row lr = tid / 4 of
// A (`a`, absent unless a_ok) and weight rows lr (w0) and 32 + lr (w1), elements
// (tid % 4) * 8 ... + 7 of each K step. `full`: every row and weight row exists (with
// K % 8 == 0 this makes every full K step an interior one).
template <typename L>
static inline void moe_gemm_product(threadgroup float* smem, device const float* a, bool a_ok, moe_wrow w0, bool ok0,
                                    moe_wrow w1, bool ok1, uint K, bool full, uint tid, uint sg)
{
    const uint lr = tid / 4, kc = (tid % 4) * 8;
    const bool vec = K % 8 == 0;
    const uint sy = sg / 2, sx = sg % 2;   // rows sy * 16 .. + 16, columns sx * 32 .. + 32
    simdgroup_float8x8 c[2][4];
    for (uint i = 0; i < 2; i++) {
        for (uint j = 0; j < 4; j++) c[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    }
    float va[8], v0[8], v1[8];   // this thread's share of the next K step
    {
        const bool interior = full && vec && MOE_GEMM_BK <= K;
        moe_gemm_load_a(a, a_ok, kc, K, interior, vec, va);
        moe_gemm_load_b<L>(w0, ok0, kc, K, interior, vec, v0);
        moe_gemm_load_b<L>(w1, ok1, kc, K, interior, vec, v1);
    }
    uint stage = 0;
    for (uint k0 = 0; k0 < K; k0 += MOE_GEMM_BK) {
        threadgroup float* As = smem + stage * MOE_GEMM_STAGE;
        threadgroup float* Bs = As + MOE_GEMM_BM * MOE_LDS;
        threadgroup float4* da = (threadgroup float4*)(As + lr * MOE_LDS + kc);
        threadgroup float4* d0 = (threadgroup float4*)(Bs + lr * MOE_LDS + kc);
        threadgroup float4* d1 = (threadgroup float4*)(Bs + (lr + 32) * MOE_LDS + kc);
        da[0] = float4(va[0], va[1], va[2], va[3]);
        da[1] = float4(va[4], va[5], va[6], va[7]);
        d0[0] = float4(v0[0], v0[1], v0[2], v0[3]);
        d0[1] = float4(v0[4], v0[5], v0[6], v0[7]);
        d1[0] = float4(v1[0], v1[1], v1[2], v1[3]);
        d1[1] = float4(v1[4], v1[5], v1[6], v1[7]);
        // Every simdgroup has finished the multiplies of the step before, which read the
        // other stage: after this barrier the next step's stores may go there.
        threadgroup_barrier(mem_flags::mem_threadgroup);
        const uint k1 = k0 + MOE_GEMM_BK;
        if (k1 < K) {   // step k1 into registers while this step multiplies
            const bool interior = full && vec && k1 + MOE_GEMM_BK <= K;
            moe_gemm_load_a(a, a_ok, k1 + kc, K, interior, vec, va);
            moe_gemm_load_b<L>(w0, ok0, k1 + kc, K, interior, vec, v0);
            moe_gemm_load_b<L>(w1, ok1, k1 + kc, K, interior, vec, v1);
        }
        for (uint kk = 0; kk < MOE_GEMM_BK; kk += 8) {
            simdgroup_float8x8 am[2], bm[4];
            for (uint i = 0; i < 2; i++) simdgroup_load(am[i], As + (sy * 16 + i * 8) * MOE_LDS + kk, MOE_LDS);
            for (uint j = 0; j < 4; j++) {
                simdgroup_load(bm[j], Bs + (sx * 32 + j * 8) * MOE_LDS + kk, MOE_LDS, ulong2(0, 0), true);
            }
            for (uint i = 0; i < 2; i++) {
                for (uint j = 0; j < 4; j++) simdgroup_multiply_accumulate(c[i][j], am[i], bm[j], c[i][j]);
            }
        }
        stage ^= 1;
    }
    // Every simdgroup is done with the stages before the product tile overwrites them.
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint i = 0; i < 2; i++) {
        for (uint j = 0; j < 4; j++) {
            simdgroup_store(c[i][j], smem + (sy * 16 + i * 8) * MOE_LDC + sx * 32 + j * 8, MOE_LDC);
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

template <typename L>
[[kernel]] void moe_gate_up_gemm(constant moe_ffn_params& p [[buffer(MOE_FFN_BUF_PARAMS)]],
                                 device const float* x [[buffer(MOE_FFN_BUF_INPUT)]],         // (T, H)
                                 device const uchar* w0 [[buffer(MOE_FFN_BUF_W0)]],           // gate (E, I, H)
                                 device const uchar* s0 [[buffer(MOE_FFN_BUF_W0_SCALES)]],
                                 device const uchar* b0 [[buffer(MOE_FFN_BUF_W0_BIASES)]],
                                 device const moe_expert_parts* t0 [[buffer(MOE_FFN_BUF_W0_EXPERTS)]],
                                 device const uchar* w1 [[buffer(MOE_FFN_BUF_W1)]],           // up (E, I, H)
                                 device const uchar* s1 [[buffer(MOE_FFN_BUF_W1_SCALES)]],
                                 device const uchar* b1 [[buffer(MOE_FFN_BUF_W1_BIASES)]],
                                 device const moe_expert_parts* t1 [[buffer(MOE_FFN_BUF_W1_EXPERTS)]],
                                 device const float* bias [[buffer(MOE_FFN_BUF_BIAS)]],       // (E, 2I)
                                 device float* act [[buffer(MOE_FFN_BUF_OUTPUT)]],            // (rows, I)
                                 device const uint* rows [[buffer(MOE_FFN_BUF_ROWS)]],        // bucket row -> pair
                                 device const uint2* tiles [[buffer(MOE_FFN_BUF_TILES)]],
                                 device const uint* offsets [[buffer(MOE_FFN_BUF_OFFSETS)]],  // (E + 1)
                                 uint2 group [[threadgroup_position_in_grid]],
                                 uint tid [[thread_index_in_threadgroup]],
                                 uint sg [[simdgroup_index_in_threadgroup]])
{
    threadgroup float4 smem4[MOE_GEMM_SMEM4];
    threadgroup float* C = (threadgroup float*)smem4;

    const moe_tile t = moe_gemm_tile(p, tiles, offsets, group.x);
    if (t.count == 0) return;
    const uint H = p.hidden, I = p.inner, n0 = group.y * MOE_GEMM_GATE_UP_BN, lr = tid / 4;
    const bool a_ok = lr < t.count;
    const uint a_row = a_ok ? moe_gemm_row(p, rows, t, lr) : 0;
    device const float* xa = x + (ulong)(p.mode == MOE_FFN_SHARED ? a_row : a_row / p.top_k) * H;
    // Product columns [0, 32): gate rows n0 ...; [32, 64): the same up rows.
    const bool b_ok = n0 + lr < I;
    const moe_wrow wg = moe_row(p.w0, w0, s0, b0, t0, t.expert, b_ok ? n0 + lr : 0, H);
    const moe_wrow wu = moe_row(p.w1, w1, s1, b1, t1, t.expert, b_ok ? n0 + lr : 0, H);
    moe_gemm_product<L>(C, xa, a_ok, wg, b_ok, wu, b_ok, H,
                        t.count == MOE_GEMM_BM && n0 + MOE_GEMM_GATE_UP_BN <= I, tid, sg);
    for (uint i = tid; i < MOE_GEMM_BM * MOE_GEMM_GATE_UP_BN; i += MOE_GEMM_THREADS) {
        const uint r = i / MOE_GEMM_GATE_UP_BN, c = i % MOE_GEMM_GATE_UP_BN, n = n0 + c;
        if (r >= t.count || n >= I) continue;
        float g = C[r * MOE_LDC + c], u = C[r * MOE_LDC + MOE_GEMM_GATE_UP_BN + c];
        if (p.has_bias != 0) {
            g += bias[(ulong)t.expert * 2 * I + n];
            u += bias[(ulong)t.expert * 2 * I + I + n];
        }
        moe_gate_up_store(p, g, u, act + (ulong)moe_gemm_row(p, rows, t, r) * I + n);
    }
}

template <typename L>
[[kernel]] void moe_down_gemm(constant moe_ffn_params& p [[buffer(MOE_FFN_BUF_PARAMS)]],
                              device const float* act [[buffer(MOE_FFN_BUF_INPUT)]],          // (rows, I)
                              device const uchar* w0 [[buffer(MOE_FFN_BUF_W0)]],              // down (E, H, I)
                              device const uchar* s0 [[buffer(MOE_FFN_BUF_W0_SCALES)]],
                              device const uchar* b0 [[buffer(MOE_FFN_BUF_W0_BIASES)]],
                              device const moe_expert_parts* t0 [[buffer(MOE_FFN_BUF_W0_EXPERTS)]],
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
    threadgroup float4 smem4[MOE_GEMM_SMEM4];
    threadgroup float* C = (threadgroup float*)smem4;

    const moe_tile t = moe_gemm_tile(p, tiles, offsets, group.x);
    if (t.count == 0) return;
    const uint H = p.hidden, I = p.inner, n0 = group.y * MOE_GEMM_DOWN_BN, lr = tid / 4;
    const bool a_ok = lr < t.count;
    device const float* aa = act + (ulong)(a_ok ? moe_gemm_row(p, rows, t, lr) : 0) * I;
    // Product columns: down rows n0 ... n0 + 63; this thread loads n0 + lr and n0 + 32 + lr.
    const bool ok0 = n0 + lr < H, ok1 = n0 + 32 + lr < H;
    const moe_wrow wd0 = moe_row(p.w0, w0, s0, b0, t0, t.expert, ok0 ? n0 + lr : 0, I);
    const moe_wrow wd1 = moe_row(p.w0, w0, s0, b0, t0, t.expert, ok1 ? n0 + 32 + lr : 0, I);
    moe_gemm_product<L>(C, aa, a_ok, wd0, ok0, wd1, ok1, I, t.count == MOE_GEMM_BM && n0 + MOE_GEMM_DOWN_BN <= H,
                        tid, sg);
    for (uint i = tid; i < MOE_GEMM_BM * MOE_GEMM_DOWN_BN; i += MOE_GEMM_THREADS) {
        const uint r = i / MOE_GEMM_DOWN_BN, c = i % MOE_GEMM_DOWN_BN, n = n0 + c;
        if (r >= t.count || n >= H) continue;
        float y = C[r * MOE_LDC + c];
        if (p.has_bias != 0) y += bias[(ulong)t.expert * H + n];
        const uint row = moe_gemm_row(p, rows, t, r);
        out[(ulong)row * H + n] = y * row_weight[row];
    }
}

#define MOE_INSTANTIATE_EXPERT_KERNEL(function, suffix) \
    template [[host_name(#function "_" #suffix)]] [[kernel]] \
    decltype(function<moe_fmt_##suffix>) function<moe_fmt_##suffix>;
#define MOE_INSTANTIATE_EXPERTS(suffix, ...) \
    MOE_INSTANTIATE_EXPERT_KERNEL(moe_gate_up_gemv, suffix) \
    MOE_INSTANTIATE_EXPERT_KERNEL(moe_down_gemv, suffix) \
    MOE_INSTANTIATE_EXPERT_KERNEL(moe_gate_up_gemm, suffix) \
    MOE_INSTANTIATE_EXPERT_KERNEL(moe_down_gemm, suffix)
MOE_SPECIALISATION_ROWS(MOE_INSTANTIATE_EXPERTS)
