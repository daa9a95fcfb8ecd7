// Decode products against 8-bit activations (moe_cpu_matmul_q8) with AVX-512, VNNI and
// VBMI: the formats that decode reads most (ggml's Q4_0, IQ4_NL, IQ4_XS, MXFP4, Q4_K, Q5_K
// and Q6_K, ours in 4 bits). q8_avx2.c serves every other format, and these on other CPUs.
//
// AVX2 (q8_avx2.c's octets) spends a vpmaddubsw, a vpmaddwd and an add per 32 codes and
// activation row, a transposing reduction of the blocks' sums and eight float16 scales
// gathered word by word; from L2 one core then multiplies 4-bit blocks about as fast as it
// reads them from DRAM (benchmarks/q8_stream.py), and decode reads below the bandwidth. Here:
// - codes four blocks to a 512-bit register: a block's 16 bytes in a 128-bit lane, its low
//   nibbles elements 0-15 and high nibbles 16-31 (ggml's order, and the CPU's order of
//   ours), against the activation codes rearranged to match once per call;
// - vpdpbusd multiplies 64 unsigned codes by 64 signed activation codes into int32 lanes,
//   four lanes per block, exactly (|sum| < 2^24: nothing saturates, nothing rounds);
// - the lanes stay unreduced: each is converted to float and multiplied by its block's
//   factor d_w * d_x (eight factors spread over the lanes by one permute per register);
// - ggml's blocks of 17 or 18 bytes are moved into that order by vpermt2b from three
//   64-byte loads, and their eight scales by one more; IQ4_XS's super-blocks hold their
//   codes in that order already.
// Unsigned codes carry an offset (Q4_0: q - 8, mxfp4: table + 12, iq4_nl and iq4_xs:
// table + 128, ours: the affine bias) that multiplies the activation block's sum d_x * sum q_x.
#include "ggml_avx2_blocks.h"

#include <stdlib.h>

#ifdef MOE_CPU_FORMATS_X86

enum { Q8X_ROWS = 4, OCTET_ELEMS = 256 };
#ifndef MOE_Q8_PREFETCH
#define MOE_Q8_PREFETCH 4096
#endif
// As q8_avx2.c's: bytes ahead of the block being read.
enum { PREFETCH_AHEAD = MOE_Q8_PREFETCH };

// Which rearrangement of the activation codes a format reads, and how its codes lie.
enum { FAMILY_NONE, FAMILY_STRIDED, FAMILY_CONTIGUOUS, FAMILY_K, FAMILY_Q6_K };

INLINE int family_of(const moe_cpu_matrix* w) {
    switch (w->format) {
    case MOE_FORMAT_GGML_Q4_0: case MOE_FORMAT_GGML_IQ4_NL: case MOE_FORMAT_GGML_MXFP4: return FAMILY_STRIDED;
    case MOE_FORMAT_GGML_IQ4_XS: return FAMILY_CONTIGUOUS;
    case MOE_FORMAT_GGML_Q4_K: case MOE_FORMAT_GGML_Q5_K: return FAMILY_K;
    case MOE_FORMAT_GGML_Q6_K: return FAMILY_Q6_K;
    case MOE_FORMAT_MXFP4: return w->split_nibbles ? FAMILY_CONTIGUOUS : FAMILY_NONE;
    case MOE_FORMAT_AFFINE:
        return w->bits == 4 && w->split_nibbles && w->group_size >= 32 && w->group_size <= 128 ? FAMILY_CONTIGUOUS
                                                                                                 : FAMILY_NONE;
    default: return FAMILY_NONE;
    }
}

// The high nibble of each byte moved down: one vgf2p8affineqb where shift and mask take two
// (byte 7 - i of the matrix selects the source bit of result bit i).
INLINE T512Q8 __m512i high_nibbles(__m512i z) {
    return _mm512_gf2p8affine_epi64_epi8(z, _mm512_set1_epi64(0x1020408000000000), 0);
}

INLINE uint64_t low_bits64(int64_t n) { return n <= 0 ? 0 : n >= 64 ? ~0ull : (1ull << n) - 1; }

