// Affine 4- and 8-bit codes against fixed-point activations, with AVX-512: the decode
// product that avx512.c tries first for K_Q4 and K_Q8. AVX512-VNNI and GFNI, where the CPU
// has them (moe_cpu_isa_level), each replace a few instructions by one, with the same
// integers.
#include "internal.h"

#include <stdlib.h>

#ifdef MOE_CPU_FORMATS_X86

// The factored product (avx512.c) is bound by its float work: one conversion and one FMA per
// weight. Integer multiply-adds do 32 (int16) or 64 (int8) products per instruction, so
// here each activation group is first written in fixed point, finely enough that nothing
// is lost against float32 arithmetic, and the codes multiply it exactly in int32:
//   8-bit codes: x_k = d (h_k + l_k / 2^15) + e_k, d = max|x| / 32767, h and l int16,
//                |e_k| <= 2^-31 max|x|; sums H = sum q h, L = sum q l (vpdpwssd);
//   4-bit codes: x_k = D t_k + e_k, D = max|x| / FIXED_TOP, t_k = 65536 t2 + 256 t1 + t0
//                with signed 8-bit digits, |e_k| <= 2^-24 max|x|; sums of q times each
//                digit (vpdpbusd), combined in int32 as ((T2 << 8) + T1 << 8) + T0, which
//                cannot overflow with 4-bit codes and groups of at most 128.
// max is over the activation group; float32 itself rounds each product to 2^-24 of its
// size, and a dot product's error is dominated by its largest terms. Then per group
//   sum_k (s q_k + b) x_k = s d (H + L / 2^15) + b sum_k x_k   (or s D T + b sum_k x_k),
// with sum_k x_k summed from the float activations. Without AVX512-VNNI the same integers
// come from vpmaddwd / vpmaddubsw + vpmaddwd and adds. An integer multiply-add does 64
// (4-bit) or 32 (8-bit) products an instruction, where the float factored row does 16.
// A row of activations with a non-finite value keeps the float path (IEEE propagation).

// Instruction levels of the fixed-point rows (as table indices): AVX-512 alone, with
// VNNI, with VNNI and GFNI.
enum { FIXED_PLAIN, FIXED_VNNI, FIXED_GFNI };

// Signed low byte of each int32 lane.
INLINE T512 __m512i low_digit(__m512i t) { return _mm512_srai_epi32(_mm512_slli_epi32(t, 24), 24); }

// 1 if every value is finite (the rows are then prepared), else 0.
INLINE T512 int prepare_fixed_avx512(const int kind, int64_t m, const float* a, int64_t lda, int64_t cols,
                                     int64_t gs, const fixed_rows* out) {
    const int64_t groups = cols / gs;
    const float top_code = kind == K_Q4 ? (float)FIXED_TOP : (float)FIXED_ONE;
    float inv[FIXED_MAX_GROUPS];
    for (int64_t i = 0; i < m; i++) {
        const float* x = a + i * lda;
        float* d = out->scale + i * groups;
        for (int64_t g = 0; g < groups; g++) {
            __m512 big = _mm512_setzero_ps(), sum = _mm512_setzero_ps();
            for (int64_t k = g * gs; k < (g + 1) * gs; k += 16) {
                const __m512 v = _mm512_loadu_ps(x + k);
                big = _mm512_max_ps(big, _mm512_abs_ps(v));
                sum = _mm512_add_ps(sum, v);
            }
            if (!fixed_group(out, inv, groups, i, g, _mm512_reduce_max_ps(big), _mm512_reduce_add_ps(sum), top_code))
                return 0;
        }
        for (int64_t k = 0; k < cols; k += 16) {
            const int64_t src = fixed_source(kind, k, cols), g = src / gs;
            const __m512 v = _mm512_loadu_ps(x + src), scale = _mm512_set1_ps(inv[g]);
            const __m512 h = _mm512_roundscale_ps(_mm512_mul_ps(v, scale), _MM_FROUND_TO_NEAREST_INT);
            const __m512 rest = _mm512_mul_ps(_mm512_fnmadd_ps(h, _mm512_set1_ps(d[g]), v), scale);  // v - h d exactly, / d
            if (kind == K_Q4) {
                const __m512i t = _mm512_add_epi32(_mm512_cvtps_epi32(h), _mm512_cvtps_epi32(rest));
                const __m512i t0 = low_digit(t), t12 = _mm512_srai_epi32(_mm512_sub_epi32(t, t0), 8);
                const __m512i t1 = low_digit(t12), t2 = _mm512_srai_epi32(_mm512_sub_epi32(t12, t1), 8);
                int8_t* dg = out->digits + 3 * i * cols + k;
                _mm_storeu_si128((__m128i*)dg, _mm512_cvtepi32_epi8(t2));
                _mm_storeu_si128((__m128i*)(dg + cols), _mm512_cvtepi32_epi8(t1));
                _mm_storeu_si128((__m128i*)(dg + 2 * cols), _mm512_cvtepi32_epi8(t0));
            } else {
                const __m512 l = _mm512_mul_ps(rest, _mm512_set1_ps(32768.0f));
                _mm256_storeu_si256((__m256i*)(out->hi + i * cols + k), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(h)));
                _mm256_storeu_si256((__m256i*)(out->lo + i * cols + k), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(l)));
            }
        }
    }
    return 1;
}

