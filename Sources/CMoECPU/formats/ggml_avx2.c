// Decode products of ggml's common block types with AVX2 + FMA + F16C: Q8_0, Q4_0,
// IQ4_NL, MXFP4 (ggml's), Q4_K and Q6_K. Activations stay float32: a block's codes become
// 32 signed bytes, then floats, multiplied with the activations, and the block's (or
// sub-block's) float32 scale is applied to that sum, with K-quants' minimum terms taken
// from each activation row's sums over 32 elements. The other types (and rows too long
// for the stack's sums) go through ggml.c's portable product.
#include "internal.h"

#ifdef MOE_CPU_FORMATS_X86

#define T256 __attribute__((target("avx2,fma,f16c")))

enum { MAX_ROWS = 4 };
// Floats of 32-element activation sums kept on the stack (K-quants' minimum terms).
enum { CHUNK_SUMS = 4096 };

INLINE T256 float half_to_float(const uint8_t* p) { return _cvtsh_ss(load_u16(p, 0)); }

INLINE T256 float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// 32 signed byte codes times elements [0, 32) of each of MM activation rows (row i at
// x + i * lda): lo[i] sums elements 0-15, hi[i] elements 16-31, 8 lanes each.
INLINE T256 void dot32(const int MM, __m256i codes, const float* x, int64_t lda, __m256* lo, __m256* hi) {
    const __m128i c0 = _mm256_castsi256_si128(codes), c1 = _mm256_extracti128_si256(codes, 1);
    const __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c0));
    const __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c0, 8)));
    const __m256 f2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c1));
    const __m256 f3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c1, 8)));
    for (int i = 0; i < MM; i++) {
        const float* xi = x + i * lda;
        lo[i] = _mm256_fmadd_ps(f1, _mm256_loadu_ps(xi + 8), _mm256_mul_ps(f0, _mm256_loadu_ps(xi)));
        hi[i] = _mm256_fmadd_ps(f3, _mm256_loadu_ps(xi + 24), _mm256_mul_ps(f2, _mm256_loadu_ps(xi + 16)));
    }
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

// One 32-element block of format F: its codes as signed bytes and its scale.
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
    default: {  // MXFP4: 2^(e - 128) times doubled E2M1 values, as ggml scales them
        const uint8_t e = b[0];
        *d = from_bits(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
        return lookup(mxfp4_table, split_nibbles(b + 1));
    }
    }
}

// Row r of w against MM activation rows, for 32-element block types.
INLINE T256 void row_block32(const int F, const int MM, const moe_cpu_matrix* w, int64_t r, const float* a,
                             int64_t lda, float* c, int64_t ldc) {
    const int bytes = ggml_block_shape_of(F).bytes;
    const uint8_t* row = row_data(w, r);
    __m256 acc[MAX_ROWS], lo[MAX_ROWS], hi[MAX_ROWS];
    for (int i = 0; i < MM; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < w->cols; k += 32, row += bytes) {
        _mm_prefetch((const char*)row + 1024, _MM_HINT_T0);
        float d;
        const __m256i codes = block32(F, row, &d);
        dot32(MM, codes, a + k, lda, lo, hi);
        const __m256 vd = _mm256_set1_ps(d);
        for (int i = 0; i < MM; i++) acc[i] = _mm256_fmadd_ps(vd, _mm256_add_ps(lo[i], hi[i]), acc[i]);
    }
    for (int i = 0; i < MM; i++) c[i * ldc] = hsum(acc[i]);
}

// Q4_K: per 32-element sub-block j, value = (d * sc_j) * q - (dmin * m_j), so the row's
// product is sum_j (d * sc_j) * (q . x)_j - (dmin * m_j) * (sum of x)_j; xs[i * chunks + c]
// is activation row i's sum over elements [32c, 32c + 32).
INLINE T256 void row_q4_k(const int MM, const moe_cpu_matrix* w, int64_t r, const float* a, int64_t lda,
                          const float* xs, int64_t chunks, float* c, int64_t ldc) {
    const uint8_t* b = row_data(w, r);
    __m256 acc[MAX_ROWS], lo[MAX_ROWS], hi[MAX_ROWS];
    float mins[MAX_ROWS];
    for (int i = 0; i < MM; i++) acc[i] = _mm256_setzero_ps(), mins[i] = 0.0f;
    const __m256i mask = _mm256_set1_epi8(0x0f);
    for (int64_t k = 0; k < w->cols; k += 256, b += 144) {
        _mm_prefetch((const char*)b + 1024, _MM_HINT_T0);
        const float d = half_to_float(b), dmin = half_to_float(b + 2);
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i*)(b + 16 + 32 * j));
            for (int half = 0; half < 2; half++) {
                const int sub = 2 * j + half;
                int sc, m;
                if (sub < 4) {
                    sc = b[4 + sub] & 63;
                    m = b[8 + sub] & 63;
                } else {
                    sc = (b[8 + sub] & 0x0f) | ((b[sub] >> 6) << 4);
                    m = (b[8 + sub] >> 4) | ((b[4 + sub] >> 6) << 4);
                }
                const __m256i codes = half ? _mm256_and_si256(_mm256_srli_epi16(q, 4), mask) : _mm256_and_si256(q, mask);
                const int64_t e = k + 32 * sub;
                dot32(MM, codes, a + e, lda, lo, hi);
                const __m256 vd = _mm256_set1_ps(d * sc);
                const float dm = dmin * m;
                for (int i = 0; i < MM; i++) {
                    acc[i] = _mm256_fmadd_ps(vd, _mm256_add_ps(lo[i], hi[i]), acc[i]);
                    mins[i] = fmaf(dm, xs[i * chunks + e / 32], mins[i]);
                }
            }
        }
    }
    for (int i = 0; i < MM; i++) c[i * ldc] = hsum(acc[i]) - mins[i];
}