// The activation codes of one row as the codes meet them. 32-element blocks, 128 at a
// time in two registers (XL, XH) of 64 bytes: block q's elements 0-15 in lane q of XL,
// 16-31 in lane q of XH. Q4_K and Q5_K, per 256 in four registers: lane q of register r holds
// elements 16 r + 64 q to 16 r + 64 q + 15, as row_k's registers of codes hold their
// sub-blocks' quarters. `cols` codes are read; the rest of the last 256 is zero.
INLINE T512Q8 void arrange_x(const int family, const int8_t* x, int64_t cols, int8_t* out, int64_t padded) {
    if (family == FAMILY_K) {
        // A transpose of the 4 x 4 lanes of 16 bytes in each 256 (cols is a multiple of 256).
        for (int64_t k = 0; k < padded; k += 256)
            for (int r = 0; r < 4; r++)
                for (int q = 0; q < 4; q++) memcpy(out + k + 64 * r + 16 * q, x + k + 16 * r + 64 * q, 16);
        return;
    }
    const __m512i lo = _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), hi = _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15);
    for (int64_t k = 0; k < padded; k += 128) {
        const __m512i a = _mm512_maskz_loadu_epi8(low_bits64(cols - k), x + k);
        const __m512i b = _mm512_maskz_loadu_epi8(low_bits64(cols - k - 64), x + k + 64);
        _mm512_storeu_si512(out + k, _mm512_permutex2var_epi64(a, lo, b));
        _mm512_storeu_si512(out + k + 64, _mm512_permutex2var_epi64(a, hi, b));
    }
}

// vpermt2b indices that move ggml's 32-element blocks (`bytes` apart, codes from `head`)
// into the lane order: codes[0] from bytes 0-127 of the eight (blocks 0-3), codes[1]
// from bytes 64-127 and the last 64 (blocks 4-7), scales: the first `scale_bytes` bytes
// of each block from bytes 0-127.
typedef struct {
    __m512i codes[2], scales;
} octet_indices;

INLINE T512Q8 octet_indices indices_for(int bytes, int head, int scale_bytes) {
    uint8_t c0[64], c1[64], s[64] = {0};
    const int last = 8 * bytes - 64;  // where the third load starts
    for (int j = 0; j < 64; j++) {
        c0[j] = (uint8_t)((j >> 4) * bytes + head + (j & 15));
        const int at = (4 + (j >> 4)) * bytes + head + (j & 15);
        c1[j] = (uint8_t)(at < 128 ? at - 64 : 64 + at - last);
    }
    for (int q = 0; q < 8; q++)
        for (int i = 0; i < scale_bytes; i++) s[q * scale_bytes + i] = (uint8_t)(q * bytes + i);
    octet_indices ix;
    ix.codes[0] = _mm512_loadu_si512(c0);
    ix.codes[1] = _mm512_loadu_si512(c1);
    ix.scales = _mm512_loadu_si512(s);
    return ix;
}

