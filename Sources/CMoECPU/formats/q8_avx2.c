// Decode products against 8-bit activations (moe_cpu_matmul_q8) with AVX2: each weight
// block's codes meet the activation block's codes in integers, as ggml's dot products
// do. Per 32 elements, vpmaddubsw multiplies unsigned by signed bytes into pairs of
// int16 and vpmaddwd sums them into int32; signed weight codes go through the sign trick
// (|w| times x with w's sign), whose int16 pairs stay below 2 * 128 * 127 < 2^15, and the
// unsigned codes here are at most 6 bits (63 * 127 * 2 < 2^15). Affine 8-bit codes
// (0-255, whose pairs could reach 255 * 127 * 2 and saturate) are taken as q - 128 with
// 128 * scale moved into the bias. The block's int32 sum is exact; it is converted to float
// and scaled by d_w * d_x once per 32 elements (each activation block has its own d).
// Terms of a weight's offset (affine biases, K-quants' minimums) multiply the activation
// block's sum d_x * sum q_x.
#include "ggml_avx2_blocks.h"

#include <stdlib.h>

#ifdef MOE_CPU_FORMATS_X86

enum { Q8_ROWS = 4 };
// Bytes ahead of the weight block being read that a row prefetches.
enum { Q8_PREFETCH = 1024 };

// sum over the block of w_i * x_i, w signed bytes (-128 included: |-128| reads as the
// unsigned 128 in vpmaddubsw), as 8 int32 lanes.
INLINE T256 __m256i dot_signed(__m256i w, __m256i x) {
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// The same for unsigned codes below 64.
INLINE T256 __m256i dot_unsigned(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

INLINE T256 float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

INLINE T256 __m256i load_x(const moe_cpu_q8_rows* a, int i, int64_t k) {
    return _mm256_loadu_si256((const __m256i*)(a->codes + i * a->stride + k));
}
// Element offsets are never negative: shifts, not the signed division's extra instructions.
INLINE float x_scale(const moe_cpu_q8_rows* a, int i, int64_t k) { return a->scales[(uint64_t)(i * a->stride + k) >> 5]; }
INLINE float x_sum(const moe_cpu_q8_rows* a, int i, int64_t k) { return a->sums[(uint64_t)(i * a->stride + k) >> 5]; }

// Our MLX mxfp4 (E8M0 scale per 32, 255 NaN) against doubled E2M1 codes: 2^(s - 128).
INLINE float e8m0_half_scale(uint8_t s) {
    if (s == 255) return NAN;
    return from_bits(s < 2 ? 0x00200000u << s : (uint32_t)(s - 1) << 23);
}

// Block-of-32 formats: the block at element k as signed codes (Q4_0: unsigned, 0-15, see
// eights), its scale d and the bias b that multiplies the activation block's sum (0 for
// all but affine).
INLINE T256 __m256i b32_codes(const int F, const int G64, const moe_cpu_matrix* w, const uint8_t* row,
                              const group_cursor* gc, int64_t k, float* d, float* b) {
    if (!G64) *b = 0.0f;
    switch (F) {
    case MOE_FORMAT_AFFINE: {
        const int64_t g = k >> gc->shift;
        if (!G64) *d = scalar_at_f16c(gc->scales, gc->type, g);
        if (w->bits == 8) {
            _mm_prefetch((const char*)row + k + Q8_PREFETCH, _MM_HINT_T0);
            if (!G64) *b = fmaf(128.0f, *d, scalar_at_f16c(gc->biases, gc->type, g));
            return _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(row + k)), _mm256_set1_epi8((char)0x80));
        }
        _mm_prefetch((const char*)row + ((uint64_t)k >> 1) + Q8_PREFETCH, _MM_HINT_T0);
        if (!G64) *b = scalar_at_f16c(gc->biases, gc->type, g);
        return split_nibbles(row + ((uint64_t)k >> 1));
    }
    case MOE_FORMAT_MXFP4:
        _mm_prefetch((const char*)row + ((uint64_t)k >> 1) + Q8_PREFETCH, _MM_HINT_T0);
        *d = e8m0_half_scale(gc->scales[k >> 5]);
        return lookup(mxfp4_table, split_nibbles(row + ((uint64_t)k >> 1)));
    case MOE_FORMAT_GGML_Q4_0: {
        const uint8_t* blk = row + ((uint64_t)k >> 5) * 18;
        _mm_prefetch((const char*)blk + Q8_PREFETCH, _MM_HINT_T0);
        *d = half_to_float(blk);
        return split_nibbles(blk + 2);
    }
    default: {
        const uint8_t* blk = row + ((uint64_t)k >> 5) * ggml_block_shape_of(F).bytes;
        _mm_prefetch((const char*)blk + Q8_PREFETCH, _MM_HINT_T0);
        return block32(F, blk, d);
    }
    }
}