// Q6_K: per 128 elements, 64 bytes of low nibbles, 32 bytes of 2-bit high parts; 16
// signed 8-bit scales per super-block, one per 16 elements: value = d * sc * (q - 32).
INLINE T256 void row_q6_k(const int MM, const moe_cpu_matrix* w, int64_t r, const float* a, int64_t lda,
                          float* c, int64_t ldc) {
    const uint8_t* b = row_data(w, r);
    __m256 acc[MAX_ROWS], lo[MAX_ROWS], hi[MAX_ROWS];
    for (int i = 0; i < MM; i++) acc[i] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0f), top2 = _mm256_set1_epi8(0x30), bias = _mm256_set1_epi8(32);
    for (int64_t k = 0; k < w->cols; k += 256, b += 210) {
        _mm_prefetch((const char*)b + 1024, _MM_HINT_T0);
        const float d = half_to_float(b + 208);
        const int8_t* sc = (const int8_t*)(b + 192);
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
            const __m256i l0 = _mm256_loadu_si256((const __m256i*)ql), l1 = _mm256_loadu_si256((const __m256i*)(ql + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i*)qh);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), top2));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(h, 2), top2));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(h, top2));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                   _mm256_and_si256(_mm256_srli_epi16(h, 2), top2));
            for (int p = 0; p < 4; p++) {
                const int64_t e = k + 128 * half + 32 * p;
                dot32(MM, _mm256_sub_epi8(q[p], bias), a + e, lda, lo, hi);
                const __m256 d0 = _mm256_set1_ps(d * sc[8 * half + 2 * p]), d1 = _mm256_set1_ps(d * sc[8 * half + 2 * p + 1]);
                for (int i = 0; i < MM; i++) acc[i] = _mm256_fmadd_ps(d1, hi[i], _mm256_fmadd_ps(d0, lo[i], acc[i]));
            }
        }
    }
    for (int i = 0; i < MM; i++) c[i * ldc] = hsum(acc[i]);
}

// Sums of each activation row over 32-element chunks, in element order.
static void chunk_sums(const float* a, int64_t lda, int64_t rows, int64_t cols, float* xs) {
    const int64_t chunks = cols / 32;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t g = 0; g < chunks; g++) {
            const float* x = a + i * lda + 32 * g;
            float s = 0.0f;
            for (int q = 0; q < 32; q++) s += x[q];
            xs[i * chunks + g] = s;
        }
}

T256 int moe_cpu_ggml_matmul_avx2(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                                  int64_t row0, float* c, int64_t ldc) {
    const int F = w->format;
    switch (F) {
    case MOE_FORMAT_GGML_Q8_0:
    case MOE_FORMAT_GGML_Q4_0:
    case MOE_FORMAT_GGML_IQ4_NL:
    case MOE_FORMAT_GGML_MXFP4:
    case MOE_FORMAT_GGML_Q4_K:
    case MOE_FORMAT_GGML_Q6_K: break;
    default: return 0;
    }
    const int64_t chunks = w->cols / 32;
    if (F == MOE_FORMAT_GGML_Q4_K && chunks * MAX_ROWS > CHUNK_SUMS) return 0;
    float xs[CHUNK_SUMS];
    for (int64_t i0 = 0; i0 < m; i0 += MAX_ROWS) {
        const int mm = (int)MIN(MAX_ROWS, m - i0);
        const float* ai = a + i0 * lda;
        float* ci = c + i0 * ldc;
        if (F == MOE_FORMAT_GGML_Q4_K) chunk_sums(ai, lda, mm, w->cols, xs);
        for (int64_t j = 0; j < n; j++) {
#define ROW_(MM)                                                                                         \
    switch (F) {                                                                                         \
    case MOE_FORMAT_GGML_Q8_0: row_block32(MOE_FORMAT_GGML_Q8_0, MM, w, row0 + j, ai, lda, ci + j, ldc); break; \
    case MOE_FORMAT_GGML_Q4_0: row_block32(MOE_FORMAT_GGML_Q4_0, MM, w, row0 + j, ai, lda, ci + j, ldc); break; \
    case MOE_FORMAT_GGML_IQ4_NL: row_block32(MOE_FORMAT_GGML_IQ4_NL, MM, w, row0 + j, ai, lda, ci + j, ldc); break; \
    case MOE_FORMAT_GGML_MXFP4: row_block32(MOE_FORMAT_GGML_MXFP4, MM, w, row0 + j, ai, lda, ci + j, ldc); break; \
    case MOE_FORMAT_GGML_Q4_K: row_q4_k(MM, w, row0 + j, ai, lda, xs, chunks, ci + j, ldc); break;                 \
    default: row_q6_k(MM, w, row0 + j, ai, lda, ci + j, ldc); break;                                                \
    }
            switch (mm) {
            case 1: ROW_(1) break;
            case 2: ROW_(2) break;
            case 3: ROW_(3) break;
            default: ROW_(4) break;
            }
#undef ROW_
        }
    }
    return 1;
}

#endif