// A group's scale or bias for each of the blocks of an octet whose first `blocks` blocks
// are in the row (the masked loads touch nothing after them).
INLINE T512Q8 __m256 group_octet_masked(const uint8_t* p, int type, int shift, int64_t o, int blocks) {
    const int64_t g0 = (o * OCTET_ELEMS) >> shift;
    const __mmask8 k = (__mmask8)((1u << ((blocks * 32) >> shift)) - 1);
    __m256 v;
    if (type == MOE_DTYPE_F32) {
        v = _mm256_maskz_loadu_ps(k, (const float*)p + g0);
    } else {
        const __m128i h = _mm_maskz_loadu_epi16(k, p + 2 * g0);
        v = type == MOE_DTYPE_F16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_permutevar8x32_ps(v, _mm256_load_si256((const __m256i*)group_lanes[shift - 5]));
}

// One octet (eight 32-element blocks, the first `blocks` of them in the row) of row b's
// format F against MM activation rows: acc[i][h] += the lanes of register h's blocks times
// their factors; sums[i] += the offset's factor per block times the activation blocks' sums.
INLINE T512Q8 void octet(const int F, const int MM, const int blocks, const uint8_t* b, const group_cursor* gc,
                         int64_t o, const octet_indices* ix, const int8_t* const* xr, const float* const* xs,
                         const float* const* xsum, __m512 acc[][2], __m256* sums) {
    const int whole = blocks == 8;
    const __mmask8 kb = (__mmask8)((1u << blocks) - 1);
    __m512i z[2];
    __m256 dw, bw = _mm256_setzero_ps();
    if (F == MOE_FORMAT_GGML_IQ4_XS) {
        // A super-block: d, eight 6-bit scales, the 128 code bytes in our lane order. Rows
        // are whole ones.
        z[0] = _mm512_loadu_si512(b + 8);
        z[1] = _mm512_loadu_si512(b + 72);
        dw = iq4_xs_factors(b);
    } else if (F == MOE_FORMAT_AFFINE || F == MOE_FORMAT_MXFP4) {
        const int64_t n = 16 * blocks;
        z[0] = _mm512_maskz_loadu_epi8(whole ? ~0ull : low_bits64(n), b);
        z[1] = _mm512_maskz_loadu_epi8(whole ? ~0ull : low_bits64(n - 64), b + 64);
        if (F == MOE_FORMAT_AFFINE) {
            dw = group_octet_masked(gc->scales, gc->type, gc->shift, o, blocks);
            bw = group_octet_masked(gc->biases, gc->type, gc->shift, o, blocks);
        } else {
            dw = e8m0_half_scales(_mm_maskz_loadu_epi8(kb, gc->scales + 8 * o));
        }
    } else {
        const int bytes = F == MOE_FORMAT_GGML_MXFP4 ? 17 : 18, n = bytes * blocks, last = 8 * bytes - 64;
        const __m512i r0 = _mm512_maskz_loadu_epi8(whole ? ~0ull : low_bits64(n), b);
        const __m512i r1 = _mm512_maskz_loadu_epi8(whole ? ~0ull : low_bits64(n - 64), b + 64);
        const __m512i r2 = _mm512_maskz_loadu_epi8(whole ? ~0ull : low_bits64(n - last), b + last);
        z[0] = _mm512_permutex2var_epi8(r0, ix->codes[0], r1);
        z[1] = _mm512_permutex2var_epi8(r1, ix->codes[1], r2);
        const __m128i s = _mm512_castsi512_si128(_mm512_permutex2var_epi8(r0, ix->scales, r1));
        dw = F == MOE_FORMAT_GGML_MXFP4 ? e8m0_half_scales(s) : _mm256_cvtph_ps(s);
    }
    // Blocks past the row: codes and scales 0 (their loads were masked), and so are their
    // activation codes, scales and sums.
    const __m512i mask = _mm512_set1_epi8(0x0f);
    __m512i lo[2], hi[2];
    for (int h = 0; h < 2; h++) {
        lo[h] = _mm512_and_si512(z[h], mask);
        hi[h] = high_nibbles(z[h]);
        if (F == MOE_FORMAT_GGML_MXFP4 || F == MOE_FORMAT_MXFP4 || F == MOE_FORMAT_GGML_IQ4_NL || F == MOE_FORMAT_GGML_IQ4_XS) {
            const int iq4 = F == MOE_FORMAT_GGML_IQ4_NL || F == MOE_FORMAT_GGML_IQ4_XS;
            const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(
                (const __m128i*)(iq4 ? (const void*)iq4nl_table_plus128 : (const void*)mxfp4_table_plus12)));
            lo[h] = _mm512_shuffle_epi8(table, lo[h]);
            hi[h] = _mm512_shuffle_epi8(table, hi[h]);
        }
    }
    const __m512i spread0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i spread1 = _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
    for (int i = 0; i < MM; i++) {
        const __m256 ds = _mm256_mul_ps(dw, _mm256_maskz_loadu_ps(kb, xs[i] + 8 * o));
        sums[i] = _mm256_fmadd_ps(F == MOE_FORMAT_AFFINE ? bw : dw, _mm256_maskz_loadu_ps(kb, xsum[i] + 8 * o), sums[i]);
        const int8_t* x = xr[i] + o * OCTET_ELEMS;
        for (int h = 0; h < 2; h++) {
            __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[h], _mm512_loadu_si512(x + 128 * h));
            dot = _mm512_dpbusd_epi32(dot, hi[h], _mm512_loadu_si512(x + 128 * h + 64));
            const __m512 f = _mm512_permutexvar_ps(h ? spread1 : spread0, _mm512_castps256_ps512(ds));
            acc[i][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), f, acc[i][h]);
        }
    }
}

