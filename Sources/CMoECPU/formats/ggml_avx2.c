// Decode products and prefill tiles of ggml's common block types with AVX2 + FMA + F16C:
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4 (ggml's), Q4_K, Q5_K and Q6_K.
// Activations stay float32: a block's codes become floats, multiplied with the
// activations, and the block's (or sub-block's) float32 scale is applied to that sum, with
// the minimum terms of Q4_1, Q5_1 and the K-quants taken from each activation row's sums
// over 32 elements. The tiles are ggml's values bit for bit (the same float32 operations
// as ggml.c's decoders). The other types (and rows too long for the stack's sums) go
// through ggml.c's portable code.
#include "ggml_avx2_blocks.h"

#ifdef MOE_CPU_FORMATS_X86


enum { MAX_ROWS = 4 };
// Floats of 32-element activation sums kept on the stack (K-quants' minimum terms).
enum { CHUNK_SUMS = 4096 };


// 32 codes as floats (f[q]: elements 8q to 8q + 7) times elements [0, 32) of each of MM
// activation rows (row i at x + i * lda): lo[i] sums elements 0-15, hi[i] 16-31.
INLINE T256 void dot32(const int MM, const __m256 f[4], const float* x, int64_t lda, __m256* lo, __m256* hi) {
    for (int i = 0; i < MM; i++) {
        const float* xi = x + i * lda;
        lo[i] = _mm256_fmadd_ps(f[1], _mm256_loadu_ps(xi + 8), _mm256_mul_ps(f[0], _mm256_loadu_ps(xi)));
        hi[i] = _mm256_fmadd_ps(f[3], _mm256_loadu_ps(xi + 24), _mm256_mul_ps(f[2], _mm256_loadu_ps(xi + 16)));
    }
}

// Codes reach float lanes by widening loads from memory: one shuffle-port instruction per
// 8 codes (a register's bytes would need extracts and shifts on that port first).
INLINE T256 void codes_i8(const int8_t* p, __m256 f[4]) {
    for (int q = 0; q < 4; q++) f[q] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8 * q))));
}

// Split nibbles (low nibbles of 16 bytes are elements 0-15, high ones 16-31) plus
// `offset`: two widening loads, the nibbles then taken apart in 32-bit lanes.
INLINE T256 void codes_nibbles(const uint8_t* p, int offset, __m256 f[4]) {
    const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
    const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8)));
    const __m256i mask = _mm256_set1_epi32(15), off = _mm256_set1_epi32(offset);
    f[0] = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_and_si256(b0, mask), off));
    f[1] = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_and_si256(b1, mask), off));
    f[2] = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_srli_epi32(b0, 4), off));
    f[3] = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_srli_epi32(b1, 4), off));
}



// Block b of a 32-element type as float codes (its scale is block_scale's).
INLINE T256 void block32_floats(const int F, const uint8_t* b, __m256 f[4]) {
    switch (F) {
    case MOE_FORMAT_GGML_Q8_0: codes_i8((const int8_t*)(b + 2), f); return;
    case MOE_FORMAT_GGML_Q4_0: codes_nibbles(b + 2, -8, f); return;
    case MOE_FORMAT_GGML_Q4_1: codes_nibbles(b + 4, 0, f); return;
    default: {  // the looked-up types: their bytes go through memory to be widened
        float d;
        int8_t codes[32] __attribute__((aligned(32)));
        _mm256_store_si256((__m256i*)codes, block32(F, b, &d));
        codes_i8(codes, f);
        return;
    }
    }
}

// The scales of blocks [0, n) (n <= 8) from b on, into d: float16 ones converted 8 at a
// time, so that each block then broadcasts its scale from memory (a load, where a
// conversion and broadcast per block would take three shuffle-port instructions).
INLINE T256 void block_scales(const int F, const uint8_t* b, int bytes, int n, float* d) {
    if (F == MOE_FORMAT_GGML_MXFP4) {
        for (int q = 0; q < n; q++) {
            const uint8_t e = b[q * bytes];
            d[q] = from_bits(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
        }
        return;
    }
    uint16_t h[8] = {0};
    for (int q = 0; q < n; q++) h[q] = load_u16(b + q * bytes, 0);
    _mm256_storeu_ps(d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)h)));
}

