// moe_router.metal - the whole router of docs/spec.md ("What one call computes"), in one
// dispatch (moe_router) or, for decode, two (moe_router_gemv, moe_router_topk):
// logits (+ router bias), softmax or sigmoid, selection bias, group-limited top-k,
// renormalisation, scaling, per-expert scale; and the shared expert's gate factor.
// The selection rules are those of TokenRouter (Layer/Routing.swift): ties go to the
// lower expert index, NaN loses, a group scores the sum of its two best members.
#include "moe_kernel_params.h"
#include "moe_common.h"
#include "moe_formats.h"

// Phase 2 of both router kernels: one simdgroup routes one token. `s` holds its logits
// (router bias included; the shared gate's at s[E] when has_shared_gate) and becomes its
// scores; `choice` and `aux` are E floats of threadgroup memory of this token (selection
// scores when has_selection_bias; group scores and flags). Lane l owns experts l, l + 32,
// ... and keeps their "taken" flags as the bits of one register. Writes k ids and weights
// at out_ids / out_weights[token * k ...] and the shared-expert factor of the token.
static inline void moe_route_token(constant moe_router_params& p, threadgroup float* s, threadgroup float* choice,
                                   threadgroup float* aux, device const float* selection_bias,
                                   device const float* per_expert_scale, device int* out_ids,
                                   device float* out_weights, device float* out_shared_factor, uint token, uint lane)
{
    const uint E = p.experts, K = p.top_k;
    threadgroup float* c = p.has_selection_bias != 0 ? choice : s;

    if (p.scoring == MOE_SCORING_SOFTMAX) {
        float m = -INFINITY;
        for (uint e = lane; e < E; e += MOE_SIMD_WIDTH) {
            const float v = s[e];
            if (v > m) m = v;  // NaN never wins, as in TokenRouter
        }
        for (ushort offset = 16; offset > 0; offset >>= 1) {
            const float o = simd_shuffle_xor(m, offset);
            if (o > m) m = o;
        }
        float sum = 0.0f;
        for (uint e = lane; e < E; e += MOE_SIMD_WIDTH) {
            const float v = exp(s[e] - m);
            s[e] = v;
            sum += v;
        }
        const float inverse = 1.0f / simd_sum(sum);
        for (uint e = lane; e < E; e += MOE_SIMD_WIDTH) s[e] *= inverse;
    } else {
        for (uint e = lane; e < E; e += MOE_SIMD_WIDTH) s[e] = 1.0f / (1.0f + exp(-s[e]));
    }
    if (p.has_selection_bias != 0) {
        for (uint e = lane; e < E; e += MOE_SIMD_WIDTH) c[e] = s[e] + selection_bias[e];
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);

    // Bit i of `taken`: expert lane + 32 i is chosen already or in a dropped group.
    uint taken = 0;
    if (p.n_group > 1) {
        const uint G = p.n_group, size = E / G;
        for (uint g = lane; g < G; g += MOE_SIMD_WIDTH) {
            float v0 = 0.0f, v1 = 0.0f;
            uint i0 = MOE_NONE, i1 = MOE_NONE;
            for (uint e = g * size; e < (g + 1) * size; e++) {
                if (moe_beats(c[e], e, v0, i0)) { v0 = c[e]; i0 = e; }
            }
            for (uint e = g * size; e < (g + 1) * size; e++) {
                if (e != i0 && moe_beats(c[e], e, v1, i1)) { v1 = c[e]; i1 = e; }
            }
            aux[g] = size == 1 ? v0 : v0 + v1;
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);
        uint kept = 0;  // bit i: group lane + 32 i is kept
        for (uint pick = 0; pick < p.topk_group; pick++) {
            float bv = 0.0f;
            uint bi = MOE_NONE;
            for (uint g = lane, i = 0; g < G; g += MOE_SIMD_WIDTH, i++) {
                if (((kept >> i) & 1u) == 0 && moe_beats(aux[g], g, bv, bi)) { bv = aux[g]; bi = g; }
            }
            moe_simd_best(bv, bi);
            if (bi != MOE_NONE && bi % MOE_SIMD_WIDTH == lane) kept |= 1u << (bi / MOE_SIMD_WIDTH);
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);
        for (uint g = lane, i = 0; g < G; g += MOE_SIMD_WIDTH, i++) aux[g] = ((kept >> i) & 1u) != 0 ? 1.0f : 0.0f;
        simdgroup_barrier(mem_flags::mem_threadgroup);
        for (uint e = lane, i = 0; e < E; e += MOE_SIMD_WIDTH, i++) {
            if (aux[e / size] == 0.0f) taken |= 1u << i;
        }
    }

    // Top-k: k rounds of a simdgroup arg-max under moe_beats. Lane 0 writes the ids and
    // the unbiased scores, then finishes the weights in slot order like TokenRouter.
    const ulong out = (ulong)token * K;
    float total = 0.0f;
    for (uint j = 0; j < K; j++) {
        float bv = 0.0f;
        uint bi = MOE_NONE;
        for (uint e = lane, i = 0; e < E; e += MOE_SIMD_WIDTH, i++) {
            if (((taken >> i) & 1u) == 0 && moe_beats(c[e], e, bv, bi)) { bv = c[e]; bi = e; }
        }
        moe_simd_best(bv, bi);
        if (bi == MOE_NONE) bi = 0;  // cannot happen for a validated configuration
        if (bi % MOE_SIMD_WIDTH == lane) taken |= 1u << (bi / MOE_SIMD_WIDTH);
        if (lane == 0) {
            const float w = s[bi];
            out_ids[out + j] = int(bi);
            out_weights[out + j] = w;
            total += w;
        }
    }
    if (lane == 0) {
        for (uint j = 0; j < K; j++) {
            float w = out_weights[out + j];
            if (p.norm_topk_prob != 0) w /= total + 1e-20f;
            w *= p.routed_scaling_factor;
            if (p.has_per_expert_scale != 0) w *= per_expert_scale[out_ids[out + j]];
            out_weights[out + j] = w;
        }
        float factor = 1.0f;
        if (p.has_shared_gate != 0) factor = 1.0f / (1.0f + exp(-s[E]));
        out_shared_factor[token] = factor;
    }
}

