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

// Row r of expert `expert` of a matrix with `cols` columns (moe_weight_desc); `experts`
// is its moe_expert_parts table when d.per_expert (never read otherwise).
static inline moe_wrow moe_row(constant moe_weight_desc& d, device const uchar* w, device const uchar* s,
                               device const uchar* b, device const moe_expert_parts* experts, uint expert, uint r,
                               uint cols)
{
    ulong row = (ulong)d.row_offset + r;
    if (d.per_expert != 0) {
        const moe_expert_parts e = experts[expert];
        device const uchar* span = e.span == 0 ? w : (e.span == 1 ? s : b);
        w = span + (((ulong)e.codes_hi << 32) | e.codes_lo);
        s = span + (((ulong)e.scales_hi << 32) | e.scales_lo);
        b = span + (((ulong)e.biases_hi << 32) | e.biases_lo);
    } else {
        row += (ulong)expert * d.rows_per_expert;
    }
    const uint scale_size = d.format == MOE_FORMAT_MXFP4 ? 1u : (d.scale_type == MOE_DTYPE_F32 ? 4u : 2u);
    // ggml's blocks carry their scales: s and b are dummies that nothing reads.
    const ulong scale_offset = d.row_bytes != 0 ? 0 : row * (cols >> d.group_shift) * scale_size;
    moe_wrow out;
    // Whole bytes: dense bits >= 16, quantized cols % 32 == 0, ggml rows whole blocks.
    out.w = w + row * (d.row_bytes != 0 ? (ulong)d.row_bytes : (ulong)cols * d.bits / 8);
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

// ---- ggml's block quantizations (MOE_GGML_TYPE_ROWS) --------------------------------
// A row is whole blocks of BE elements in BB bytes, each block holding its own scales;
// an element's value is ggml's dequantization (docs/formats.md, "ggml blocks"). Since
// BE is 32 or 256, the 8 elements of a load8 lie in one block and one of its sub-blocks,
// so each load8 reads one scale (pair) and 8 bytes of codes. Every product of a scale
// and a code below is exact in float32 (at most 11 + 7 + 6 significant bits), so the
// order of the multiplications and fma against a separate multiply-add give ggml's bits.
// Blocks start at multiples of their size from a row's start, and rows at multiples of
// it from the buffer's: reads are aligned to what divides the offset, never wider.

// 4 bytes at p, little-endian, p aligned to ALIGN bytes.
template <uint ALIGN>
static inline uint moe_u32_at(device const uchar* p) {
    if (ALIGN % 4 == 0) return *(device const uint*)p;
    if (ALIGN % 2 == 0) {
        device const ushort* h = (device const ushort*)p;
        return uint(h[0]) | (uint(h[1]) << 16);
    }
    return uint(p[0]) | (uint(p[1]) << 8) | (uint(p[2]) << 16) | (uint(p[3]) << 24);
}

// The 8 bytes at p, each shifted right by `shift` and masked with `mask`.
template <uint ALIGN>
static inline void moe_bytes8(device const uchar* p, uint shift, uint mask, thread uint* q) {
    const uint lo = moe_u32_at<ALIGN>(p), hi = moe_u32_at<ALIGN>(p + 4);
    for (uint i = 0; i < 4; i++) {
        q[i] = (lo >> (8 * i + shift)) & mask;
        q[4 + i] = (hi >> (8 * i + shift)) & mask;
    }
}

// The float16 at p (blocks put their halves at even offsets).
static inline float moe_half_at(device const uchar* p) { return float(*(device const half*)p); }

// The codes of IQ4_NL / IQ4_XS, and of ggml's MXFP4 (e2m1 doubled, +0 for code 8: the
// block's half scale makes up the factor 2).
constant float moe_iq4_values[16] = {-127.0f, -104.0f, -83.0f, -65.0f, -49.0f, -35.0f, -22.0f, -10.0f,
                                     1.0f, 13.0f, 25.0f, 38.0f, 53.0f, 69.0f, 89.0f, 113.0f};
constant float moe_e2m1_x2[16] = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 6.0f, 8.0f, 12.0f,
                                  0.0f, -1.0f, -2.0f, -3.0f, -4.0f, -6.0f, -8.0f, -12.0f};

// Load1 of a block format: through load8 (block rows are multiples of 32 long).
#define MOE_GGML_LOAD1 \
    static inline float load1(moe_wrow r, uint k) { \
        float v[8]; \
        load8(r, k & ~7u, v); \
        return v[k & 7]; \
    }