// Row r of w against MM activation rows, for 32-element block types. Q4_1 and Q5_1 add
// a minimum m per block: m times the block's activation sum (xs, as row_q45_k's).
INLINE T256 void row_block32(const int F, const int MM, const moe_cpu_matrix* w, int64_t r, const float* a,
                             int64_t lda, const float* xs, int64_t chunks, float* c, int64_t ldc) {
    const int bytes = ggml_block_shape_of(F).bytes;
    const int with_min = F == MOE_FORMAT_GGML_Q4_1 || F == MOE_FORMAT_GGML_Q5_1;
    const uint8_t* row = row_data(w, r);
    __m256 acc[MAX_ROWS], lo[MAX_ROWS], hi[MAX_ROWS], f[4];
    float mins[MAX_ROWS];
    for (int i = 0; i < MM; i++) acc[i] = _mm256_setzero_ps(), mins[i] = 0.0f;
    float d[8], m[8];
    for (int64_t k0 = 0; k0 < w->cols; k0 += 256) {
        const int n = (int)MIN(8, (w->cols - k0) / 32);
        block_scales(F, row, bytes, n, d);
        if (with_min) block_scales(F, row + 2, bytes, n, m);
        for (int q = 0; q < n; q++, row += bytes) {
            _mm_prefetch((const char*)row + 1024, _MM_HINT_T0);
            block32_floats(F, row, f);
            dot32(MM, f, a + k0 + 32 * q, lda, lo, hi);
            const __m256 vd = _mm256_broadcast_ss(d + q);
            for (int i = 0; i < MM; i++) {
                acc[i] = _mm256_fmadd_ps(vd, _mm256_add_ps(lo[i], hi[i]), acc[i]);
                if (with_min) mins[i] = fmaf(m[q], xs[i * chunks + k0 / 32 + q], mins[i]);
            }
        }
    }
    for (int i = 0; i < MM; i++) c[i * ldc] = hsum8(acc[i]) + mins[i];
}

// IQ4_XS: a 256-element block is eight iq4_nl sub-blocks (16 bytes of split nibbles each)
// with a 6-bit scale each, d * (ls - 32).
INLINE T256 void row_iq4_xs(const int MM, const moe_cpu_matrix* w, int64_t r, const float* a, int64_t lda, float* c,
                            int64_t ldc) {
    const uint8_t* b = row_data(w, r);
    __m256 acc[MAX_ROWS], lo[MAX_ROWS], hi[MAX_ROWS], f[4];
    for (int i = 0; i < MM; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < w->cols; k += 256, b += 136) {
        _mm_prefetch((const char*)b + 1024, _MM_HINT_T0);
        _mm_prefetch((const char*)b + 1088, _MM_HINT_T0);
        const float d = half_to_float(b);
        const uint16_t high = load_u16(b + 2, 0);
        for (int sub = 0; sub < 8; sub++) {
            const int ls = iq4_xs_scale(b, high, sub);
            int8_t codes[32] __attribute__((aligned(32)));
            _mm256_store_si256((__m256i*)codes, lookup(iq4nl_table, split_nibbles(b + 8 + 16 * sub)));
            codes_i8(codes, f);
            dot32(MM, f, a + k + 32 * sub, lda, lo, hi);
            const __m256 vd = _mm256_set1_ps(d * (float)(ls - 32));
            for (int i = 0; i < MM; i++) acc[i] = _mm256_fmadd_ps(vd, _mm256_add_ps(lo[i], hi[i]), acc[i]);
        }
    }
    for (int i = 0; i < MM; i++) c[i * ldc] = hsum8(acc[i]);
}