// Phase 1 of both router kernels for one router row r (an expert's, or the shared gate
// vector as row E) on one simdgroup: acc[t] += row . x_t for the nt tokens at x (rows of
// H floats), lane sums then a simd_sum by the caller. The router weight is read in its
// stored format through the loader L (mlx-lm writes it at 8 bits); the shared gate vector
// is float32. With `norm`, x_t is normalised on the fly, x_t[h] * inverse[t] * (offset +
// norm_weight[h]): the same float operations, so the same bits, as reading the row the
// input norm wrote. Lanes take 8 consecutive elements at a time when rows are a multiple
// of 8 long (always for quantized weights), else single elements.
static inline float moe_router_x(device const float* x, uint h, bool norm, float inverse, float offset,
                                 device const float* norm_weight) {
    return norm ? x[h] * inverse * (offset + norm_weight[h]) : x[h];
}

template <typename L>
static inline void moe_router_dot(constant moe_router_params& p, uint r, device const float* x, uint nt,
                                  device const uchar* w_codes, device const uchar* w_scales,
                                  device const uchar* w_biases, device const float* shared_gate, bool norm,
                                  threadgroup const float* inverse, device const float* norm_weight, uint lane,
                                  thread float* acc)
{
    const uint E = p.experts, H = p.hidden;
    const float offset = p.input_norm_offset;
    const uint full = H % 8 == 0 ? H : 0;
    if (r < E) {
        const moe_wrow w = moe_row(p.weight, w_codes, w_scales, w_biases, nullptr, 0, r, H);
        for (uint h = lane * 8; h < full; h += 8 * MOE_SIMD_WIDTH) {
            float wv[8];
            L::load8(w, h, wv);
            for (uint t = 0; t < MOE_ROUTER_MAX_TOKENS; t++) {
                if (t < nt) {
                    device const float* xt = x + (ulong)t * H + h;
                    if (norm) {
                        const float4 a = *(device const float4*)xt * inverse[t] * (offset + *(device const float4*)(norm_weight + h));
                        const float4 b = *(device const float4*)(xt + 4) * inverse[t] * (offset + *(device const float4*)(norm_weight + h + 4));
                        acc[t] += moe_dot8(wv, a, b);
                    } else {
                        acc[t] += moe_dot8(wv, xt);
                    }
                }
            }
        }
        for (uint h = full + lane; h < H; h += MOE_SIMD_WIDTH) {
            const float wv = L::load1(w, h);
            for (uint t = 0; t < MOE_ROUTER_MAX_TOKENS; t++) {
                if (t < nt) acc[t] += wv * moe_router_x(x + (ulong)t * H, h, norm, norm ? inverse[t] : 0.0f, offset, norm_weight);
            }
        }
    } else {
        for (uint h = lane; h < H; h += MOE_SIMD_WIDTH) {
            const float wv = shared_gate[h];
            for (uint t = 0; t < MOE_ROUTER_MAX_TOKENS; t++) {
                if (t < nt) acc[t] += wv * moe_router_x(x + (ulong)t * H, h, norm, norm ? inverse[t] : 0.0f, offset, norm_weight);
            }
        }
    }
}

