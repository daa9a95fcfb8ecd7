// moe_combine.metal - the layer's output in the spec's fixed order:
// y[t] = sum_j pair(t, j) (slots in order, each already times its routing weight)
//        + shared(t) (already times its gate factor) + residual[t].
// One thread per output element, so the order never depends on scheduling; no atomics.
// `out` may be the residual buffer itself (each element is read, then written, by the
// same thread): the multi-layer path updates x in place.
#include "moe_kernel_params.h"
#include "moe_common.h"

// Grid: (ceil(hidden / MOE_COMBINE_THREADS), tokens) threadgroups of MOE_COMBINE_THREADS.
kernel void moe_combine(constant moe_combine_params& p [[buffer(MOE_COMBINE_BUF_PARAMS)]],
                        device const float* pair_out [[buffer(MOE_COMBINE_BUF_PAIR_OUT)]],   // (T * k, H)
                        device const float* shared_out [[buffer(MOE_COMBINE_BUF_SHARED_OUT)]],  // (T, H)
                        device const float* residual [[buffer(MOE_COMBINE_BUF_RESIDUAL)]],   // (T, H)
                        device float* out [[buffer(MOE_COMBINE_BUF_OUTPUT)]],   // (T, H)
                        uint2 gid [[thread_position_in_grid]])
{
    const uint h = gid.x, t = gid.y;
    if (h >= p.hidden || t >= p.tokens) return;
    const ulong H = p.hidden;
    device const float* pairs = pair_out + (ulong)t * p.top_k * H + h;
    float acc = pairs[0];
    for (uint j = 1; j < p.top_k; j++) acc += pairs[j * H];
    const ulong i = (ulong)t * H + h;
    if (p.has_shared != 0) acc += shared_out[i];
    if (p.has_residual != 0) acc += residual[i];
    out[i] = acc;
}