// Two accumulators per activation row (even and odd blocks), so that consecutive blocks'
// multiply-adds do not wait on each other's latency. G64: affine groups of 64 or more,
// whose scale and bias the two blocks of a step share, converted once per group rather
// than once per block (their conversions cost as much as a block's integer products).
INLINE T256 void row_b32(const int F, const int MM, const int G64, const int EIGHTS, const moe_cpu_matrix* w, int64_t r,
                         const moe_cpu_q8_rows* a, const __m256i* eights, float* c, int64_t ldc) {
    const uint8_t* row = row_data(w, r);
    group_cursor gc = {0};
    if (F == MOE_FORMAT_AFFINE || F == MOE_FORMAT_MXFP4) gc = group_cursor_for(w, r);
    __m256 acc[2][Q8_ROWS];
    float bias[Q8_ROWS];
    for (int i = 0; i < MM; i++) acc[0][i] = acc[1][i] = _mm256_setzero_ps(), bias[i] = 0.0f;
    for (int64_t k0 = 0; k0 < w->cols; k0 += 64) {
        float dg = 0.0f, bg = 0.0f;
        if (G64) {
            const int64_t g = k0 >> gc.shift;
            dg = scalar_at_f16c(gc.scales, gc.type, g);
            const float b = scalar_at_f16c(gc.biases, gc.type, g);
            bg = w->bits == 8 ? fmaf(128.0f, dg, b) : b;
        }
#pragma clang loop unroll(full)
        for (int u = 0; u < 2; u++) {
            const int64_t k = k0 + 32 * u;
            if (u == 1 && k >= w->cols) break;
            float d = dg, b = bg;
            const __m256i codes = b32_codes(F, G64, w, row, &gc, k, &d, &b);
            for (int i = 0; i < MM; i++) {
                const __m256 s = _mm256_set1_ps(d * x_scale(a, i, k));
                const __m256i dot =
                    F != MOE_FORMAT_GGML_Q4_0 ? dot_signed(codes, load_x(a, i, k))
                    : EIGHTS ? _mm256_sub_epi32(dot_unsigned(codes, load_x(a, i, k)), eights[i * (w->cols >> 5) + (k >> 5)])
                             : dot_signed(_mm256_sub_epi8(codes, _mm256_set1_epi8(8)), load_x(a, i, k));
                acc[u][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, acc[u][i]);
                if (F == MOE_FORMAT_AFFINE) bias[i] = fmaf(b, x_sum(a, i, k), bias[i]);
            }
        }
    }
    for (int i = 0; i < MM; i++) c[i * ldc] = hsum8(_mm256_add_ps(acc[0][i], acc[1][i])) + bias[i];
}