// The parameters of both router kernels after the parameter struct.
#define MOE_ROUTER_BUFFERS                                                                       \
    device const float* x [[buffer(MOE_ROUTER_BUF_X)]],                          /* (T, H) */     \
    device const uchar* w_codes [[buffer(MOE_ROUTER_BUF_W)]],                    /* (E, H) */     \
    device const uchar* w_scales [[buffer(MOE_ROUTER_BUF_W_SCALES)]],                             \
    device const uchar* w_biases [[buffer(MOE_ROUTER_BUF_W_BIASES)]],                             \
    device const float* router_bias [[buffer(MOE_ROUTER_BUF_ROUTER_BIAS)]],      /* (E) */        \
    device const float* selection_bias [[buffer(MOE_ROUTER_BUF_SELECTION_BIAS)]], /* (E) */       \
    device const float* per_expert_scale [[buffer(MOE_ROUTER_BUF_EXPERT_SCALE)]], /* (E) */       \
    device const float* shared_gate [[buffer(MOE_ROUTER_BUF_SHARED_GATE)]],      /* (H) */        \
    device int* out_ids [[buffer(MOE_ROUTER_BUF_IDS)]],                          /* (T, k) */     \
    device float* out_weights [[buffer(MOE_ROUTER_BUF_WEIGHTS)]],                /* (T, k) */     \
    device float* out_shared_factor [[buffer(MOE_ROUTER_BUF_SHARED_FACTOR)]],    /* (T) */        \
    device const float* norm_weight [[buffer(MOE_ROUTER_BUF_NORM_WEIGHT)]],      /* (H) */        \
    device float* x_normed [[buffer(MOE_ROUTER_BUF_X_NORMED)]]                   /* (T, H) */