// acc + the pairwise products of int16 lanes (dot_words256) or the four-way products of
// unsigned and signed bytes (dot_bytes), in int32 lanes. Inline assembly for VNNI: an
// always-inline function with the intrinsic could not also serve the non-VNNI build of
// the same row kernel (the intrinsics serve the emulated build of tests/c/avx512_emulated.h,
// which has no such instructions). No intermediate saturates: codes are at most 255 against int16,
// and at most 15 against int8 (two products stay far inside int16 in vpmaddubsw).
INLINE T512 __m512i dot_bytes(const int vnni, __m512i acc, __m512i u, __m512i s) {
    if (vnni) {
#ifdef MOE_CPU_AVX512_EMULATED
        return _mm512_dpbusd_epi32(acc, u, s);
#else
        __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
        return acc;
#endif
    }
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}

INLINE T512 __m256i dot_words256(const int vnni, __m256i acc, __m256i a, __m256i b) {
    if (vnni) {
#ifdef MOE_CPU_AVX512_EMULATED
        return _mm256_dpwssd_epi32(acc, a, b);
#else
        __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
        return acc;
#endif
    }
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}

INLINE T512 __m256i dot_bytes256(const int vnni, __m256i acc, __m256i u, __m256i s) {
    if (vnni) {
#ifdef MOE_CPU_AVX512_EMULATED
        return _mm256_dpbusd_epi32(acc, u, s);
#else
        __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
        return acc;
#endif
    }
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

// The per-row part of a fixed-point product: cs[i][g] = scale[g] * (d or D of activation
// row i, group g), and bias . xsum of each activation row as a vector to fold into the total.
// 0 if some cs underflowed below float32's normal range (scales near 2^-126 times small
// activations): the row then takes the float path, which does not form that product.
INLINE T512 int fixed_row_scales(const int MM, const group_cursor* gc, int64_t groups,
                                const fixed_rows* x, float cs[][FIXED_MAX_GROUPS + 16], __m512* biased) {
    __mmask16 lost = 0;
    for (int i = 0; i < MM; i++) biased[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g += 16) {
        const int64_t n = MIN(16, groups - g);
        const __m512 s = load_scalars(gc->scales, gc->type, g, n), b = load_scalars(gc->biases, gc->type, g, n);
        for (int i = 0; i < MM; i++) {
            const __m512 d = _mm512_maskz_loadu_ps(first_lanes(n), x->scale + i * groups + g);
            const __m512 sd = _mm512_mul_ps(s, d);
            _mm512_storeu_ps(cs[i] + g, sd);
            lost |= _mm512_cmp_ps_mask(_mm512_abs_ps(sd), _mm512_set1_ps(0x1p-126f), _CMP_LT_OQ) &
                    _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_NEQ_UQ) & _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_UQ);
            biased[i] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(first_lanes(n), x->xsum + i * groups + g), biased[i]);
        }
    }
    return lost == 0;
}