// Row r of a 32-element block format against MM activation rows: whole octets, then the
// blocks after the last one (a row of 2880: two) as an octet with its missing blocks masked.
INLINE T512Q8 void row_blocks(const int F, const int MM, const moe_cpu_matrix* w, int64_t r,
                              const octet_indices* ix, const int8_t* const* xr, const float* const* xs,
                              const float* const* xsum, float* c, int64_t ldc, const uint8_t* stop) {
    const int ours = F == MOE_FORMAT_AFFINE || F == MOE_FORMAT_MXFP4;
    const ggml_block_shape block = ggml_block_shape_of(F);
    const int octet_bytes = ours ? 128 : block.bytes * (OCTET_ELEMS / block.elems);
    const float offset = F == MOE_FORMAT_GGML_Q4_0 ? 8.0f
                       : F == MOE_FORMAT_GGML_IQ4_NL || F == MOE_FORMAT_GGML_IQ4_XS ? 128.0f
                       : F == MOE_FORMAT_AFFINE ? -1.0f : 12.0f;
    const uint8_t* b = row_data(w, r);
    group_cursor gc = {0};
    if (ours) gc = group_cursor_for(w, r);
    const int64_t octets = w->cols / OCTET_ELEMS;
    const int rest = (int)(w->cols % OCTET_ELEMS) / 32;
    __m512 acc[Q8X_ROWS][2];
    __m256 sums[Q8X_ROWS];
    for (int i = 0; i < MM; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps(), sums[i] = _mm256_setzero_ps();
    int64_t o = 0;
    for (; o < octets; o++, b += octet_bytes) {
        if (b + PREFETCH_AHEAD < stop)
            for (int l = 0; l < octet_bytes; l += 64) _mm_prefetch((const char*)b + PREFETCH_AHEAD + l, _MM_HINT_T0);
        octet(F, MM, 8, b, &gc, o, ix, xr, xs, xsum, acc, sums);
    }
    if (rest) octet(F, MM, rest, b, &gc, o, ix, xr, xs, xsum, acc, sums);
    for (int i = 0; i < MM; i++)
        c[i * ldc] = fmaf(-offset, hsum8(sums[i]), _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1])));
}

// Q6_K's 256 elements as four registers of 64 codes against 256 activation codes at x:
// acc += each int32 lane times its sub-block's factor, which spread[p] picks from f.
INLINE T512Q8 void add_quarters(const __m512i q[4], const int8_t* x, const __m512i spread[4], __m512 f, __m512 acc[2]) {
#pragma clang loop unroll(full)
    for (int p = 0; p < 4; p++) {
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[p], _mm512_loadu_si512(x + 64 * p));
        acc[p & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(spread[p], f), acc[p & 1]);
    }
}

// Q4_K and Q5_K: sub-block j of 32 is (d * sc_j) * q - dmin * m_j with q unsigned. Byte i
// of each 32 of the 128 code bytes holds element i of an even sub-block (low nibble) and of
// the next odd one (high nibble). Two registers take the first and the second 16 bytes of
// each 32 (a qword permute of the two loads), so that the low nibbles of both meet one even
// sub-block in the same four lanes (two vpdpbusd into one register) and the high ones one
// odd sub-block: four lanes per sub-block, half the conversions and multiplies of eight.
// The factor d * sc_j * d_x reaches its lanes by one permute per register; the minimums
// multiply the activation blocks' sums.
// Q5_K's fifth bit of element 64 q + i (i < 32) is bit 2 q of qh[i], of element 64 q + 32 + i
// bit 2 q + 1: lane q of each code register holds 16 bytes of chunk q, so qh's 16 bytes for
// them, broadcast to every lane, meet one vgf2p8affineqb whose matrix differs per lane
// (bit 2 q or 2 q + 1 to bit 4) and an OR.
INLINE T512Q8 void row_k(const int F, const int MM, const moe_cpu_matrix* w, int64_t r, const int8_t* const* xr,
                         const float* const* xs, const float* const* xsum, float* c, int64_t ldc,
                         const uint8_t* stop) {
    const int five = F == MOE_FORMAT_GGML_Q5_K, bytes = ggml_block_shape_of(F).bytes, codes = five ? 48 : 16;
    const uint8_t* b = row_data(w, r);
    const __m512i mask = _mm512_set1_epi8(0x0f);
    const __m512i first = _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), second = _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15);
    const __m512i even = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    const __m512i odd = _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7);
    // Byte 3 of a matrix qword makes result bit 4 (byte 7 - i makes bit i).
