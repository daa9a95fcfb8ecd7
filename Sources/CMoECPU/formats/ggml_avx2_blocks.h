// ggml's common block types unpacked with AVX2 into their codes (signed or unsigned bytes)
// and scales: shared by ggml_avx2.c (float activations) and q8_avx2.c (8-bit ones).
#ifndef MOE_CPU_GGML_AVX2_BLOCKS_H
#define MOE_CPU_GGML_AVX2_BLOCKS_H

#include "internal.h"

#ifdef MOE_CPU_FORMATS_X86

// The ggml types with AVX2 products of their own (ggml_avx2.c, q8_avx2.c).
INLINE int ggml_avx2_has_products(int format) {
    switch (format) {
    case MOE_FORMAT_GGML_Q8_0:
    case MOE_FORMAT_GGML_Q4_0:
    case MOE_FORMAT_GGML_Q4_1:
    case MOE_FORMAT_GGML_Q5_0:
    case MOE_FORMAT_GGML_Q5_1:
    case MOE_FORMAT_GGML_IQ4_NL:
    case MOE_FORMAT_GGML_IQ4_XS:
    case MOE_FORMAT_GGML_MXFP4:
    case MOE_FORMAT_GGML_Q4_K:
    case MOE_FORMAT_GGML_Q5_K:
    case MOE_FORMAT_GGML_Q6_K: return 1;
    default: return 0;
    }
}

// ROW(MM) with MM the constant (1 to 4) that mm is, so that each row kernel is compiled
// for its number of activation rows.
#define ROWS_AS_CONSTANT(mm, ROW) \
    switch (mm) {                 \
    case 1: ROW(1) break;         \
    case 2: ROW(2) break;         \
    case 3: ROW(3) break;         \
    default: ROW(4) break;        \
    }

// A float16 as a float, through a fresh register (u16_in_fresh_register says why).
INLINE T256 float half_to_float(const uint8_t* p) {
    return _mm_cvtss_f32(_mm_cvtph_ps(u16_in_fresh_register(p)));
}

// An IQ4_XS block's eight sub-block factors d * (scale - 32), the 6-bit scales of
// iq4_xs_scale decoded in one register: nibble j of the 32 bits at byte 4, bits 2 j and
// 2 j + 1 of the 16 at byte 2 (eight scalar decodes cost a fifth of an AVX-512 block).
INLINE T256 __m256 iq4_xs_factors(const uint8_t* b) {
    uint32_t low;
    memcpy(&low, b + 4, 4);
    const __m256i nibble = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)low), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                            _mm256_set1_epi32(15));
    const __m256i pair = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(load_u16(b + 2, 0)), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                          _mm256_set1_epi32(3));
    const __m256i scale = _mm256_or_si256(nibble, _mm256_slli_epi32(pair, 4));
    return _mm256_mul_ps(_mm256_set1_ps(half_to_float(b)), _mm256_cvtepi32_ps(_mm256_sub_epi32(scale, _mm256_set1_epi32(32))));
}

// 16 bytes of split nibbles (low: elements 0-15, high: 16-31) as 32 unsigned codes.
INLINE T256 __m256i split_nibbles(const uint8_t* p) {
    const __m128i x = _mm_loadu_si128((const __m128i*)p), mask = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), mask), _mm_and_si128(x, mask));
}

static const int8_t iq4nl_table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const int8_t mxfp4_table[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

INLINE T256 __m256i lookup(const int8_t* table, __m256i nibbles) {
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)table));
    return _mm256_shuffle_epi8(t, nibbles);
}

// Q5_0 / Q5_1's fifth bits as code values: 16 in each byte lane whose bit (lane % 8) is
// set in the byte of qh that `pick` selects for it (vpshufb, within each 128-bit lane).
INLINE T256 __m256i fifth_bit_values(__m256i qh, __m256i pick) {
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, pick), bits), bits);
    return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

// Q5_0 / Q5_1: the split nibbles at qs with bit j of the 32-bit mask at qh as bit 4 of
// element j.
INLINE T256 __m256i five_bit_codes(const uint8_t* qs, const uint8_t* qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    return _mm256_or_si256(split_nibbles(qs), fifth_bit_values(_mm256_set1_epi32((int)h), pick));
}