// Q4_0, IQ4_NL, Q4_1: d (half; Q4_1 then m), 16 bytes of nibbles; element j < 16 is the
// low nibble of byte j, element j + 16 its high nibble. Q4_0: d * (q - 8); IQ4_NL:
// d * table[q]; Q4_1: d * q + m.
enum { MOE_NIBBLES_Q4_0, MOE_NIBBLES_IQ4_NL, MOE_NIBBLES_Q4_1 };
template <uint KIND>
struct moe_fmt_nibbles32 {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        constexpr bool MIN = KIND == MOE_NIBBLES_Q4_1;
        device const uchar* blk = r.w + (k / 32) * (MIN ? 20 : 18);
        const uint j = k % 32;
        const float d = moe_half_at(blk), m = MIN ? moe_half_at(blk + 2) : 0.0f;
        uint q[8];
        moe_bytes8<MIN ? 4 : 2>(blk + (MIN ? 4 : 2) + (j & 15), (j >> 4) * 4, 15u, q);
        for (uint i = 0; i < 8; i++) {
            if (KIND == MOE_NIBBLES_Q4_0) v[i] = d * float(int(q[i]) - 8);
            else if (KIND == MOE_NIBBLES_IQ4_NL) v[i] = d * moe_iq4_values[q[i]];
            else v[i] = fma(d, float(q[i]), m);
        }
    }
    MOE_GGML_LOAD1
};
typedef moe_fmt_nibbles32<MOE_NIBBLES_Q4_0> moe_fmt_q4_0;
typedef moe_fmt_nibbles32<MOE_NIBBLES_IQ4_NL> moe_fmt_iq4_nl;
typedef moe_fmt_nibbles32<MOE_NIBBLES_Q4_1> moe_fmt_q4_1;

// Q5_0 / Q5_1: d (and m), a 32-bit word whose bit j is element j's fifth bit, nibbles as
// Q4_0. Q5_0: d * (q - 16); Q5_1: d * q + m.
template <bool MIN>
struct moe_fmt_q5_32 {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        constexpr uint BB = MIN ? 24 : 22, QH = MIN ? 4 : 2;
        device const uchar* blk = r.w + (k / 32) * BB;
        const uint j = k % 32;
        const float d = moe_half_at(blk), m = MIN ? moe_half_at(blk + 2) : 0.0f;
        const uint qh = moe_u32_at<2>(blk + QH) >> j;
        uint q[8];
        moe_bytes8<2>(blk + QH + 4 + (j & 15), (j >> 4) * 4, 15u, q);
        for (uint i = 0; i < 8; i++) {
            const uint c = q[i] | (((qh >> i) & 1u) << 4);
            v[i] = MIN ? fma(d, float(c), m) : d * float(int(c) - 16);
        }
    }
    MOE_GGML_LOAD1
};
typedef moe_fmt_q5_32<false> moe_fmt_q5_0;
typedef moe_fmt_q5_32<true> moe_fmt_q5_1;

// Q8_0: d (half), 32 signed bytes; d * q.
struct moe_fmt_q8_0 {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        device const uchar* blk = r.w + (k / 32) * 34;
        const float d = moe_half_at(blk);
        uint q[8];
        moe_bytes8<2>(blk + 2 + k % 32, 0, 255u, q);
        for (uint i = 0; i < 8; i++) v[i] = d * float(int(q[i] << 24) >> 24);
    }
    MOE_GGML_LOAD1
};

// Q2_K: 16 scale bytes (low nibble scale, high nibble min, per 16 elements), 64 bytes of
// 2-bit codes, d, dmin. Element j = 128 h + 32 s + l is bits 2s of byte 32 h + l;
// (d * sc) * q - dmin * mn.
struct moe_fmt_q2_K {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        device const uchar* blk = r.w + (k / 256) * 84;
        const uint j = k % 256;
        const uint sm = blk[j >> 4];
        const float dl = moe_half_at(blk + 80) * float(sm & 15u), ml = moe_half_at(blk + 82) * float(sm >> 4);
        uint q[8];
        moe_bytes8<4>(blk + 16 + (j >> 7) * 32 + (j & 31), ((j >> 5) & 3) * 2, 3u, q);
        for (uint i = 0; i < 8; i++) v[i] = fma(dl, float(q[i]), -ml);
    }
    MOE_GGML_LOAD1
};