#define BIT_TO_4(s) ((long long)(1ull << (s)) << 24)
    const __m512i fifth_even = _mm512_setr_epi64(BIT_TO_4(0), BIT_TO_4(0), BIT_TO_4(2), BIT_TO_4(2),
                                                 BIT_TO_4(4), BIT_TO_4(4), BIT_TO_4(6), BIT_TO_4(6));
    const __m512i fifth_odd = _mm512_setr_epi64(BIT_TO_4(1), BIT_TO_4(1), BIT_TO_4(3), BIT_TO_4(3),
                                                BIT_TO_4(5), BIT_TO_4(5), BIT_TO_4(7), BIT_TO_4(7));
#undef BIT_TO_4
    __m512 acc[Q8X_ROWS][2];
    __m256 mins[Q8X_ROWS];
    for (int i = 0; i < MM; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps(), mins[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < w->cols; k += 256, b += bytes) {
        if (b + PREFETCH_AHEAD < stop) {
            for (int l = 0; l < bytes; l += 64) _mm_prefetch((const char*)b + PREFETCH_AHEAD + l, _MM_HINT_T0);
            _mm_prefetch((const char*)b + PREFETCH_AHEAD + bytes - 1, _MM_HINT_T0);
        }
        uint64_t sc8, m8;
        k_scales_mins(b + 4, &sc8, &m8);
        const __m256 dsc = _mm256_mul_ps(_mm256_set1_ps(half_to_float(b)),
                                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((int64_t)sc8))));
        const __m256 dm = _mm256_mul_ps(_mm256_set1_ps(half_to_float(b + 2)),
                                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((int64_t)m8))));
        const __m512i z0 = _mm512_loadu_si512(b + codes), z1 = _mm512_loadu_si512(b + codes + 64);
        const __m512i a = _mm512_permutex2var_epi64(z0, first, z1), s = _mm512_permutex2var_epi64(z0, second, z1);
        __m512i lo_a = _mm512_and_si512(a, mask), lo_s = _mm512_and_si512(s, mask);
        __m512i hi_a = high_nibbles(a), hi_s = high_nibbles(s);
        if (five) {
            const __m512i h_a = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(b + 16)));
            const __m512i h_s = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(b + 32)));
            lo_a = _mm512_or_si512(lo_a, _mm512_gf2p8affine_epi64_epi8(h_a, fifth_even, 0));
            lo_s = _mm512_or_si512(lo_s, _mm512_gf2p8affine_epi64_epi8(h_s, fifth_even, 0));
            hi_a = _mm512_or_si512(hi_a, _mm512_gf2p8affine_epi64_epi8(h_a, fifth_odd, 0));
            hi_s = _mm512_or_si512(hi_s, _mm512_gf2p8affine_epi64_epi8(h_s, fifth_odd, 0));
        }
        for (int i = 0; i < MM; i++) {
            const __m512 f = _mm512_castps256_ps512(_mm256_mul_ps(dsc, _mm256_loadu_ps(xs[i] + (k >> 5))));
            mins[i] = _mm256_fmadd_ps(dm, _mm256_loadu_ps(xsum[i] + (k >> 5)), mins[i]);
            const int8_t* x = xr[i] + k;
            const __m512i de = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo_a, _mm512_loadu_si512(x)),
                                                   lo_s, _mm512_loadu_si512(x + 64));
            const __m512i dd = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), hi_a, _mm512_loadu_si512(x + 128)),
                                                   hi_s, _mm512_loadu_si512(x + 192));
            acc[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(de), _mm512_permutexvar_ps(even, f), acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dd), _mm512_permutexvar_ps(odd, f), acc[i][1]);
        }
    }
    for (int i = 0; i < MM; i++)
        c[i * ldc] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1])) - hsum8(mins[i]);
}

// The sums of each 16 activation codes of a row, as floats, for row_q6_k's offsets:
// vpsadbw sums the codes biased by 128 in eights.
INLINE T512Q8 void sixteens(const int8_t* x, int64_t cols, float* out) {
    for (int64_t k = 0; k < cols; k += 64) {
        const __m512i eights = _mm512_sad_epu8(_mm512_xor_si512(_mm512_loadu_si512(x + k), _mm512_set1_epi8((char)0x80)),
                                               _mm512_setzero_si512());
        // Both qwords of each 128-bit lane: its 16 codes' biased sum.
        const __m512i lanes = _mm512_add_epi64(eights, _mm512_shuffle_epi32(eights, _MM_PERM_BADC));
        const __m256i sums = _mm256_permutevar8x32_epi32(_mm512_cvtepi64_epi32(lanes), _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0));
        _mm_storeu_ps(out + k / 16, _mm_cvtepi32_ps(_mm_sub_epi32(_mm256_castsi256_si128(sums), _mm_set1_epi32(16 * 128))));
    }
}