// Grid: ceil(tokens / tokens_per_group) threadgroups of MOE_ROUTER_THREADS threads.
// Phase 0 (has_input_norm): simdgroup t normalises token t's row into x_normed, which
//          phase 1 and every later kernel of the layer read instead of x (no dispatch
//          of its own: the router reads the rows anyway).
// Phase 1: each simdgroup takes router rows (experts, then the shared gate vector) and
//          computes their dot products with all of the group's tokens, so the router
//          weight is read once per group of tokens. The router weight is read in its
//          stored format through the loader L (mlx-lm writes it at 8 bits), like the
//          experts' weights; the shared gate vector is float32.
// Phase 2: simdgroup t routes token t; lane l owns experts l, l + 32, ... and keeps
//          their "taken" flags as the bits of one register.
template <typename L>
[[kernel]] void moe_router(constant moe_router_params& p [[buffer(MOE_ROUTER_BUF_PARAMS)]],
                           MOE_ROUTER_BUFFERS,
                           threadgroup float* tg [[threadgroup(0)]],
                           uint group [[threadgroup_position_in_grid]],
                           uint sg [[simdgroup_index_in_threadgroup]],
                           uint lane [[thread_index_in_simdgroup]])
{
    const uint E = p.experts, H = p.hidden;
    const uint TB = p.tokens_per_group;
    const uint t0 = group * TB;
    if (t0 >= p.tokens) return;
    const uint nt = min(TB, p.tokens - t0);
    const uint stride = p.logit_stride;
    threadgroup float* scores = tg;                  // [TB][stride]: logits, then scores
    threadgroup float* choice_all = tg + TB * stride; // [TB][E]: selection scores
    threadgroup float* aux_all = choice_all + TB * E;  // [TB][E]: group scores and flags

    // Phase 0: the input norm. The whole threadgroup reaches the barrier (the condition
    // is uniform), after which every simdgroup reads every token's normalised row.
    if (p.has_input_norm != 0) {
        for (uint t = sg; t < nt; t += MOE_ROUTER_SIMDGROUPS) {
            device const float* v = x + (ulong)(t0 + t) * H;
            device float* normed = x_normed + (ulong)(t0 + t) * H;
            float sum = 0.0f;
            for (uint h = lane; h < H; h += MOE_SIMD_WIDTH) sum += v[h] * v[h];
            const float inverse = 1.0f / sqrt(simd_sum(sum) / float(H) + p.input_norm_eps);
            for (uint h = lane; h < H; h += MOE_SIMD_WIDTH) {
                normed[h] = v[h] * inverse * (p.input_norm_offset + norm_weight[h]);
            }
        }
        threadgroup_barrier(mem_flags::mem_device);
        x = x_normed;
    }

    // Phase 1: logits.
    const uint rows = E + (p.has_shared_gate != 0 ? 1u : 0u);
    for (uint r = sg; r < rows; r += MOE_ROUTER_SIMDGROUPS) {
        float acc[MOE_ROUTER_MAX_TOKENS];
        for (uint t = 0; t < MOE_ROUTER_MAX_TOKENS; t++) acc[t] = 0.0f;
        moe_router_dot<L>(p, r, x + (ulong)t0 * H, nt, w_codes, w_scales, w_biases, shared_gate, false, tg,
                          norm_weight, lane, acc);
        for (uint t = 0; t < nt; t++) {
            float s = simd_sum(acc[t]);
            if (lane == 0) {
                if (r < E && p.has_router_bias != 0) s += router_bias[r];
                scores[t * stride + r] = s;
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg >= nt) return;

    // Phase 2: token t0 + sg on simdgroup sg.
    moe_route_token(p, scores + sg * stride, choice_all + sg * E, aux_all + sg * E, selection_bias, per_expert_scale,
                    out_ids, out_weights, out_shared_factor, t0 + sg, lane);
}

#define MOE_INSTANTIATE_ROUTER(suffix, ...) \
    template [[host_name("moe_router_" #suffix)]] [[kernel]] \
    decltype(moe_router<moe_fmt_##suffix>) moe_router<moe_fmt_##suffix>;
MOE_SPECIALISATION_ROWS(MOE_INSTANTIATE_ROUTER)

// The decode router (tokens <= MOE_DECODE_MAX_TOKENS): the same routing in two
// dispatches, so that reading the router weight (E x H, the largest read of a decode step
// after the selected experts) is spread over the GPU's cores.
// moe_router_gemv, the logits as a matrix-vector product:
// Grid: ceil(rows / MOE_ROUTER_GEMV_SIMDGROUPS) threadgroups of MOE_ROUTER_GEMV_THREADS
//       threads, rows = E (+ 1: the shared gate vector); every threadgroup takes all tokens.
// Phase 0 (has_input_norm): simdgroup t computes token t's inverse RMS (as moe_router
//          does); each threadgroup writes its share of x_normed, for the later kernels,
//          and phase 1 normalises x on the fly (the same bits as reading x_normed).
// Phase 1: simdgroup sg computes router row group * MOE_ROUTER_GEMV_SIMDGROUPS + sg for
//          every token (the lane order of moe_router, so the same logits bit for bit)
//          and stores the logits in `logits` (T, logit_stride).
// moe_router_topk then routes them. The top-k is a dispatch of its own because the
// threadgroups of one dispatch have no ordering that MSL 3.1 defines: a "last threadgroup
// finishes" hand-off through relaxed atomics and threadgroup_barrier(mem_device) may read
// another threadgroup's logit from before its store (the previous call's). Consecutive
// dispatches of one compute encoder are ordered, on every OS and MSL version.
template <typename L>
[[kernel]] void moe_router_gemv(constant moe_router_params& p [[buffer(MOE_ROUTER_BUF_PARAMS)]],
                                MOE_ROUTER_BUFFERS,
                                device float* logits [[buffer(MOE_ROUTER_BUF_LOGITS)]],  // (T, stride)
                                uint group [[threadgroup_position_in_grid]],
                                uint groups [[threadgroups_per_grid]],
                                uint tid [[thread_index_in_threadgroup]],
                                uint sg [[simdgroup_index_in_threadgroup]],
                                uint lane [[thread_index_in_simdgroup]])
{
    const uint E = p.experts, H = p.hidden;
    const uint nt = min(p.tokens, (uint)MOE_DECODE_MAX_TOKENS);
    const uint stride = p.logit_stride;
    const uint rows = E + (p.has_shared_gate != 0 ? 1u : 0u);
    threadgroup float inverse[MOE_DECODE_MAX_TOKENS];

    // Phase 0: the input norm (MOE_ROUTER_GEMV_SIMDGROUPS >= MOE_DECODE_MAX_TOKENS).
    const bool norm = p.has_input_norm != 0;
    if (norm) {
        if (sg < nt) {
            device const float* v = x + (ulong)sg * H;
            float sum = 0.0f;
            for (uint h = lane; h < H; h += MOE_SIMD_WIDTH) sum += v[h] * v[h];
            const float inv = 1.0f / sqrt(simd_sum(sum) / float(H) + p.input_norm_eps);
            if (lane == 0) inverse[sg] = inv;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        const uint step = groups * MOE_ROUTER_GEMV_THREADS;
        for (uint t = 0; t < nt; t++) {
            for (uint h = group * MOE_ROUTER_GEMV_THREADS + tid; h < H; h += step) {
                x_normed[(ulong)t * H + h] = x[(ulong)t * H + h] * inverse[t] * (p.input_norm_offset + norm_weight[h]);
            }
        }
    }

    // Phase 1: one router row per simdgroup.
    const uint r = group * MOE_ROUTER_GEMV_SIMDGROUPS + sg;
    if (r >= rows) return;
    float acc[MOE_ROUTER_MAX_TOKENS];
    for (uint t = 0; t < MOE_ROUTER_MAX_TOKENS; t++) acc[t] = 0.0f;
    moe_router_dot<L>(p, r, x, nt, w_codes, w_scales, w_biases, shared_gate, norm, inverse, norm_weight, lane, acc);
    for (uint t = 0; t < nt; t++) {
        float s = simd_sum(acc[t]);
        if (lane == 0) {
            if (r < E && p.has_router_bias != 0) s += router_bias[r];
            logits[t * stride + r] = s;
        }
    }
}

#define MOE_INSTANTIATE_ROUTER_GEMV(suffix, ...) \
    template [[host_name("moe_router_gemv_" #suffix)]] [[kernel]] \
    decltype(moe_router_gemv<moe_fmt_##suffix>) moe_router_gemv<moe_fmt_##suffix>;
MOE_SPECIALISATION_ROWS(MOE_INSTANTIATE_ROUTER_GEMV)

// The decode router's second dispatch: the routing of moe_router_gemv's logits, with the
// code of moe_router's phase 2 (format-independent: one instance).
// Grid: T threadgroups of MOE_SIMD_WIDTH threads, one simdgroup per token, so that the
// tokens route on different cores; threadgroup(0): logit_stride + 2 * experts floats.
[[kernel]] void moe_router_topk(constant moe_router_params& p [[buffer(MOE_ROUTER_BUF_PARAMS)]],
                                device const float* logits [[buffer(MOE_ROUTER_BUF_LOGITS)]],                  // (T, stride)
                                device const float* selection_bias [[buffer(MOE_ROUTER_BUF_SELECTION_BIAS)]],  // (E)
                                device const float* per_expert_scale [[buffer(MOE_ROUTER_BUF_EXPERT_SCALE)]], // (E)
                                device int* out_ids [[buffer(MOE_ROUTER_BUF_IDS)]],                            // (T, k)
                                device float* out_weights [[buffer(MOE_ROUTER_BUF_WEIGHTS)]],                  // (T, k)
                                device float* out_shared_factor [[buffer(MOE_ROUTER_BUF_SHARED_FACTOR)]],      // (T)
                                threadgroup float* tg [[threadgroup(0)]],
                                uint token [[threadgroup_position_in_grid]],
                                uint lane [[thread_index_in_simdgroup]])
{
    const uint E = p.experts, stride = p.logit_stride;
    if (token >= p.tokens) return;
    const uint rows = E + (p.has_shared_gate != 0 ? 1u : 0u);
    threadgroup float* scores = tg;              // [stride]: logits, then scores
    threadgroup float* choice = tg + stride;     // [E]: selection scores
    threadgroup float* aux = choice + E;         // [E]: group scores and flags
    for (uint e = lane; e < rows; e += MOE_SIMD_WIDTH) scores[e] = logits[(ulong)token * stride + e];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    moe_route_token(p, scores, choice, aux, selection_bias, per_expert_scale, out_ids, out_weights,
                    out_shared_factor, token, lane);
}