// Q4_K / Q5_K: per 32-element sub-block j, value = (d * sc_j) * q - (dmin * m_j), so the
// row's product is sum_j (d * sc_j) * (q . x)_j - (dmin * m_j) * (sum of x)_j;
// xs[i * chunks + c] is activation row i's sum over elements [32c, 32c + 32).
INLINE T256 void row_q45_k(const int F, const int MM, const moe_cpu_matrix* w, int64_t r, const float* a, int64_t lda,
                           const float* xs, int64_t chunks, float* c, int64_t ldc) {
    const int bytes = ggml_block_shape_of(F).bytes;
    const uint8_t* b = row_data(w, r);
    __m256 acc[MAX_ROWS], lo[MAX_ROWS], hi[MAX_ROWS], f[4];
    float mins[MAX_ROWS];
    for (int i = 0; i < MM; i++) acc[i] = _mm256_setzero_ps(), mins[i] = 0.0f;
    const __m256i mask = _mm256_set1_epi32(15), one = _mm256_set1_epi32(1);
    for (int64_t k = 0; k < w->cols; k += 256, b += bytes) {
        _mm_prefetch((const char*)b + 1024, _MM_HINT_T0);
        const float d = half_to_float(b), dmin = half_to_float(b + 2);
        // Q5_K's fifth bits: byte l of 32 holds bit `sub` of element 32 * sub + l.
        __m256i high[4];
        if (F == MOE_FORMAT_GGML_Q5_K)
            for (int q = 0; q < 4; q++) high[q] = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(b + 16 + 8 * q)));
        const uint8_t* qs = b + (F == MOE_FORMAT_GGML_Q5_K ? 48 : 16);
        for (int j = 0; j < 4; j++) {
            __m256i bytes32[4];
            for (int q = 0; q < 4; q++) bytes32[q] = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(qs + 32 * j + 8 * q)));
            for (int half = 0; half < 2; half++) {
                const int sub = 2 * j + half;
                for (int q = 0; q < 4; q++) {
                    __m256i code = half ? _mm256_srli_epi32(bytes32[q], 4) : _mm256_and_si256(bytes32[q], mask);
                    if (F == MOE_FORMAT_GGML_Q5_K)
                        code = _mm256_or_si256(code, _mm256_slli_epi32(
                            _mm256_and_si256(_mm256_srl_epi32(high[q], _mm_cvtsi32_si128(sub)), one), 4));
                    f[q] = _mm256_cvtepi32_ps(code);
                }
                int sc, m;
                k_scale_min(sub, b + 4, &sc, &m);
                const int64_t e = k + 32 * sub;
                dot32(MM, f, a + e, lda, lo, hi);
                const __m256 vd = _mm256_set1_ps(d * sc);
                const float dm = dmin * m;
                for (int i = 0; i < MM; i++) {
                    acc[i] = _mm256_fmadd_ps(vd, _mm256_add_ps(lo[i], hi[i]), acc[i]);
                    mins[i] = fmaf(dm, xs[i * chunks + e / 32], mins[i]);
                }
            }
        }
    }
    for (int i = 0; i < MM; i++) c[i * ldc] = hsum8(acc[i]) - mins[i];
}