// Group g of an 8-bit row (32 codes a step), its integer sums converted and scaled into
// totals [u]: with u constant per call site, two totals per activation row keep two FMA
// chains in flight. The integer work runs on 256-bit halves (codes 0-15 and 16-31 of a
// step), joined into the 16 lanes of the 512-bit form only per group: the same integers
// in the same lanes, but 8-bit codes stream from memory and, as with dense rows
// (moe_cpu_matmul_formatted), 256-bit code streams faster from memory, although from L2
// the 512-bit form is faster (docs/cpu-backend.md).
INLINE T512 void group_fixed_q8(const int MM, const int64_t gs, const int vnni, const int u, const uint8_t* row,
                                int64_t g, int64_t cols, const fixed_rows* x, float cs[][FIXED_MAX_GROUPS + 16],
                                __m512 hi_total[][2], __m512 lo_total[][2]) {
    __m256i hs[4][2], ls[4][2];  // [activation row][half]
    for (int i = 0; i < MM; i++) hs[i][0] = hs[i][1] = ls[i][0] = ls[i][1] = _mm256_setzero_si256();
    for (int64_t l = 0; l < gs; l += 64) _mm_prefetch((const char*)row + g * gs + l + WIDE_PREFETCH, _MM_HINT_T0);
    for (int64_t e = g * gs; e < (g + 1) * gs; e += 32)
        for (int h = 0; h < 2; h++) {
            const __m256i codes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(row + e + 16 * h)));
            for (int i = 0; i < MM; i++) {
                const int64_t at = i * cols + e + 16 * h;
                hs[i][h] = dot_words256(vnni, hs[i][h], codes, _mm256_loadu_si256((const __m256i*)(x->hi + at)));
                ls[i][h] = dot_words256(vnni, ls[i][h], codes, _mm256_loadu_si256((const __m256i*)(x->lo + at)));
            }
        }
    for (int i = 0; i < MM; i++) {
        const __m512 scale = _mm512_set1_ps(cs[i][g]);
        const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(hs[i][0]), hs[i][1], 1);
        const __m512i l = _mm512_inserti64x4(_mm512_castsi256_si512(ls[i][0]), ls[i][1], 1);
        hi_total[i][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h), scale, hi_total[i][u]);
        lo_total[i][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l), scale, lo_total[i][u]);
    }
}

// The 64 codes of 32 bytes in the split layout (low nibbles, then high nibbles) as the
// bytes of one vector. With GFNI, one bit-matrix transform per 64-bit lane of a broadcast
// keeps the low nibbles in the lower half and moves the high nibbles down in the upper
// half: one instruction where mask, shift, mask and insert take four (the same codes).
// Inline assembly for the reason dot_bytes gives.
INLINE T512 __m512i nibble_codes(const int gfni, const uint8_t* p) {
    if (gfni) {
        const __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)p));
        // Byte 7 - i of a lane's matrix selects the source bits of result bit i.
        const __m512i low = _mm512_set1_epi64(0x0102040800000000), high = _mm512_set1_epi64(0x1020408000000000);
        const __m512i m = _mm512_inserti64x4(low, _mm512_castsi512_si256(high), 1);
#ifdef MOE_CPU_AVX512_EMULATED
        return _mm512_gf2p8affine_epi64_epi8(b, m, 0);
#else
        __m512i q;
        __asm__("vgf2p8affineqb $0, %2, %1, %0" : "=v"(q) : "v"(b), "v"(m));
        return q;
#endif
    }
    const __m256i b = _mm256_loadu_si256((const __m256i*)p), nibble = _mm256_set1_epi8(15);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b, nibble)),
                              _mm256_and_si256(_mm256_srli_epi16(b, 4), nibble), 1);
}

