// moe_common.h - MSL helpers shared by the kernels (selection order, activations).
// Pasted into the library source like moe_kernel_params.h (see MetalKernels.swift).
#ifndef MOE_COMMON_H
#define MOE_COMMON_H

#include <metal_stdlib>
using namespace metal;

#define MOE_NONE 0xFFFFFFFFu

// The place of expert `id` among the `count` experts a layer holds (ids base, base + stride,
// ...: ExpertShare; stride 0 means 1), or MOE_NONE when it does not hold it: an expert-parallel share's others,
// or an id outside [0, E) that only a caller's routing can hold (encode_routed).
static inline uint moe_held_place(int id, uint base, uint stride, uint count) {
    const uint d = uint(id) - base;
    if (uint(id) < base) return MOE_NONE;
    const uint place = stride <= 1 ? d : (d % stride == 0 ? d / stride : MOE_NONE);  // 0: consecutive, as 1
    return place < count ? place : MOE_NONE;
}

// NaN by its bits, so that the test survives any math mode.
static inline bool moe_is_nan(float v) {
    return (as_type<uint>(v) & 0x7FFFFFFFu) > 0x7F800000u;
}

// The total order of selection (TokenRouter in Routing.swift): a larger value wins,
// NaN loses to every number, equal values (and two NaNs) go to the lower index;
// MOE_NONE (no candidate) loses to everything.
static inline bool moe_beats(float a, uint ia, float b, uint ib) {
    if (ib == MOE_NONE) return ia != MOE_NONE;
    if (ia == MOE_NONE) return false;
    const bool an = moe_is_nan(a), bn = moe_is_nan(b);
    if (an || bn) return bn && (!an || ia < ib);
    return a > b || (a == b && ia < ib);
}

// The best (value, index) of the simdgroup under moe_beats, in every lane. A total
// order, so the butterfly gives the same winner as a sequential scan.
static inline void moe_simd_best(thread float& v, thread uint& i) {
    for (ushort offset = 16; offset > 0; offset >>= 1) {
        const float ov = simd_shuffle_xor(v, offset);
        const uint oi = simd_shuffle_xor(i, offset);
        if (moe_beats(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
}

// erf(x) in float32 for the exact GELU: MSL's math library has no erf. Abramowitz and
// Stegun 7.1.26 (absolute error below 1.5e-7), on |x| with erf's odd symmetry.
static inline float moe_erf(float x) {
    const float a = fabs(x);
    const float t = 1.0f / (1.0f + 0.3275911f * a);
    const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    return copysign(1.0f - poly * exp(-a * a), x);
}

// The gated activations of the spec (GatedActivation in CPU/Activation.swift).
static inline float moe_activate(uint kind, float g, float u, float alpha, float limit) {
    if (kind == MOE_ACTIVATION_SILU) {
        return g / (1.0f + exp(-g)) * u;
    }
    if (kind == MOE_ACTIVATION_GELU_TANH) {
        return 0.5f * g * (1.0f + tanh(0.7978845608f * (g + 0.044715f * g * g * g))) * u;
    }
    if (kind == MOE_ACTIVATION_SWIGLU_OAI) {
        const float gc = min(g, limit);
        const float uc = max(min(u, limit), -limit);
        return gc / (1.0f + exp(-alpha * gc)) * (uc + 1.0f);
    }
    if (kind == MOE_ACTIVATION_GELU) {
        return 0.5f * g * (1.0f + moe_erf(g * 0.70710678f)) * u;
    }
    if (kind == MOE_ACTIVATION_RELU) {
        return max(g, 0.0f) * u;
    }
    if (kind == MOE_ACTIVATION_SWIGLU_CLAMPED) {
        const float gc = min(g, limit);
        return gc / (1.0f + exp(-gc)) * max(min(u, limit), -limit);
    }
    return NAN;  // not an activation: validated on the host, never reached
}

#endif