// Q6_K: per 128 elements, 64 bytes of low nibbles, 32 bytes of 2-bit high parts; 16
// signed 8-bit scales per super-block, one per 16 elements: value = d * sc * (q - 32).
INLINE T256 void row_q6_k(const int MM, const moe_cpu_matrix* w, int64_t r, const float* a, int64_t lda,
                          float* c, int64_t ldc) {
    const uint8_t* b = row_data(w, r);
    __m256 acc[MAX_ROWS], lo[MAX_ROWS], hi[MAX_ROWS], f[4];
    for (int i = 0; i < MM; i++) acc[i] = _mm256_setzero_ps();
    const __m256i bias = _mm256_set1_epi8(32);
    for (int64_t k = 0; k < w->cols; k += 256, b += 210) {
        _mm_prefetch((const char*)b + 1024, _MM_HINT_T0);
        const float d = half_to_float(b + 208);
        const int8_t* sc = (const int8_t*)(b + 192);
        for (int half = 0; half < 2; half++) {
            __m256i q[4];
            q6_k_codes(b, half, q);
            int8_t codes[128] __attribute__((aligned(32)));
            for (int p = 0; p < 4; p++) _mm256_store_si256((__m256i*)(codes + 32 * p), _mm256_sub_epi8(q[p], bias));
            for (int p = 0; p < 4; p++) {
                const int64_t e = k + 128 * half + 32 * p;
                codes_i8(codes + 32 * p, f);
                dot32(MM, f, a + e, lda, lo, hi);
                const __m256 d0 = _mm256_set1_ps(d * sc[8 * half + 2 * p]), d1 = _mm256_set1_ps(d * sc[8 * half + 2 * p + 1]);
                for (int i = 0; i < MM; i++) acc[i] = _mm256_fmadd_ps(d1, hi[i], _mm256_fmadd_ps(d0, lo[i], acc[i]));
            }
        }
    }
    for (int i = 0; i < MM; i++) c[i * ldc] = hsum8(acc[i]);
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
    if (!ggml_avx2_has_products(F)) return 0;
    const int64_t chunks = w->cols / 32;
    const int mins = F == MOE_FORMAT_GGML_Q4_K || F == MOE_FORMAT_GGML_Q5_K || F == MOE_FORMAT_GGML_Q4_1 ||
                     F == MOE_FORMAT_GGML_Q5_1;
    if (mins && chunks * MAX_ROWS > CHUNK_SUMS) return 0;
    float xs[CHUNK_SUMS];
    for (int64_t i0 = 0; i0 < m; i0 += MAX_ROWS) {
        const int mm = (int)MIN(MAX_ROWS, m - i0);
        const float* ai = a + i0 * lda;
        float* ci = c + i0 * ldc;
        if (mins) chunk_sums(ai, lda, mm, w->cols, xs);
        for (int64_t j = 0; j < n; j++) {
#define B32_(FMT, MM) row_block32(FMT, MM, w, row0 + j, ai, lda, xs, chunks, ci + j, ldc);
#define ROW_(MM)                                                                                         \
    switch (F) {                                                                                         \
    case MOE_FORMAT_GGML_Q8_0: B32_(MOE_FORMAT_GGML_Q8_0, MM) break;                                     \
    case MOE_FORMAT_GGML_Q4_0: B32_(MOE_FORMAT_GGML_Q4_0, MM) break;                                     \
    case MOE_FORMAT_GGML_Q4_1: B32_(MOE_FORMAT_GGML_Q4_1, MM) break;                                     \
    case MOE_FORMAT_GGML_Q5_0: B32_(MOE_FORMAT_GGML_Q5_0, MM) break;                                     \
    case MOE_FORMAT_GGML_Q5_1: B32_(MOE_FORMAT_GGML_Q5_1, MM) break;                                     \
    case MOE_FORMAT_GGML_IQ4_NL: B32_(MOE_FORMAT_GGML_IQ4_NL, MM) break;                                 \
    case MOE_FORMAT_GGML_MXFP4: B32_(MOE_FORMAT_GGML_MXFP4, MM) break;                                   \
    case MOE_FORMAT_GGML_IQ4_XS: row_iq4_xs(MM, w, row0 + j, ai, lda, ci + j, ldc); break;                \
    case MOE_FORMAT_GGML_Q4_K: row_q45_k(MOE_FORMAT_GGML_Q4_K, MM, w, row0 + j, ai, lda, xs, chunks, ci + j, ldc); break; \
    case MOE_FORMAT_GGML_Q5_K: row_q45_k(MOE_FORMAT_GGML_Q5_K, MM, w, row0 + j, ai, lda, xs, chunks, ci + j, ldc); break; \
    default: row_q6_k(MM, w, row0 + j, ai, lda, ci + j, ldc); break;                                                \
    }
            ROWS_AS_CONSTANT(mm, ROW_)
#undef ROW_
#undef B32_
        }
    }
    return 1;
}

// 32 signed byte codes as floats times scale, minus `sub` (ggml's order: the product is
// exact, so one rounding, whether fused or not).
INLINE T256 void store32(__m256i codes, float scale, float sub, float* y) {
    const __m128i c0 = _mm256_castsi256_si128(codes), c1 = _mm256_extracti128_si256(codes, 1);
    const __m256 d = _mm256_set1_ps(scale), m = _mm256_set1_ps(sub);
    const __m128i parts[4] = {c0, _mm_srli_si128(c0, 8), c1, _mm_srli_si128(c1, 8)};
    for (int q = 0; q < 4; q++)
        _mm256_storeu_ps(y + 8 * q, _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[q])), d), m));
}

// Q6_K's products round (d * sc) * q once, like ggml's; two scales per 32 codes.
INLINE T256 void store32_q6(__m256i codes, float s0, float s1, float* y) {
    const __m128i c0 = _mm256_castsi256_si128(codes), c1 = _mm256_extracti128_si256(codes, 1);
    const __m128i parts[4] = {c0, _mm_srli_si128(c0, 8), c1, _mm_srli_si128(c1, 8)};
    for (int q = 0; q < 4; q++)
        _mm256_storeu_ps(y + 8 * q, _mm256_mul_ps(_mm256_set1_ps(q < 2 ? s0 : s1),
                                                  _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[q]))));
}

