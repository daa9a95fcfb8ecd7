// The format kernels with AVX2, FMA and F16C: 8-lane float vectors. Their drivers (the
// loops over rows) are drivers.h's, included at the end.
#include "internal.h"

#ifdef MOE_CPU_FORMATS_X86

// Chunk -> v[0..3] (8 elements each), scale and bias applied.
INLINE T256 void unpack_avx2(const int kind, const moe_cpu_matrix* w, const group_cursor* gc, int64_t r,
                             const segment_params* p, int64_t seg, int64_t k0, __m256* v) {
    const uint8_t* row = row_data(w, r);
    if (kind == K_F32) {
        for (int q = 0; q < 4; q++) v[q] = _mm256_loadu_ps((const float*)row + k0 + 8 * q);
        return;
    }
    if (kind == K_F16) {
        const __m128i* p = (const __m128i*)(row + 2 * k0);
        for (int q = 0; q < 4; q++) v[q] = _mm256_cvtph_ps(_mm_loadu_si128(p + q));
        return;
    }
    if (kind == K_BF16) {
        const __m128i* p = (const __m128i*)(row + 2 * k0);
        for (int q = 0; q < 4; q++)
            v[q] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p + q)), 16));
        return;
    }
    if (kind == K_AFFINE_ANY) {
        float tmp[CHUNK];
        unpack_chunk_portable(w, gc, r, k0, tmp);
        for (int q = 0; q < 4; q++) v[q] = _mm256_loadu_ps(tmp + 8 * q);
        return;
    }
    const int64_t g = (k0 - seg) >> gc->shift;
    const float s = p->s[g], b = kind == K_MXFP4 ? 0.0f : p->b[g];
    __m128i e[4];  // 8 codes each, one byte per code, in the low 8 bytes
    if (kind == K_Q8) {
        for (int q = 0; q < 4; q++) e[q] = _mm_loadl_epi64((const __m128i*)(row + k0 + 8 * q));
    } else {  // split layout: low nibbles are elements 0-15, high nibbles 16-31
        const __m128i x = _mm_loadu_si128((const __m128i*)(row + (k0 >> 1)));
        const __m128i mask = _mm_set1_epi8(0x0f);
        const __m128i lo = _mm_and_si128(x, mask), hi = _mm_and_si128(_mm_srli_epi16(x, 4), mask);
        e[0] = lo;
        e[1] = _mm_srli_si128(lo, 8);
        e[2] = hi;
        e[3] = _mm_srli_si128(hi, 8);
    }
    if (kind == K_MXFP4) {
        const __m256 magnitudes = _mm256_loadu_ps(e2m1_values), scale = _mm256_set1_ps(s);
        for (int q = 0; q < 4; q++) {
            const __m256i code = _mm256_cvtepu8_epi32(e[q]);
            const __m256 mag = _mm256_permutevar8x32_ps(magnitudes, _mm256_and_si256(code, _mm256_set1_epi32(7)));
            const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(8)), 28);
            v[q] = _mm256_mul_ps(_mm256_xor_ps(mag, _mm256_castsi256_ps(sign)), scale);
        }
    } else {
        const __m256 scale = _mm256_set1_ps(s), bias = _mm256_set1_ps(b);
        for (int q = 0; q < 4; q++)
            v[q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e[q])), scale, bias);
    }
}