// Q4_K / Q5_K: sub-block j of 32 is (d * sc_j) * q - dmin * m_j, q unsigned. A block's
// eight sub-blocks' float factors are computed together, one vector each: the scales'
// products with the activation blocks' scales, and the minimums' terms, which accumulate
// in a vector (lane j: sub-blocks j of every block) rather than in a serial chain of scalar
// multiply-adds that took as long as the row's vector work.
INLINE T256 void row_q45_k(const int F, const int MM, const moe_cpu_matrix* w, int64_t r, const moe_cpu_q8_rows* a,
                           float* c, int64_t ldc) {
    const int bytes = ggml_block_shape_of(F).bytes;
    const uint8_t* b = row_data(w, r);
    __m256 acc[2][Q8_ROWS], mins[Q8_ROWS];
    for (int i = 0; i < MM; i++) acc[0][i] = acc[1][i] = mins[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < w->cols; k += 256, b += bytes) {
        _mm_prefetch((const char*)b + Q8_PREFETCH, _MM_HINT_T0);
        int32_t sc[8], m[8];
#pragma clang loop unroll(full)
        for (int sub = 0; sub < 8; sub++) k_scale_min(sub, b + 4, &sc[sub], &m[sub]);
        const __m256 ds = _mm256_mul_ps(_mm256_set1_ps(half_to_float(b)),
                                        _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i*)sc)));
        const __m256 dm = _mm256_mul_ps(_mm256_set1_ps(half_to_float(b + 2)),
                                        _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i*)m)));
        float s[Q8_ROWS][8];
        for (int i = 0; i < MM; i++) {
            const uint64_t blk = (uint64_t)(i * a->stride + k) >> 5;
            _mm256_storeu_ps(s[i], _mm256_mul_ps(ds, _mm256_loadu_ps(a->scales + blk)));
            mins[i] = _mm256_fmadd_ps(dm, _mm256_loadu_ps(a->sums + blk), mins[i]);
        }
#pragma clang loop unroll(full)
        for (int sub = 0; sub < 8; sub++) {
            const __m256i codes = k_codes(F, b, sub);
            const int64_t e = k + 32 * sub;
            for (int i = 0; i < MM; i++)
                acc[sub & 1][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_unsigned(codes, load_x(a, i, e))),
                                                  _mm256_set1_ps(s[i][sub]), acc[sub & 1][i]);
        }
    }
    for (int i = 0; i < MM; i++) c[i * ldc] = hsum8(_mm256_add_ps(acc[0][i], acc[1][i])) - hsum8(mins[i]);
}

// Q6_K: d * sc * (q - 32), a signed 8-bit scale per 16 elements: the int16 pairs of each
// half of a 32-element block are weighted by their scale in vpmaddwd.
INLINE T256 void row_q6_k(const int MM, const moe_cpu_matrix* w, int64_t r, const moe_cpu_q8_rows* a,
                          float* c, int64_t ldc) {
    const uint8_t* b = row_data(w, r);
    __m256 acc[2][Q8_ROWS];
    for (int i = 0; i < MM; i++) acc[0][i] = acc[1][i] = _mm256_setzero_ps();
    const __m256i offset = _mm256_set1_epi8(32);
    for (int64_t k = 0; k < w->cols; k += 256, b += 210) {
        _mm_prefetch((const char*)b + Q8_PREFETCH, _MM_HINT_T0);
        const float d = half_to_float(b + 208);
        const int8_t* sc = (const int8_t*)(b + 192);
        for (int half = 0; half < 2; half++) {
            __m256i q[4];
            q6_k_codes(b, half, q);
#pragma clang loop unroll(full)
            for (int p = 0; p < 4; p++) {
                const __m256i codes = _mm256_sub_epi8(q[p], offset);
                const __m256i scales = _mm256_set_m128i(_mm_set1_epi16(sc[8 * half + 2 * p + 1]),
                                                        _mm_set1_epi16(sc[8 * half + 2 * p]));
                const int64_t e = k + 128 * half + 32 * p;
                for (int i = 0; i < MM; i++) {
                    const __m256i x = load_x(a, i, e);
                    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(codes, codes), _mm256_sign_epi8(x, codes));
                    const __m256 s = _mm256_set1_ps(d * x_scale(a, i, e));
                    acc[p & 1][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, scales)), s,
                                                    acc[p & 1][i]);
                }
            }
        }
    }
    for (int i = 0; i < MM; i++) c[i * ldc] = hsum8(_mm256_add_ps(acc[0][i], acc[1][i]));
}