INLINE T256 void dequantize_row(const int F, const uint8_t* b, int64_t cols, float* y) {
    const int bytes = ggml_block_shape_of(F).bytes;
    if (F == MOE_FORMAT_GGML_Q4_K || F == MOE_FORMAT_GGML_Q5_K) {
        for (int64_t k = 0; k < cols; k += 256, b += bytes) {
            const float d = half_to_float(b), dmin = half_to_float(b + 2);
            for (int sub = 0; sub < 8; sub++) {
                int sc, m;
                k_scale_min(sub, b + 4, &sc, &m);
                store32(k_codes(F, b, sub), d * sc, dmin * m, y + k + 32 * sub);
            }
        }
        return;
    }
    if (F == MOE_FORMAT_GGML_Q6_K) {
        const __m256i bias = _mm256_set1_epi8(32);
        for (int64_t k = 0; k < cols; k += 256, b += bytes) {
            const float d = half_to_float(b + 208);
            const int8_t* sc = (const int8_t*)(b + 192);
            for (int half = 0; half < 2; half++) {
                __m256i q[4];
                q6_k_codes(b, half, q);
                for (int p = 0; p < 4; p++)
                    store32_q6(_mm256_sub_epi8(q[p], bias), d * sc[8 * half + 2 * p], d * sc[8 * half + 2 * p + 1],
                               y + k + 128 * half + 32 * p);
            }
        }
        return;
    }
    if (F == MOE_FORMAT_GGML_IQ4_XS) {
        for (int64_t k = 0; k < cols; k += 256, b += bytes) {
            const float d = half_to_float(b);
            const uint16_t high = load_u16(b + 2, 0);
            for (int sub = 0; sub < 8; sub++) {
                const int ls = iq4_xs_scale(b, high, sub);
                store32(lookup(iq4nl_table, split_nibbles(b + 8 + 16 * sub)), d * (float)(ls - 32), 0.0f,
                        y + k + 32 * sub);
            }
        }
        return;
    }
    // Q4_1 and Q5_1: q * d + m, ggml's order (a product, then a sum: minus -m is plus m).
    const int with_min = F == MOE_FORMAT_GGML_Q4_1 || F == MOE_FORMAT_GGML_Q5_1;
    for (int64_t k = 0; k < cols; k += 32, b += bytes) {
        float d;
        const __m256i codes = block32(F, b, &d);
        store32(codes, d, with_min ? -half_to_float(b + 2) : 0.0f, y + k);
    }
}

T256 int moe_cpu_ggml_dequantize_avx2(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out) {
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t* b = row_data(w, row0 + r);
        float* y = out + r * w->cols;
        switch (w->format) {
        case MOE_FORMAT_GGML_Q8_0: dequantize_row(MOE_FORMAT_GGML_Q8_0, b, w->cols, y); break;
        case MOE_FORMAT_GGML_Q4_0: dequantize_row(MOE_FORMAT_GGML_Q4_0, b, w->cols, y); break;
        case MOE_FORMAT_GGML_IQ4_NL: dequantize_row(MOE_FORMAT_GGML_IQ4_NL, b, w->cols, y); break;
        case MOE_FORMAT_GGML_Q4_1: dequantize_row(MOE_FORMAT_GGML_Q4_1, b, w->cols, y); break;
        case MOE_FORMAT_GGML_Q5_0: dequantize_row(MOE_FORMAT_GGML_Q5_0, b, w->cols, y); break;
        case MOE_FORMAT_GGML_Q5_1: dequantize_row(MOE_FORMAT_GGML_Q5_1, b, w->cols, y); break;
        case MOE_FORMAT_GGML_IQ4_XS: dequantize_row(MOE_FORMAT_GGML_IQ4_XS, b, w->cols, y); break;
        case MOE_FORMAT_GGML_MXFP4: dequantize_row(MOE_FORMAT_GGML_MXFP4, b, w->cols, y); break;
        case MOE_FORMAT_GGML_Q4_K: dequantize_row(MOE_FORMAT_GGML_Q4_K, b, w->cols, y); break;
        case MOE_FORMAT_GGML_Q5_K: dequantize_row(MOE_FORMAT_GGML_Q5_K, b, w->cols, y); break;
        case MOE_FORMAT_GGML_Q6_K: dequantize_row(MOE_FORMAT_GGML_Q6_K, b, w->cols, y); break;
        default: return 0;
        }
    }
    return 1;
}

#endif