// Q6_K: d * sc * (q - 32), q unsigned 6-bit, a signed 8-bit scale per 16 elements. Per half
// (128 elements) the 64 low-nibble bytes give elements 0-63 (low nibbles) and 64-127 (high
// ones) in element order, their two high bits from the 32 qh bytes shifted into place per
// 32 elements (per qword: the shifts keep within bytes what the mask keeps). The factor
// d * sc_j * d_x of each 16 elements reaches its four lanes by one permute per register;
// the -32 multiplies the activation codes' sums per 16 (sixteens) by the same factors.
INLINE T512Q8 void row_q6_k(const int MM, const moe_cpu_matrix* w, int64_t r, const int8_t* const* xr,
                            const float* const* xs, const float* const* x16, float* c, int64_t ldc,
                            const uint8_t* stop) {
    const uint8_t* b = row_data(w, r);
    const __m512i low4 = _mm512_set1_epi8(0x0f), top2 = _mm512_set1_epi8(0x30);
    const __m512i left = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2), right = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    // Each sub-block of 16's factor to its four lanes, for the four registers of 64.
    __m512i spread[4];
    for (int q = 0; q < 4; q++)
        spread[q] = _mm512_add_epi32(_mm512_set1_epi32(4 * q), _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    const __m512i pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512 acc[Q8X_ROWS][2], offsets[Q8X_ROWS];
    for (int i = 0; i < MM; i++) acc[i][0] = acc[i][1] = offsets[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < w->cols; k += 256, b += 210) {
        if (b + PREFETCH_AHEAD < stop) {
            for (int l = 0; l < 210; l += 64) _mm_prefetch((const char*)b + PREFETCH_AHEAD + l, _MM_HINT_T0);
            _mm_prefetch((const char*)b + PREFETCH_AHEAD + 209, _MM_HINT_T0);
        }
        const __m512 dsc = _mm512_mul_ps(_mm512_set1_ps(half_to_float(b + 208)),
                                         _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm256_cvtepi8_epi16(
                                             _mm_loadu_si128((const __m128i*)(b + 192))))));
        __m512i q[4];
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512(b + 64 * h);
            const __m256i qh = _mm256_loadu_si256((const __m256i*)(b + 128 + 32 * h));
            const __m512i hh = _mm512_inserti64x4(_mm512_castsi256_si512(qh), qh, 1);
            // (nibbles & low4) | high bits in one vpternlogd (0xEC: A & C | B).
            q[2 * h] = _mm512_ternarylogic_epi32(ql, _mm512_and_si512(_mm512_sllv_epi64(hh, left), top2), low4, 0xEC);
            q[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4),
                                                     _mm512_and_si512(_mm512_srlv_epi64(hh, right), top2), low4, 0xEC);
        }
        for (int i = 0; i < MM; i++) {
            const __m512 f = _mm512_mul_ps(dsc, _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(_mm256_loadu_ps(xs[i] + (k >> 5)))));
            offsets[i] = _mm512_fmadd_ps(f, _mm512_loadu_ps(x16[i] + (k >> 4)), offsets[i]);
            add_quarters(q, xr[i] + k, spread, f, acc[i]);
        }
    }
    for (int i = 0; i < MM; i++)
        c[i * ldc] = fmaf(-32.0f, _mm512_reduce_add_ps(offsets[i]), _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1])));
}