// Q3_K: 32 bytes of high-bit masks (element j's is bit j / 32 of byte j % 32, set meaning
// no offset), 64 bytes of 2-bit codes as Q2_K, 12 bytes of 16 six-bit signed scales (low
// nibbles in bytes 0-7, both halves; high pairs in bytes 8-11, four per byte), d;
// (d * (sc - 32)) * (q - 4 * !hbit).
struct moe_fmt_q3_K {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        device const uchar* blk = r.w + (k / 256) * 110;
        const uint j = k % 256, i16 = j >> 4;
        const uint lo = (blk[96 + (i16 & 7)] >> (4 * (i16 >> 3))) & 15u;
        const uint hi = (blk[104 + (i16 & 3)] >> (2 * (i16 >> 2))) & 3u;
        const float dl = moe_half_at(blk + 108) * float(int(lo | (hi << 4)) - 32);
        uint q[8], h[8];
        moe_bytes8<2>(blk + 32 + (j >> 7) * 32 + (j & 31), ((j >> 5) & 3) * 2, 3u, q);
        moe_bytes8<2>(blk + (j & 31), j >> 5, 1u, h);
        for (uint i = 0; i < 8; i++) v[i] = dl * float(int(q[i]) - (h[i] != 0 ? 0 : 4));
    }
    MOE_GGML_LOAD1
};

// The 6-bit scale and min of sub-block `sub` (of 32 elements) of Q4_K / Q5_K, from their
// 12 bytes at p: sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins);
// 4-7 in the nibbles of bytes 8-11 with their top two bits in the top bits of bytes 0-7.
static inline void moe_k_scale_min(device const uchar* p, uint sub, thread uint& sc, thread uint& mn) {
    if (sub < 4) {
        sc = p[sub] & 63u;
        mn = p[sub + 4] & 63u;
    } else {
        sc = (p[sub + 4] & 15u) | ((p[sub - 4] >> 6) << 4);
        mn = (p[sub + 4] >> 4) | ((p[sub] >> 6) << 4);
    }
}

// Q4_K / Q5_K: d, dmin, the 12 scale bytes, (Q5_K: 32 bytes of fifth bits, element j's
// is bit j / 32 of byte j % 32,) 128 bytes of nibbles: element j = 64 c + 32 h + l is
// nibble h of byte 32 c + l; (d * sc) * q - dmin * mn per sub-block of 32.
template <bool FIFTH>
struct moe_fmt_k32 {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        constexpr uint BB = FIFTH ? 176 : 144, QS = FIFTH ? 48 : 16;
        device const uchar* blk = r.w + (k / 256) * BB;
        const uint j = k % 256;
        uint sc, mn;
        moe_k_scale_min(blk + 4, j >> 5, sc, mn);
        const float dl = moe_half_at(blk) * float(sc), ml = moe_half_at(blk + 2) * float(mn);
        uint q[8];
        moe_bytes8<8>(blk + QS + (j >> 6) * 32 + (j & 31), ((j >> 5) & 1) * 4, 15u, q);
        if (FIFTH) {
            uint h[8];
            moe_bytes8<8>(blk + 16 + (j & 31), j >> 5, 1u, h);
            for (uint i = 0; i < 8; i++) q[i] |= h[i] << 4;
        }
        for (uint i = 0; i < 8; i++) v[i] = fma(dl, float(q[i]), -ml);
    }
    MOE_GGML_LOAD1
};
typedef moe_fmt_k32<false> moe_fmt_q4_K;
typedef moe_fmt_k32<true> moe_fmt_q5_K;

// Q6_K: 128 bytes of low nibbles (element j = 128 h + 64 n + l is nibble n of byte
// 64 h + l), 64 bytes of high pairs (j = 128 h + 32 s + l: bits 2s of byte 128 + 32 h + l),
// 16 signed byte scales (per 16 elements), d; (d * sc) * (q - 32).
struct moe_fmt_q6_K {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        device const uchar* blk = r.w + (k / 256) * 210;
        const uint j = k % 256, h = j >> 7, jj = j & 127;
        const float dl = moe_half_at(blk + 208) * float(((device const char*)blk)[192 + (j >> 4)]);
        uint lo[8], hi[8];
        moe_bytes8<2>(blk + h * 64 + (jj & 63), (jj >> 6) * 4, 15u, lo);
        moe_bytes8<2>(blk + 128 + h * 32 + (jj & 31), (jj >> 5) * 2, 3u, hi);
        for (uint i = 0; i < 8; i++) v[i] = dl * float(int(lo[i] | (hi[i] << 4)) - 32);
    }
    MOE_GGML_LOAD1
};