// One 32-element block of format F: its codes as signed bytes and its scale (Q4_1 and
// Q5_1: unsigned codes, whose minimum the caller adds).
INLINE T256 __m256i block32(const int F, const uint8_t* b, float* d) {
    switch (F) {
    case MOE_FORMAT_GGML_Q8_0:
        *d = half_to_float(b);
        return _mm256_loadu_si256((const __m256i*)(b + 2));
    case MOE_FORMAT_GGML_Q4_0:
        *d = half_to_float(b);
        return _mm256_sub_epi8(split_nibbles(b + 2), _mm256_set1_epi8(8));
    case MOE_FORMAT_GGML_IQ4_NL:
        *d = half_to_float(b);
        return lookup(iq4nl_table, split_nibbles(b + 2));
    case MOE_FORMAT_GGML_Q4_1:
        *d = half_to_float(b);
        return split_nibbles(b + 4);
    case MOE_FORMAT_GGML_Q5_0:
        *d = half_to_float(b);
        return _mm256_sub_epi8(five_bit_codes(b + 6, b + 2), _mm256_set1_epi8(16));
    case MOE_FORMAT_GGML_Q5_1:
        *d = half_to_float(b);
        return five_bit_codes(b + 8, b + 4);
    default: {  // MXFP4: 2^(e - 128) times doubled E2M1 values, as ggml scales them
        const uint8_t e = b[0];
        *d = from_bits(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
        return lookup(mxfp4_table, split_nibbles(b + 1));
    }
    }
}

// The 32 codes of sub-block `sub` of a Q4_K or Q5_K block: nibbles of 32 bytes (low ones
// for even sub-blocks), and for Q5_K bit `sub` of each of the 32 high-bit bytes above them.
INLINE T256 __m256i k_codes(const int F, const uint8_t* b, int sub) {
    const __m256i mask = _mm256_set1_epi8(0x0f);
    const uint8_t* qs = b + (F == MOE_FORMAT_GGML_Q5_K ? 48 : 16) + 32 * (sub / 2);
    const __m256i q = _mm256_loadu_si256((const __m256i*)qs);
    __m256i codes = (sub & 1) ? _mm256_and_si256(_mm256_srli_epi16(q, 4), mask) : _mm256_and_si256(q, mask);
    if (F == MOE_FORMAT_GGML_Q5_K) {
        const __m256i qh = _mm256_loadu_si256((const __m256i*)(b + 16));
        const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(sub)), _mm256_set1_epi8(1));
        codes = _mm256_or_si256(codes, _mm256_slli_epi16(bit, 4));
    }
    return codes;
}

// The unsigned 6-bit codes of half `half` (128 elements) of a Q6_K block, 32 per vector
// in element order: low nibbles from 64 bytes, high bit pairs from 32.
INLINE T256 void q6_k_codes(const uint8_t* b, int half, __m256i q[4]) {
    const __m256i low4 = _mm256_set1_epi8(0x0f), top2 = _mm256_set1_epi8(0x30);
    const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
    const __m256i l0 = _mm256_loadu_si256((const __m256i*)ql), l1 = _mm256_loadu_si256((const __m256i*)(ql + 32));
    const __m256i h = _mm256_loadu_si256((const __m256i*)qh);
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), top2));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(h, 2), top2));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(h, top2));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4), _mm256_and_si256(_mm256_srli_epi16(h, 2), top2));
}

// Q4_K / Q5_K's eight 6-bit scales and minimums (k_scale_min's values) from their 12
// bytes at q, as bytes: the bytes taken as three words, each byte lane of a word one
// sub-block, so that the eight unpackings are a few word operations together rather than a
// scalar loop (which cost as much as a block's integer products).
INLINE void k_scales_mins(const uint8_t* q, uint64_t* sc, uint64_t* m) {
    uint32_t w[3];
    memcpy(w, q, sizeof w);
    const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, top2 = 0x03030303u;
    // Sub-blocks 0-3: the low 6 bits of bytes 0-3 (scales) and 4-7 (minimums); 4-7: a
    // nibble of bytes 8-11 below the top two bits of bytes 0-3 (scales) and 4-7 (minimums).
    *sc = (uint64_t)((w[2] & low4) | ((w[0] >> 6) & top2) << 4) << 32 | (w[0] & low6);
    *m = (uint64_t)(((w[2] >> 4) & low4) | ((w[1] >> 6) & top2) << 4) << 32 | (w[1] & low6);
}

// Eight E8M0 exponents (byte q of e: block q) as mxfp4's scales of doubled E2M1 codes,
// 2^(e - 128); 255 is NaN.
INLINE T256 __m256 e8m0_half_scales(__m128i e) {
    const __m256i v = _mm256_cvtepu8_epi32(e);
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(v, _mm256_set1_epi32(1)), 23);
    const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), v);
    __m256i bits = _mm256_blendv_epi8(normal, tiny, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), v));
    bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7fc00000), _mm256_cmpeq_epi32(v, _mm256_set1_epi32(255)));
    return _mm256_castsi256_ps(bits);
}

// The 8-bit-activation products' lookup tables of 4-bit codes that are not the nibbles
// themselves, moved up to unsigned values: mxfp4's by 12 (vpmaddubsw's pairs stay far
// below 2^15), iq4_nl's by 128 (vpdpbusd, which cannot saturate); the offset comes back as
// offset * the activation block's sum.
static const int8_t mxfp4_table_plus12[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
static const uint8_t iq4nl_table_plus128[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};

// The lanes of eight 32-element blocks that a group's scale reaches, for groups of 32, 64
// and 128 (group_lanes[shift - 5]).
static const int32_t group_lanes[3][8] __attribute__((aligned(32))) = {
    {0, 1, 2, 3, 4, 5, 6, 7}, {0, 0, 1, 1, 2, 2, 3, 3}, {0, 0, 0, 0, 1, 1, 1, 1}};

#endif

#endif
