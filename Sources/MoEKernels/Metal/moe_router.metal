// moe_router.metal - the whole router of the README's "What one call computes" in one dispatch:
// logits (+ router bias), softmax or sigmoid, selection bias, group-limited top-k,
// renormalisation, scaling, per-expert scale; and the shared expert's gate factor.
// The selection rules are those of TokenRouter (Layer/Routing.swift): ties go to the
// lower expert index, NaN loses, a group scores the sum of its two best members.
#include "moe_kernel_params.h"
#include "moe_common.h"
#include "moe_formats.h"

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
                           device const float* x [[buffer(MOE_ROUTER_BUF_X)]],                        // (T, H)
                           device const uchar* w_codes [[buffer(MOE_ROUTER_BUF_W)]],                  // (E, H)
                           device const uchar* w_scales [[buffer(MOE_ROUTER_BUF_W_SCALES)]],
                           device const uchar* w_biases [[buffer(MOE_ROUTER_BUF_W_BIASES)]],
                           device const float* router_bias [[buffer(MOE_ROUTER_BUF_ROUTER_BIAS)]],    // (E)
                           device const float* selection_bias [[buffer(MOE_ROUTER_BUF_SELECTION_BIAS)]], // (E)
                           device const float* per_expert_scale [[buffer(MOE_ROUTER_BUF_EXPERT_SCALE)]], // (E)
                           device const float* shared_gate [[buffer(MOE_ROUTER_BUF_SHARED_GATE)]],    // (H)
                           device int* out_ids [[buffer(MOE_ROUTER_BUF_IDS)]],                        // (T, k)
                           device float* out_weights [[buffer(MOE_ROUTER_BUF_WEIGHTS)]],              // (T, k)
                           device float* out_shared_factor [[buffer(MOE_ROUTER_BUF_SHARED_FACTOR)]],  // (T)
                           device const float* norm_weight [[buffer(MOE_ROUTER_BUF_NORM_WEIGHT)]],    // (H)
                           device float* x_normed [[buffer(MOE_ROUTER_BUF_X_NORMED)]],                // (T, H)
                           threadgroup float* tg [[threadgroup(0)]],
                           uint group [[threadgroup_position_in_grid]],
                           uint sg [[simdgroup_index_in_threadgroup]],
                           uint lane [[thread_index_in_simdgroup]])
{
    const uint E = p.experts, H = p.hidden, K = p.top_k;
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
    // Lanes take 8 consecutive elements at a time when rows are a multiple of 8 long
    // (always for quantized weights), else single elements.
    const uint full = H % 8 == 0 ? H : 0;
    for (uint r = sg; r < rows; r += MOE_ROUTER_SIMDGROUPS) {
        float acc[MOE_ROUTER_MAX_TOKENS];
        for (uint t = 0; t < MOE_ROUTER_MAX_TOKENS; t++) acc[t] = 0.0f;
        if (r < E) {
            const moe_wrow w = moe_row(p.weight, w_codes, w_scales, w_biases, 0, r, H);
            for (uint h = lane * 8; h < full; h += 8 * MOE_SIMD_WIDTH) {
                float wv[8];
                L::load8(w, h, wv);
                for (uint t = 0; t < MOE_ROUTER_MAX_TOKENS; t++) {
                    if (t < nt) acc[t] += moe_dot8(wv, x + (ulong)(t0 + t) * H + h);
                }
            }
            for (uint h = full + lane; h < H; h += MOE_SIMD_WIDTH) {
                const float wv = L::load1(w, h);
                for (uint t = 0; t < MOE_ROUTER_MAX_TOKENS; t++) {
                    if (t < nt) acc[t] += wv * x[(ulong)(t0 + t) * H + h];
                }
            }
        } else {
            for (uint h = lane; h < H; h += MOE_SIMD_WIDTH) {
                const float wv = shared_gate[h];
                for (uint t = 0; t < MOE_ROUTER_MAX_TOKENS; t++) {
                    if (t < nt) acc[t] += wv * x[(ulong)(t0 + t) * H + h];
                }
            }
        }
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

    // Phase 2: token t = t0 + sg, on simdgroup sg alone.
    const uint t = sg;
    threadgroup float* s = scores + t * stride;
    threadgroup float* c = p.has_selection_bias != 0 ? choice_all + t * E : s;
    threadgroup float* aux = aux_all + t * E;

    if (p.scoring == 0) {
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
    const ulong out = (ulong)(t0 + t) * K;
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
        out_shared_factor[t0 + t] = factor;
    }
}

#define MOE_INSTANTIATE_ROUTER(name, L) \
    template [[host_name("moe_router_" #name)]] [[kernel]] decltype(moe_router<L>) moe_router<L>;
MOE_FOR_EACH_FORMAT(MOE_INSTANTIATE_ROUTER)