// IQ4_XS: d, 16 bits of scale high pairs (2 per sub-block of 32), 4 bytes of scale low
// nibbles (sub-block b: nibble b % 2 of byte b / 2), 128 bytes of nibbles (element
// j = 32 b + 16 n + l is nibble n of byte 16 b + l); (d * (sc - 32)) * table[q].
struct moe_fmt_iq4_xs {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        device const uchar* blk = r.w + (k / 256) * 136;
        const uint j = k % 256, b = j >> 5;
        const uint lo = (blk[4 + b / 2] >> (4 * (b & 1))) & 15u;
        const uint hi = (uint(*(device const ushort*)(blk + 2)) >> (2 * b)) & 3u;
        const float dl = moe_half_at(blk) * float(int(lo | (hi << 4)) - 32);
        uint q[8];
        moe_bytes8<8>(blk + 8 + b * 16 + (j & 15), ((j >> 4) & 1) * 4, 15u, q);
        for (uint i = 0; i < 8; i++) v[i] = dl * moe_iq4_values[q[i]];
    }
    MOE_GGML_LOAD1
};

// ggml's MXFP4: an E8M0 byte e and 16 bytes of nibbles in Q4_0's order (17-byte blocks:
// byte reads). The scale is half of 2^(e - 127) (so 255 is 2^127, not NaN, and 0 and 1
// are the subnormals 2^-128 and 2^-127), times the doubled e2m1 value.
struct moe_fmt_mxfp4_ggml {
    static inline void load8(moe_wrow r, uint k, thread float* v) {
        device const uchar* blk = r.w + (k / 32) * 17;
        const uint j = k % 32, e = blk[0];
        const float d = as_type<float>(e < 2 ? 0x00200000u << e : (e - 1) << 23);
        uint q[8];
        moe_bytes8<1>(blk + 1 + (j & 15), (j >> 4) * 4, 15u, q);
        for (uint i = 0; i < 8; i++) v[i] = d * moe_e2m1_x2[q[i]];
    }
    MOE_GGML_LOAD1
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
        case MOE_FORMAT_GGML_Q4_0: moe_fmt_q4_0::load8(r, k, v); break;
        case MOE_FORMAT_GGML_Q4_1: moe_fmt_q4_1::load8(r, k, v); break;
        case MOE_FORMAT_GGML_Q5_0: moe_fmt_q5_0::load8(r, k, v); break;
        case MOE_FORMAT_GGML_Q5_1: moe_fmt_q5_1::load8(r, k, v); break;
        case MOE_FORMAT_GGML_Q8_0: moe_fmt_q8_0::load8(r, k, v); break;
        case MOE_FORMAT_GGML_Q2_K: moe_fmt_q2_K::load8(r, k, v); break;
        case MOE_FORMAT_GGML_Q3_K: moe_fmt_q3_K::load8(r, k, v); break;
        case MOE_FORMAT_GGML_Q4_K: moe_fmt_q4_K::load8(r, k, v); break;
        case MOE_FORMAT_GGML_Q5_K: moe_fmt_q5_K::load8(r, k, v); break;
        case MOE_FORMAT_GGML_Q6_K: moe_fmt_q6_K::load8(r, k, v); break;
        case MOE_FORMAT_GGML_IQ4_NL: moe_fmt_iq4_nl::load8(r, k, v); break;
        case MOE_FORMAT_GGML_IQ4_XS: moe_fmt_iq4_xs::load8(r, k, v); break;
        case MOE_FORMAT_GGML_MXFP4: moe_fmt_mxfp4_ggml::load8(r, k, v); break;
        default: moe_fmt_affine<0>::load8(r, k, v); break;
        }
    }
    static inline float load1(moe_wrow r, uint k) {
        switch (r.format) {
        case MOE_FORMAT_F32: return moe_fmt_f32::load1(r, k);
        case MOE_FORMAT_F16: return moe_fmt_f16::load1(r, k);
        case MOE_FORMAT_BF16: return moe_fmt_bf16::load1(r, k);
        case MOE_FORMAT_MXFP4: return moe_fmt_mxfp4::load1(r, k);
        default:
            if (r.format >= MOE_FORMAT_GGML_Q4_0) {   // every block format: through load8
                float v[8];
                load8(r, k & ~7u, v);
                return v[k & 7];
            }
            return moe_fmt_affine<0>::load1(r, k);
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
