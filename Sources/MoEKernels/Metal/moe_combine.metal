// moe_combine.metal - the layer's output in the spec's fixed order:
// y[t] = sum_j pair(t, j) (slots in order, each already times its routing weight)
//        + shared(t) (already times its gate factor) + residual[t],
// and with has_next_norm the next layer's RMSNorm of y[t] as well.
// Each output element is summed by one thread, so the order never depends on scheduling;
// no atomics. `out` may be the residual buffer itself (each element is read, then
// written, by the same thread): the multi-layer path updates x in place.
#include "moe_kernel_params.h"
#include "moe_common.h"

static inline float moe_combine_element(constant moe_combine_params& p, device const float* pair_out,
                                        device const float* shared_out, device const float* residual,
                                        device const int* ids, uint t, uint h)
{
    const ulong H = p.hidden;
    device const float* pairs = pair_out + (ulong)t * p.top_k * H + h;
    device const int* pair_ids = ids + (ulong)t * p.top_k;
    // A pair whose expert is not held (moe_held_place) was not computed (its row holds
    // stale scratch): it adds nothing. Held pairs sum in the same order as ever.
    float acc = moe_held_place(pair_ids[0], p.expert_base, p.expert_stride, p.experts) != MOE_NONE ? pairs[0] : 0.0f;
    for (uint j = 1; j < p.top_k; j++) {
        if (moe_held_place(pair_ids[j], p.expert_base, p.expert_stride, p.experts) != MOE_NONE) acc += pairs[j * H];
    }
    const ulong i = (ulong)t * H + h;
    if (p.has_shared != 0) acc += shared_out[i];
    if (p.has_residual != 0) acc += residual[i];
    return acc;
}

// Grid: (ceil(hidden / MOE_COMBINE_THREADS), tokens) threadgroups of MOE_COMBINE_THREADS;
// with has_next_norm (1, tokens): a threadgroup loops over its token's row, reduces the sum
// of squares (simd_sum, then the simdgroups' partial sums in order: deterministic) and
// writes the normed row while it is in cache - the norm costs no dispatch of its own.
kernel void moe_combine(constant moe_combine_params& p [[buffer(MOE_COMBINE_BUF_PARAMS)]],
                        device const float* pair_out [[buffer(MOE_COMBINE_BUF_PAIR_OUT)]],   // (T * k, H)
                        device const float* shared_out [[buffer(MOE_COMBINE_BUF_SHARED_OUT)]],  // (T, H)
                        device const float* residual [[buffer(MOE_COMBINE_BUF_RESIDUAL)]],   // (T, H)
                        device float* out [[buffer(MOE_COMBINE_BUF_OUTPUT)]],   // (T, H)
                        device const float* norm_weight [[buffer(MOE_COMBINE_BUF_NORM_WEIGHT)]],  // (H)
                        device float* normed [[buffer(MOE_COMBINE_BUF_NORMED)]],  // (T, H)
                        device const int* ids [[buffer(MOE_COMBINE_BUF_IDS)]],    // (T * k)
                        uint2 group [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]])
{
    threadgroup float partial[MOE_COMBINE_THREADS / MOE_SIMD_WIDTH];
    const uint t = group.y;
    if (t >= p.tokens) return;
    const ulong row = (ulong)t * p.hidden;
    if (p.has_next_norm == 0) {
        const uint h = group.x * MOE_COMBINE_THREADS + tid;
        if (h < p.hidden) out[row + h] = moe_combine_element(p, pair_out, shared_out, residual, ids, t, h);
        return;
    }
    float sum = 0.0f;
    for (uint h = tid; h < p.hidden; h += MOE_COMBINE_THREADS) {
        const float v = moe_combine_element(p, pair_out, shared_out, residual, ids, t, h);
        out[row + h] = v;
        sum += v * v;
    }
    sum = simd_sum(sum);
    if (lane == 0) partial[sg] = sum;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = 0.0f;
    for (uint s = 0; s < MOE_COMBINE_THREADS / MOE_SIMD_WIDTH; s++) total += partial[s];
    const float inverse = 1.0f / sqrt(total / float(p.hidden) + p.next_norm_eps);
    for (uint h = tid; h < p.hidden; h += MOE_COMBINE_THREADS) {
        normed[row + h] = out[row + h] * inverse * (p.next_norm_offset + norm_weight[h]);
    }
}