T512Q8 int moe_cpu_q8_matmul_avx512(int64_t m, int64_t n, const moe_cpu_q8_rows* a, const moe_cpu_matrix* w,
                                    int64_t row0, float* c, int64_t ldc) {
    const int family = family_of(w), F = w->format;
    if (family == FAMILY_NONE || w->cols % 32) return 0;
    const int64_t padded = (w->cols + OCTET_ELEMS - 1) / OCTET_ELEMS * OCTET_ELEMS;
    // The rearranged codes (Q6_K: the sums of 16 codes); without memory for them,
    // q8_avx2.c's product serves.
    const int q6 = family == FAMILY_Q6_K;
    const size_t per_row = q6 ? (size_t)(padded / 16) * sizeof(float) : (size_t)padded;
    int8_t* arranged = aligned_alloc(64, (size_t)MIN(m, Q8X_ROWS) * per_row);
    if (!arranged) return 0;
    const octet_indices ix = family == FAMILY_STRIDED
        ? indices_for(F == MOE_FORMAT_GGML_MXFP4 ? 17 : 18, F == MOE_FORMAT_GGML_MXFP4 ? 1 : 2,
                      F == MOE_FORMAT_GGML_MXFP4 ? 1 : 2)
        : (octet_indices){0};
    // A work item reads rows row0..row0+n-1 (one block of an expert's matrix): their first
    // PREFETCH_AHEAD bytes are requested at once rather than met by demand misses, and
    // nothing past the last row is prefetched (other items' rows, read later).
    const uint8_t* start = row_data(w, row0), *stop = row_data(w, row0 + n);
    for (int64_t l = 0; l < PREFETCH_AHEAD && start + l < stop; l += 64) _mm_prefetch((const char*)start + l, _MM_HINT_T0);
    for (int64_t i0 = 0; i0 < m; i0 += Q8X_ROWS) {
        const int mm = (int)MIN(Q8X_ROWS, m - i0);
        const int8_t* xr[Q8X_ROWS];
        const float *xs[Q8X_ROWS], *xsum[Q8X_ROWS];
        for (int i = 0; i < mm; i++) {
            const int64_t row = (i0 + i) * a->stride;
            int8_t* mine = arranged + i * per_row;
            if (q6) {
                sixteens(a->codes + row, w->cols, (float*)mine);
                xr[i] = a->codes + row;
                xsum[i] = (const float*)mine;
            } else {
                arrange_x(family, a->codes + row, w->cols, mine, padded);
                xr[i] = mine;
                xsum[i] = a->sums + row / 32;
            }
            xs[i] = a->scales + row / 32;
        }
        float* ci = c + i0 * ldc;
        for (int64_t j = 0; j < n; j++) {
#define ROW_(MM)                                                                                                    \
    switch (F) {                                                                                                    \
    case MOE_FORMAT_GGML_Q4_K: row_k(MOE_FORMAT_GGML_Q4_K, MM, w, row0 + j, xr, xs, xsum, ci + j, ldc, stop); break;    \
    case MOE_FORMAT_GGML_Q5_K: row_k(MOE_FORMAT_GGML_Q5_K, MM, w, row0 + j, xr, xs, xsum, ci + j, ldc, stop); break;    \
    case MOE_FORMAT_GGML_Q6_K: row_q6_k(MM, w, row0 + j, xr, xs, xsum, ci + j, ldc, stop); break;                        \
    case MOE_FORMAT_GGML_Q4_0: row_blocks(MOE_FORMAT_GGML_Q4_0, MM, w, row0 + j, &ix, xr, xs, xsum, ci + j, ldc, stop); break; \
    case MOE_FORMAT_GGML_IQ4_NL: row_blocks(MOE_FORMAT_GGML_IQ4_NL, MM, w, row0 + j, &ix, xr, xs, xsum, ci + j, ldc, stop); break; \
    case MOE_FORMAT_GGML_IQ4_XS: row_blocks(MOE_FORMAT_GGML_IQ4_XS, MM, w, row0 + j, &ix, xr, xs, xsum, ci + j, ldc, stop); break; \
    case MOE_FORMAT_GGML_MXFP4: row_blocks(MOE_FORMAT_GGML_MXFP4, MM, w, row0 + j, &ix, xr, xs, xsum, ci + j, ldc, stop); break; \
    case MOE_FORMAT_MXFP4: row_blocks(MOE_FORMAT_MXFP4, MM, w, row0 + j, &ix, xr, xs, xsum, ci + j, ldc, stop); break;   \
    default: row_blocks(MOE_FORMAT_AFFINE, MM, w, row0 + j, &ix, xr, xs, xsum, ci + j, ldc, stop); break;               \
    }
            ROWS_AS_CONSTANT(mm, ROW_)
#undef ROW_
        }
    }
    free(arranged);
    return 1;
}

#endif
