// moe_formats.h - weight formats as the kernels read them: one "loader" type per format,
// so that each kernel that reads weights is written once, as a template over its loader,
// and instantiated per format under a [[host_name]] (MOE_SPECIALISATION_ROWS), the way
// MLX's quantized.h does. Weights stay in their stored format in device memory; a loader
// turns 8 consecutive elements of one row into floats in registers, right before their
// multiply-adds (GEMV) or their store into a threadgroup tile (GEMM).
//
// Semantics: Sources/CMoECPU/include/moe_cpu_formats.h (element i of a row):
//   dense:  the stored float32 / float16 / bfloat16 value;
//   affine: fma(scale[g], q_i, bias[g]), g = i >> group_shift, q_i the `bits`-bit unsigned
//           code at bits [i * bits, (i + 1) * bits) of the row's little-endian bit stream;
//   mxfp4:  e2m1(code_i) * 2^(scale[g] - 127), g = i / 32, codes lowest nibble first,
//           E8M0 byte scales (255 is NaN).
// A loader has two static functions over a moe_wrow (one row, see moe_row):
//   load8(row, k, v): v[0..8) = elements k .. k + 7, k % 8 == 0 and k + 8 <= cols.
//     Eight elements of `bits` bits are exactly `bits` bytes, which start on a byte (and
//     lie in one quantization group, groups being multiples of 32): no format needs a
//     read that straddles two chunks.
//   load1(row, k): element k alone. Only dense rows whose length is not a multiple of 8
//     take this path (quantized rows are multiples of 32); quantized loaders answer it
//     through load8 so that every instance compiles.
#ifndef MOE_FORMATS_H
#define MOE_FORMATS_H

#include "moe_kernel_params.h"
#include <metal_stdlib>
using namespace metal;

// One row of one weight matrix, with the description fields that runtime-dispatched
// loaders need (group size and scale type are always per dispatch: they change which
// scale an element uses, not how codes are unpacked).
struct moe_wrow {
    device const uchar* w;   // the row's codes (or dense values)
    device const uchar* s;   // its scales
    device const uchar* b;   // its biases (affine)
    uint format;
    uint bits;
    uint group_shift;
    uint scale_type;
};

// Row r of expert `expert` of a matrix with `cols` columns (moe_weight_desc).
static inline moe_wrow moe_row(constant moe_weight_desc& d, device const uchar* w, device const uchar* s,
                               device const uchar* b, uint expert, uint r, uint cols)
{
    const ulong row = (ulong)expert * d.rows_per_expert + d.row_offset + r;
    const uint scale_size = d.format == MOE_FORMAT_MXFP4 ? 1u : (d.scale_type == MOE_DTYPE_F32 ? 4u : 2u);
    const ulong scale_offset = row * (cols >> d.group_shift) * scale_size;
    moe_wrow out;
    out.w = w + row * ((ulong)cols * d.bits / 8);   // whole bytes: dense bits >= 16, quantized cols % 32 == 0
    out.s = s + scale_offset;
    out.b = b + scale_offset;
    out.format = d.format;
    out.bits = d.bits;
    out.group_shift = d.group_shift;
    out.scale_type = d.scale_type;
    return out;
}

static inline float moe_bf16(ushort v) { return as_type<float>(uint(v) << 16); }

// Scale or bias i of an affine row, of element type `type` (MOE_DTYPE_*).
static inline float moe_scalar(device const uchar* p, uint i, uint type) {
    if (type == MOE_DTYPE_F32) return ((device const float*)p)[i];
    if (type == MOE_DTYPE_F16) return float(((device const half*)p)[i]);
    return moe_bf16(((device const ushort*)p)[i]);
}

struct moe_fmt_f32 {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        device const float4* p = (device const float4*)(r.w) + k / 4;
        const float4 a = p[0], b = p[1];
        for (uint i = 0; i < 4; i++) { v[i] = a[i]; v[4 + i] = b[i]; }
    }
    static inline float load1(moe_wrow r, uint k) { return ((device const float*)r.w)[k]; }
};

struct moe_fmt_f16 {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        device const half4* p = (device const half4*)(r.w) + k / 4;
        const half4 a = p[0], b = p[1];
        for (uint i = 0; i < 4; i++) { v[i] = float(a[i]); v[4 + i] = float(b[i]); }
    }
    static inline float load1(moe_wrow r, uint k) { return float(((device const half*)r.w)[k]); }
};

// bfloat16 by its bits (exact), so that no `bfloat` type (MSL 3.1) is needed.
struct moe_fmt_bf16 {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        device const ushort4* p = (device const ushort4*)(r.w) + k / 4;
        const ushort4 a = p[0], b = p[1];
        for (uint i = 0; i < 4; i++) { v[i] = moe_bf16(a[i]); v[4 + i] = moe_bf16(b[i]); }
    }
    static inline float load1(moe_wrow r, uint k) { return moe_bf16(((device const ushort*)r.w)[k]); }
};