T256 int moe_cpu_q8_matmul_avx2(int64_t m, int64_t n, const moe_cpu_q8_rows* a, const moe_cpu_matrix* w,
                                int64_t row0, float* c, int64_t ldc) {
    if (!moe_cpu_q8_supported(w) || w->cols % 32) return 0;
    const int F = w->format;
    // Q4_0's codes are q - 8 with q unsigned: the sign trick's two extra instructions per
    // block become one subtraction of 8 * (the activation block's sums over each lane's
    // elements), computed once per call for all rows. The lanes' integers are the same.
    const int64_t blocks = w->cols >> 5;
    __m256i* eights = NULL;
    if (F == MOE_FORMAT_GGML_Q4_0) {
        // Without memory for them, the sign trick: the same integers.
        eights = aligned_alloc(32, (size_t)(MIN(m, Q8_ROWS) * blocks) * sizeof(__m256i));
    }
    for (int64_t i0 = 0; i0 < m; i0 += Q8_ROWS) {
        const int mm = (int)MIN(Q8_ROWS, m - i0);
        const moe_cpu_q8_rows ai = {a->codes + i0 * a->stride, a->scales + i0 * a->stride / 32,
                                    a->sums + i0 * a->stride / 32, a->stride};
        float* ci = c + i0 * ldc;
        if (eights)
            for (int i = 0; i < mm; i++)
                for (int64_t b = 0; b < blocks; b++)
                    eights[i * blocks + b] = dot_unsigned(_mm256_set1_epi8(8), load_x(&ai, i, 32 * b));
        const int g64 = F == MOE_FORMAT_AFFINE && w->group_size >= 64;
        for (int64_t j = 0; j < n; j++) {
#define B32_(FMT, MM)                                                                                             \
    if (g64) row_b32(FMT, MM, 1, 0, w, row0 + j, &ai, eights, ci + j, ldc);                                                   \
    else row_b32(FMT, MM, 0, 0, w, row0 + j, &ai, eights, ci + j, ldc);
#define ROW_(MM)                                                                                                  \
    switch (F) {                                                                                                  \
    case MOE_FORMAT_AFFINE: B32_(MOE_FORMAT_AFFINE, MM) break;                                                    \
    case MOE_FORMAT_MXFP4: row_b32(MOE_FORMAT_MXFP4, MM, 0, 0, w, row0 + j, &ai, eights, ci + j, ldc); break;              \
    case MOE_FORMAT_GGML_Q8_0: row_b32(MOE_FORMAT_GGML_Q8_0, MM, 0, 0, w, row0 + j, &ai, eights, ci + j, ldc); break;        \
    case MOE_FORMAT_GGML_Q4_0:                                                                                    \
        if (eights) row_b32(MOE_FORMAT_GGML_Q4_0, MM, 0, 1, w, row0 + j, &ai, eights, ci + j, ldc);              \
        else row_b32(MOE_FORMAT_GGML_Q4_0, MM, 0, 0, w, row0 + j, &ai, eights, ci + j, ldc);                     \
        break;                                                                                                    \
    case MOE_FORMAT_GGML_IQ4_NL: row_b32(MOE_FORMAT_GGML_IQ4_NL, MM, 0, 0, w, row0 + j, &ai, eights, ci + j, ldc); break;    \
    case MOE_FORMAT_GGML_MXFP4: row_b32(MOE_FORMAT_GGML_MXFP4, MM, 0, 0, w, row0 + j, &ai, eights, ci + j, ldc); break;      \
    case MOE_FORMAT_GGML_Q4_K: row_q45_k(MOE_FORMAT_GGML_Q4_K, MM, w, row0 + j, &ai, ci + j, ldc); break;         \
    case MOE_FORMAT_GGML_Q5_K: row_q45_k(MOE_FORMAT_GGML_Q5_K, MM, w, row0 + j, &ai, ci + j, ldc); break;         \
    default: row_q6_k(MM, w, row0 + j, &ai, ci + j, ldc); break;                                                 \
    }
            ROWS_AS_CONSTANT(mm, ROW_)
#undef ROW_
#undef B32_
        }
    }
    free(eights);
    return 1;
}

#endif