INLINE T256 void row_kernel(const int kind, const int MM, const moe_cpu_matrix* w, int64_t r,
                            const float* a, int64_t lda, float* c, int64_t ldc) {
    const int64_t cols = w->cols, kv = chunked_cols(w);
    const group_cursor gc = w->group_size > 0 ? group_cursor_for(w, r) : (group_cursor){0};
    __m256 acc[4][2];
    for (int i = 0; i < MM; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    segment_params p;
    for (int64_t seg = 0; seg < kv;) {
        const int64_t end = load_segment(&gc, is_dense(kind), seg, kv, &p);
        for (int64_t k0 = seg; k0 < end; k0 += CHUNK) {
            if (is_dense(kind)) {
                const char* next = (const char*)row_data(w, r) + dense_bytes(kind) * k0 + WIDE_PREFETCH;
                _mm_prefetch(next, _MM_HINT_T0);
                if (kind == K_F32) _mm_prefetch(next + 64, _MM_HINT_T0);  // a chunk is two lines
            }
            __m256 v[4];
            unpack_avx2(kind, w, &gc, r, &p, seg, k0, v);
            for (int i = 0; i < MM; i++) {
                const float* x = a + i * lda + k0;
                for (int q = 0; q < 4; q++)
                    acc[i][q & 1] = _mm256_fmadd_ps(v[q], _mm256_loadu_ps(x + 8 * q), acc[i][q & 1]);
            }
        }
        seg = end;
    }
    for (int i = 0; i < MM; i++) {
        float s = hsum8(_mm256_add_ps(acc[i][0], acc[i][1]));
        for (int64_t x = kv; x < cols; x++) s += dense_element(w, r, x) * a[i * lda + x];
        c[i * ldc] = s;
    }
}

INLINE T256 void store_chunk(const int kind, const moe_cpu_matrix* w, const group_cursor* gc, int64_t r,
                             const segment_params* p, int64_t seg, int64_t k0, float* o) {
    __m256 v[4];
    unpack_avx2(kind, w, gc, r, p, seg, k0, v);
    for (int q = 0; q < 4; q++) _mm256_storeu_ps(o + 8 * q, v[q]);
}

// The factored affine row of avx512.c's row_affine_kernel, 8 lanes wide.
INLINE T256 void row_affine_kernel(const int kind, const int MM, const int GS, const moe_cpu_matrix* w, int64_t r,
                                   const float* a, int64_t lda, const float* xsum, float* c, int64_t ldc) {
    const int64_t cols = w->cols, gs = GS ? GS : w->group_size, groups = cols / gs;
    const group_cursor gc = group_cursor_for(w, r);
    const uint8_t* row = row_data(w, r);
    float scales[FACTORED_SUMS / 4], biases[FACTORED_SUMS / 4];
    group_floats(gc.scales, gc.type, groups, scales);
    group_floats(gc.biases, gc.type, groups, biases);
    __m256 total[4][2];
    for (int i = 0; i < MM; i++) total[i][0] = total[i][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const int64_t k0 = g * gs;
        if (kind == K_Q4) _mm_prefetch((const char*)row + (k0 >> 1) + CODE_PREFETCH, _MM_HINT_T0);
        if (kind == K_Q8)
            for (int64_t l = 0; l < gs; l += 64) _mm_prefetch((const char*)row + k0 + l + WIDE_PREFETCH, _MM_HINT_T0);
        __m256 acc[4][2];
        for (int i = 0; i < MM; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        for (int64_t k = k0; k < k0 + gs; k += CHUNK) {
            __m256 v[4];
            if (kind == K_Q4) {
                // Split layout: widening 8 bytes gives elements j (low nibbles) and j + 16
                // (high nibbles) of 8 lanes at once, one mask or shift apart.
                for (int h = 0; h < 2; h++) {
                    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(row + (k >> 1) + 8 * h)));
                    v[h] = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
                    v[2 + h] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
                }
            } else {
                for (int q = 0; q < 4; q++)
                    v[q] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(row + k + 8 * q))));
            }
            for (int q = 0; q < 4; q++)
                for (int i = 0; i < MM; i++)
                    acc[i][q & 1] = _mm256_fmadd_ps(v[q], _mm256_loadu_ps(a + i * lda + k + 8 * q), acc[i][q & 1]);
        }
        const __m256 scale = _mm256_set1_ps(scales[g]);
        for (int i = 0; i < MM; i++) {
            total[i][0] = _mm256_fmadd_ps(acc[i][0], scale, total[i][0]);
            total[i][1] = _mm256_fmadd_ps(acc[i][1], scale, total[i][1]);
        }
    }
    for (int i = 0; i < MM; i++) {
        // The biases' term, sum over groups of bias * the group's activation sum.
        __m256 t = _mm256_add_ps(total[i][0], total[i][1]);
        int64_t g = 0;
        for (; g + 8 <= groups; g += 8)
            t = _mm256_fmadd_ps(_mm256_loadu_ps(biases + g), _mm256_loadu_ps(xsum + i * groups + g), t);
        float s = hsum8(t);
        for (; g < groups; g++) s += biases[g] * xsum[i * groups + g];
        c[i * ldc] = s;
    }
}

// The float row of any kind, for the rare rows the fixed-point product leaves (one
// instance: kind and activation rows are run-time values here).
T256 void moe_cpu_row_float_avx2(int kind, int mm, const moe_cpu_matrix* w, int64_t r, const float* a, int64_t lda,
                                 float* c, int64_t ldc) {
    row_kernel(kind, mm, w, r, a, lda, c, ldc);
}

INLINE T256 int matmul_fixed(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                             int64_t row0, float* c, int64_t ldc) {
    return moe_cpu_matmul_fixed_avx2(m, n, a, lda, w, row0, c, ldc);
}

#define DRIVER_TARGET T256
#define DRIVER_DENSE 1
#include "drivers.h"

const moe_cpu_format_kernels moe_cpu_formats_avx2 = {matmul, dequantize};

#endif