// NS (1 or 2) spans of a 4-bit row from element k, each span's integer sum converted and
// scaled into totals [its index]: the two spans' dependency chains (three multiply-adds,
// two shifts, a conversion, an FMA) interleave, as two FMA chains per activation row do.
INLINE T512 void spans_fixed_q4(const int NS, const int MM, const int64_t gs, const int64_t span, const int level,
                                const uint8_t* row, int64_t k, int64_t cols, const fixed_rows* x,
                                float cs[][FIXED_MAX_GROUPS + 16], __m512 total[][2]) {
    const int steps = span == 128 ? 2 : 1;  // steps of 64 codes per span
    const int vnni = level >= FIXED_VNNI;
    __m512i q[2][2];
    for (int u = 0; u < NS; u++)
        for (int h = 0; h < steps; h++) {
            const uint8_t* p = row + ((k + u * span + 64 * h) >> 1);
            // One prefetch per cache line (k is a multiple of 128 when NS is 2).
            if (NS == 1 || (u * span + 64 * h) % 128 == 0) _mm_prefetch((const char*)p + CODE_PREFETCH, _MM_HINT_T0);
            q[u][h] = nibble_codes(level == FIXED_GFNI, p);
        }
    for (int i = 0; i < MM; i++) {
        __m512i t[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int plane = 0; plane < 3; plane++)
            for (int u = 0; u < NS; u++) {
                const int8_t* dg = x->digits + (3 * i + plane) * cols + k + u * span;
                if (plane) t[u] = _mm512_slli_epi32(t[u], 8);
                for (int h = 0; h < steps; h++) t[u] = dot_bytes(vnni, t[u], q[u][h], _mm512_loadu_si512(dg + 64 * h));
            }
        for (int u = 0; u < NS; u++) {
            const int64_t g = (k + u * span) / gs;
            __m512 scale;
            if (span == gs) {
                scale = _mm512_set1_ps(cs[i][g]);
            } else {  // two groups of 32: lanes 0-3 and 8-11, 4-7 and 12-15
                scale = _mm512_mask_blend_ps(0xf0f0, _mm512_set1_ps(cs[i][g]), _mm512_set1_ps(cs[i][g + 1]));
            }
            total[i][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t[u]), scale, total[i][u]);
        }
    }
}

// One affine weight row of kind K_Q8 or K_Q4 (split layout) against MM <= 4 prepared
// activation rows: out[i] = the row's 16 lanes to sum; 0 (out zero) if its scales
// underflow (fixed_row_scales). 4-bit codes go 32 code bytes (64 codes) a step, their
// nibbles as the 64 bytes of one vector; a step's integer sum covers one group (GS 64),
// half of one (GS 128: two steps), or two (GS 32: lanes 0-3 and 8-11, 4-7 and 12-15); a
// last block of 32 codes (GS 32 only) takes 256-bit vectors.
INLINE T512 int row_fixed_avx512(const int kind, const int MM, const int gs, const int level, const moe_cpu_matrix* w,
                                 int64_t r, const fixed_rows* x, __m512* out) {
    const int vnni = level >= FIXED_VNNI;
    const int64_t cols = w->cols, groups = cols / gs;
    const group_cursor gc = group_cursor_for(w, r);
    const uint8_t* row = row_data(w, r);
    float cs[4][FIXED_MAX_GROUPS + 16];
    __m512 hi_total[4][2], lo_total[4][2], biased[4];  // lo: 8-bit codes only
    if (!fixed_row_scales(MM, &gc, groups, x, cs, biased)) {
        for (int i = 0; i < MM; i++) out[i] = _mm512_setzero_ps();
        return 0;
    }
    for (int i = 0; i < MM; i++) hi_total[i][0] = hi_total[i][1] = lo_total[i][0] = lo_total[i][1] = _mm512_setzero_ps();
    if (kind == K_Q8) {
        int64_t g = 0;
        for (; g + 2 <= groups; g += 2) {
            group_fixed_q8(MM, gs, vnni, 0, row, g, cols, x, cs, hi_total, lo_total);
            group_fixed_q8(MM, gs, vnni, 1, row, g + 1, cols, x, cs, hi_total, lo_total);
        }
        if (g < groups) group_fixed_q8(MM, gs, vnni, 0, row, g, cols, x, cs, hi_total, lo_total);
        for (int i = 0; i < MM; i++) {
            const __m512 lo = _mm512_add_ps(lo_total[i][0], lo_total[i][1]);
            biased[i] = _mm512_fmadd_ps(lo, _mm512_set1_ps(0x1p-15f), biased[i]);
        }
    } else {
        const int64_t span = gs == 32 ? 64 : gs;  // elements per integer sum
        int64_t k = 0;
        for (; k + 2 * span <= cols; k += 2 * span) spans_fixed_q4(2, MM, gs, span, level, row, k, cols, x, cs, hi_total);
        if (k + span <= cols) {
            spans_fixed_q4(1, MM, gs, span, level, row, k, cols, x, cs, hi_total);
            k += span;
        }
        if (k < cols) {  // groups of 32 and a last group of 32 codes
            const __m128i b = _mm_loadu_si128((const __m128i*)(row + (k >> 1)));
            const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(b, _mm_set1_epi8(15))),
                                                      _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15)), 1);
            for (int i = 0; i < MM; i++) {
                __m256i t = _mm256_setzero_si256();
                for (int plane = 0; plane < 3; plane++) {
                    const int8_t* dg = x->digits + (3 * i + plane) * cols + k;
                    if (plane) t = _mm256_slli_epi32(t, 8);
                    t = dot_bytes256(vnni, t, q, _mm256_loadu_si256((const __m256i*)dg));
                }
                hi_total[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(t)),
                                                 _mm512_set1_ps(cs[i][k / gs]), hi_total[i][0]);
            }
        }
    }
    for (int i = 0; i < MM; i++) out[i] = _mm512_add_ps(_mm512_add_ps(hi_total[i][0], hi_total[i][1]), biased[i]);
    return 1;
}