// The 8 codes of `bits` bits in the `bits` bytes at p, as two 32-bit words of 4 codes:
// the second half starts at bit 4 * bits, i.e. byte bits / 2, shifted by 4 when bits is
// odd. No 64-bit arithmetic (slow on GPUs); 4 and 8 bits read aligned words.
template <uint BITS>
static inline void moe_unpack8(device const uchar* p, uint bits, thread uint* q) {
    uint lo = 0, hi = 0;
    if (BITS == 4) {
        lo = *(device const uint*)p;
        hi = lo >> 16;
    } else if (BITS == 8) {
        const uint2 v = *(device const uint2*)p;
        lo = v.x;
        hi = v.y;
    } else {
        for (uint j = 0; j < (bits + 1) / 2; j++) lo |= uint(p[j]) << (8 * j);
        for (uint j = bits / 2; j < bits; j++) hi |= uint(p[j]) << (8 * (j - bits / 2));
        hi >>= 4 * (bits & 1);
    }
    const uint mask = (1u << bits) - 1;
    for (uint i = 0; i < 4; i++) {
        q[i] = (lo >> (i * bits)) & mask;
        q[4 + i] = (hi >> (i * bits)) & mask;
    }
}

// MLX's affine quantization. BITS is a template parameter for the widths that have their
// own kernels (4 and 8: mlx-lm's experts and router); BITS = 0 reads the width from the
// row, for 2, 3, 5 and 6 bits (one instance serves them all; see moe_fmt_any).
template <uint BITS>
struct moe_fmt_affine {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        const uint bits = BITS != 0 ? BITS : r.bits;
        const uint g = k >> r.group_shift;
        const float s = moe_scalar(r.s, g, r.scale_type), b = moe_scalar(r.b, g, r.scale_type);
        uint q[8];
        moe_unpack8<BITS>(r.w + (k / 8) * bits, bits, q);
        for (uint i = 0; i < 8; i++) v[i] = fma(s, float(q[i]), b);
    }
    static inline float load1(moe_wrow r, uint k) {
        float v[8];
        load8(r, k & ~7u, v);
        return v[k & 7];
    }
};

// E2M1 values by code; E8M0 scales as powers of two.
constant float moe_e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static inline float moe_e8m0(uint s) {
    if (s == 255) return as_type<float>(0x7FC00000u);   // NaN
    if (s == 0) return as_type<float>(0x00400000u);     // 2^-127, a subnormal
    return as_type<float>(s << 23);
}

struct moe_fmt_mxfp4 {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        const uint c = *(device const uint*)(r.w + k / 2);
        const float s = moe_e8m0(r.s[k >> 5]);
        for (uint i = 0; i < 8; i++) v[i] = moe_e2m1[(c >> (4 * i)) & 15u] * s;   // exact product
    }
    static inline float load1(moe_wrow r, uint k) {
        float v[8];
        load8(r, k & ~7u, v);
        return v[k & 7];
    }
};

// Any format, chosen per dispatch from the row's description: the instance for rare
// affine widths (2, 3, 5, 6 bits) and for gate and up matrices stored in two different
// formats. The switch is uniform across a dispatch (no divergence), but it costs code
// size and registers, so the common formats have their own instances.
struct moe_fmt_any {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        switch (r.format) {
        case MOE_FORMAT_F32: moe_fmt_f32::load8(r, k, v); break;
        case MOE_FORMAT_F16: moe_fmt_f16::load8(r, k, v); break;
        case MOE_FORMAT_BF16: moe_fmt_bf16::load8(r, k, v); break;
        case MOE_FORMAT_MXFP4: moe_fmt_mxfp4::load8(r, k, v); break;
        default: moe_fmt_affine<0>::load8(r, k, v); break;
        }
    }
    static inline float load1(moe_wrow r, uint k) {
        switch (r.format) {
        case MOE_FORMAT_F32: return moe_fmt_f32::load1(r, k);
        case MOE_FORMAT_F16: return moe_fmt_f16::load1(r, k);
        case MOE_FORMAT_BF16: return moe_fmt_bf16::load1(r, k);
        case MOE_FORMAT_MXFP4: return moe_fmt_mxfp4::load1(r, k);
        default: return moe_fmt_affine<0>::load1(r, k);
        }
    }
};

// sum of v[i] * x[i] for i < 8, x = (a, b).
static inline float moe_dot8(thread const float* v, float4 a, float4 b) {
    return dot(float4(v[0], v[1], v[2], v[3]), a) + dot(float4(v[4], v[5], v[6], v[7]), b);
}

// The same with x in device memory, float4-aligned (a row of a multiple of 8 floats).
static inline float moe_dot8(thread const float* v, device const float* x) {
    return moe_dot8(v, *(device const float4*)x, *(device const float4*)(x + 4));
}

typedef moe_fmt_affine<4> moe_fmt_q4;
typedef moe_fmt_affine<8> moe_fmt_q8;

// Every row X(suffix, ...) of MOE_SPECIALISATION_ROWS (moe_options.h) has its loader
// moe_fmt_<suffix> above: the kernels that read weights are instantiated once per row, and
// the host (MetalWeight.kernelSuffix) picks the row from the weight's format.

#endif