// The sum of v's 16 lanes by a fixed tree (lanes i + i+8, then i + i+4, i + i+2, i + i+1),
// and the same sums of four vectors at once (the driver reduces four weight rows together:
// a quarter of the shuffles, and exactly the same results as one at a time).
INLINE T512 float sum_lanes(__m512 v) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

INLINE T512 __m128 sum_lanes4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
    const __m512 a01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 a23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 c = _mm512_add_ps(b, _mm512_permute_ps(b, _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512 d = _mm512_add_ps(c, _mm512_permute_ps(c, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), d));
}

// One function per specialisation (kind, activation rows, group size, level): rows
// [r0, r0 + nb) of a call, v[q][i] = row r0 + q against activation row i, done[q] = 0 for
// a row left to the float path. Separate functions rather than one switch that inlines
// all 60: compilers' per-function passes grow faster than linearly.
typedef void fixed_rows_fn(const moe_cpu_matrix* w, int64_t r0, int64_t nb, const fixed_rows* x, __m512 (*v)[4],
                           int* done);
#define FIXED_ROWS(K, MM, GS, V)                                                                              \
    static T512 void fixed_rows_##K##_##MM##_##GS##_##V(const moe_cpu_matrix* w, int64_t r0, int64_t nb,      \
                                                        const fixed_rows* x, __m512 (*v)[4], int* done) {     \
        for (int64_t q = 0; q < nb; q++) done[q] = row_fixed_avx512(K, MM, GS, V, w, r0 + q, x, v[q]);       \
    }
#define FIXED_ROWS_GS(K, MM, V) FIXED_ROWS(K, MM, 32, V) FIXED_ROWS(K, MM, 64, V) FIXED_ROWS(K, MM, 128, V)
#define FIXED_ROWS_MM(K, V) FIXED_ROWS_GS(K, 1, V) FIXED_ROWS_GS(K, 2, V) FIXED_ROWS_GS(K, 3, V) FIXED_ROWS_GS(K, 4, V)
FIXED_ROWS_MM(K_Q4, FIXED_PLAIN)
FIXED_ROWS_MM(K_Q4, FIXED_VNNI)
FIXED_ROWS_MM(K_Q4, FIXED_GFNI)
FIXED_ROWS_MM(K_Q8, FIXED_PLAIN)
FIXED_ROWS_MM(K_Q8, FIXED_VNNI)
#define FIXED_ENTRY_GS(K, MM, V) {fixed_rows_##K##_##MM##_32_##V, fixed_rows_##K##_##MM##_64_##V, fixed_rows_##K##_##MM##_128_##V}
#define FIXED_ENTRY_MM(K, V) {FIXED_ENTRY_GS(K, 1, V), FIXED_ENTRY_GS(K, 2, V), FIXED_ENTRY_GS(K, 3, V), FIXED_ENTRY_GS(K, 4, V)}
// [4-bit, 8-bit][level][activation rows - 1][group size 32, 64, 128]; 8-bit codes have
// no use for GFNI.
static fixed_rows_fn* const fixed_rows_table[2][3][4][3] = {
    {FIXED_ENTRY_MM(K_Q4, FIXED_PLAIN), FIXED_ENTRY_MM(K_Q4, FIXED_VNNI), FIXED_ENTRY_MM(K_Q4, FIXED_GFNI)},
    {FIXED_ENTRY_MM(K_Q8, FIXED_PLAIN), FIXED_ENTRY_MM(K_Q8, FIXED_VNNI), FIXED_ENTRY_MM(K_Q8, FIXED_VNNI)},
};

// The fixed-point product for K_Q4 and K_Q8, four activation rows at a time; 0
// (nothing done) for other kinds, rows with too many groups, activations that are not all
// finite or scratch that cannot be allocated: the float product then serves. A weight row
// whose scales underflow against these activations takes the float row.
T512 int moe_cpu_matmul_fixed_avx512(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                                     int64_t row0, float* c, int64_t ldc) {
    const int kind = kernel_kind(w);
    const int gsi = w->group_size == 32 ? 0 : w->group_size == 64 ? 1 : w->group_size == 128 ? 2 : -1;
    if ((kind != K_Q4 && kind != K_Q8) || gsi < 0) return 0;
    const int64_t cols = w->cols, groups = cols / w->group_size;
    if (groups > FIXED_MAX_GROUPS) return 0;
    const int isa = moe_cpu_isa_level();
    const int level = isa == MOE_CPU_ISA_AVX512_GFNI ? FIXED_GFNI : isa == MOE_CPU_ISA_AVX512_VNNI ? FIXED_VNNI : FIXED_PLAIN;
    const int64_t rows = MIN(m, 4), code_bytes = kind == K_Q4 ? 3 * cols : 4 * cols;
    uint8_t* scratch = moe_cpu_fixed_scratch((size_t)rows * (code_bytes + 8 * groups));
    if (scratch == NULL) return 0;
    float* scales = (float*)(scratch + rows * code_bytes);
    const fixed_rows x = {(int16_t*)scratch, (int16_t*)scratch + rows * cols, (int8_t*)scratch, scales,
                          scales + rows * groups};
    for (int64_t i0 = 0; i0 < m; i0 += 4) {
        const int mm = (int)MIN(4, m - i0);
        const fixed_key key = {kind == K_Q4 ? FIXED_LAYOUT_AVX512_Q4 : FIXED_LAYOUT_AVX512_Q8, w->group_size, rows, mm, cols};
        if (!moe_cpu_fixed_scratch_holds(&key, a + i0 * lda, lda)) {
            const int prepared = prepare_fixed_avx512(kind, mm, a + i0 * lda, lda, cols, w->group_size, &x);
            moe_cpu_fixed_scratch_prepared(prepared ? &key : NULL, a + i0 * lda, lda);
            if (!prepared) return 0;
        }
        fixed_rows_fn* const rows_fn = fixed_rows_table[kind == K_Q8][level][mm - 1][gsi];
        for (int64_t j = 0; j < n; j += 4) {
            const int64_t nb = MIN(4, n - j);
            __m512 v[4][4];  // [weight row][activation row]
            int done[4];
            rows_fn(w, row0 + j, nb, &x, v, done);
            for (int i = 0; i < mm; i++) {
                float* ci = c + (i0 + i) * ldc + j;
                if (nb == 4) {
                    _mm_storeu_ps(ci, sum_lanes4(v[0][i], v[1][i], v[2][i], v[3][i]));
                } else {
                    for (int64_t q = 0; q < nb; q++) ci[q] = sum_lanes(v[q][i]);
                }
            }
            for (int64_t q = 0; q < nb; q++)
                if (!done[q])
                    moe_cpu_row_float_avx512(kind, mm, w, row0 + j + q, a + i0 * lda, lda, c + i0 * ldc + j + q, ldc);
        }
    }
    return 1;
}

#endif
