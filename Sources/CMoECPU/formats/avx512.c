// The format kernels with AVX-512 (F, BW, VL) in float arithmetic: 16-lane vectors, two
// chunks per step. Affine 4- and 8-bit codes first try the fixed-point product of
// avx512_fixed.c. Dense kinds never come here (dispatch.c). The drivers (the loops over
// rows) are drivers.h's, included at the end.
#include "internal.h"

#ifdef MOE_CPU_FORMATS_X86

// Chunk -> v[0] (elements 0-15), v[1] (16-31), scale and bias applied.
// p, seg: the parameters of the segment starting at element seg (quantized kinds).
INLINE T512 void unpack_avx512(const int kind, const moe_cpu_matrix* w, const group_cursor* gc, int64_t r,
                               const segment_params* p, int64_t seg, int64_t k0, __m512* v) {
    const uint8_t* row = row_data(w, r);
    if (kind == K_F32) {
        v[0] = _mm512_loadu_ps((const float*)row + k0);
        v[1] = _mm512_loadu_ps((const float*)row + k0 + 16);
        return;
    }
    if (kind == K_F16) {
        const __m256i* p = (const __m256i*)(row + 2 * k0);
        v[0] = _mm512_cvtph_ps(_mm256_loadu_si256(p));
        v[1] = _mm512_cvtph_ps(_mm256_loadu_si256(p + 1));
        return;
    }
    if (kind == K_BF16) {
        const __m256i* p = (const __m256i*)(row + 2 * k0);
        v[0] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p)), 16));
        v[1] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p + 1)), 16));
        return;
    }
    if (kind == K_AFFINE_ANY) {
        float tmp[CHUNK];
        unpack_chunk_portable(w, gc, r, k0, tmp);
        v[0] = _mm512_loadu_ps(tmp);
        v[1] = _mm512_loadu_ps(tmp + 16);
        return;
    }
    const int64_t g = (k0 - seg) >> gc->shift;
    const __m512 scale = _mm512_set1_ps(p->s[g]);
    if (kind == K_Q8) {
        const __m512 bias = _mm512_set1_ps(p->b[g]);
        const __m512i i0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + k0)));
        const __m512i i1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + k0 + 16)));
        v[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), scale, bias);
        v[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), scale, bias);
        return;
    }
    // 4-bit codes in the split layout: the 16 values a code can stand for in this group
    // form a table, and vpermps picks by the low 4 bits of each 32-bit lane, so the
    // codes need no mask: bytes widened to lanes index elements 0-15, shifted by 4 16-31.
    __m512 table;
    if (kind == K_MXFP4) {
        table = _mm512_mul_ps(_mm512_loadu_ps(e2m1_values), scale);
    } else {
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        table = _mm512_fmadd_ps(iota, scale, _mm512_set1_ps(p->b[g]));
    }
    const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + (k0 >> 1))));
    v[0] = _mm512_permutexvar_ps(codes, table);
    v[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table);
}

// One weight row against MM activation rows. Two chunks per step with separate
// accumulators keep four FMA chains in flight even for one activation row.
INLINE T512 void row_kernel(const int kind, const int MM, const moe_cpu_matrix* w, int64_t r,
                              const float* a, int64_t lda, float* c, int64_t ldc) {
    const int64_t cols = w->cols, kv = chunked_cols(w);
    const group_cursor gc = w->group_size > 0 ? group_cursor_for(w, r) : (group_cursor){0};
    __m512 acc[4][4];
    for (int i = 0; i < MM; i++)
        for (int q = 0; q < 4; q++) acc[i][q] = _mm512_setzero_ps();
    segment_params p;
    for (int64_t seg = 0; seg < kv;) {
        const int64_t end = load_segment(&gc, is_dense(kind), seg, kv, &p);
        int64_t k0 = seg;
        for (; k0 + 2 * CHUNK <= end; k0 += 2 * CHUNK) {
            __m512 v[4];
            // Packed codes are consumed slower than the prefetcher ramps up on a new row:
            // fetching 1 KiB ahead (the next row, near a row's end) covers the ramp, for
            // mxfp4 here as for affine 4-bit in row_affine_kernel.
            if (kind == K_MXFP4) _mm_prefetch((const char*)row_data(w, r) + (k0 >> 1) + CODE_PREFETCH, _MM_HINT_T0);
            unpack_avx512(kind, w, &gc, r, &p, seg, k0, v);
            unpack_avx512(kind, w, &gc, r, &p, seg, k0 + CHUNK, v + 2);
            for (int i = 0; i < MM; i++) {
                const float* x = a + i * lda + k0;
                for (int q = 0; q < 4; q++) acc[i][q] = _mm512_fmadd_ps(v[q], _mm512_loadu_ps(x + 16 * q), acc[i][q]);
            }
        }
        if (k0 < end) {
            __m512 v[2];
            unpack_avx512(kind, w, &gc, r, &p, seg, k0, v);
            for (int i = 0; i < MM; i++) {
                const float* x = a + i * lda + k0;
                for (int q = 0; q < 2; q++) acc[i][q] = _mm512_fmadd_ps(v[q], _mm512_loadu_ps(x + 16 * q), acc[i][q]);
            }
        }
        seg = end;
    }
    for (int i = 0; i < MM; i++) {
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][2]), _mm512_add_ps(acc[i][1], acc[i][3]));
        float s = _mm512_reduce_add_ps(sum);
        for (int64_t x = kv; x < cols; x++) s += dense_element(w, r, x) * a[i * lda + x];
        c[i * ldc] = s;
    }
}

// Affine 4- and 8-bit codes multiply in factored form, as MLX's qmv does: per group,
//   sum_i (s q_i + b) x_i = s * sum_i q_i x_i + b * sum_i x_i,
// so the inner loop only widens codes to floats and does one FMA per element (no per-group
// table, no bias), the scale is applied once per group, and sum_i x_i is computed once per
// activation row (group_sums) and dotted with the row's biases at the end, where the
// table path is shuffle-bound. The rounding differs from the table path but stays float32
// with float32 accumulation, well inside the spec's tolerance.

// One affine weight row (kind K_Q4 or K_Q8) against MM <= 4 activation rows whose group
// sums are xsum[i * groups + g].
INLINE T512 void row_affine_kernel(const int kind, const int MM, const int GS, const moe_cpu_matrix* w, int64_t r,
                                     const float* a, int64_t lda, const float* xsum, float* c, int64_t ldc) {
    const int64_t cols = w->cols, gs = GS ? GS : w->group_size, groups = cols / gs;
    const group_cursor gc = group_cursor_for(w, r);
    const uint8_t* row = row_data(w, r);
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    float scales[FACTORED_SUMS / 4 + 16];  // whole vectors are stored
    // The row's scales as floats first: converting one per group inside the loop costs
    // more than the group's FMAs.
    for (int64_t g = 0; g < groups; g += 16) _mm512_storeu_ps(scales + g, load_scalars(gc.scales, gc.type, g, MIN(16, groups - g)));
    __m512 total[4][2];
    for (int i = 0; i < MM; i++) total[i][0] = total[i][1] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const int64_t k0 = g * gs;
        if (kind == K_Q4) _mm_prefetch((const char*)row + (k0 >> 1) + CODE_PREFETCH, _MM_HINT_T0);
        __m512 acc[4][2];
        for (int i = 0; i < MM; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        for (int64_t k = k0; k < k0 + gs; k += CHUNK) {
            __m512 q0, q1;
            if (kind == K_Q4) {  // split layout: low nibbles are elements 0-15, high 16-31
                const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + (k >> 1))));
                q0 = _mm512_permutexvar_ps(codes, iota);  // reads only the low nibble
                q1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(codes, 4));
            } else {
                q0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + k))));
                q1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + k + 16))));
            }
            for (int i = 0; i < MM; i++) {
                const float* x = a + i * lda + k;
                acc[i][0] = _mm512_fmadd_ps(q0, _mm512_loadu_ps(x), acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(q1, _mm512_loadu_ps(x + 16), acc[i][1]);
            }
        }
        const __m512 scale = _mm512_set1_ps(scales[g]);
        for (int i = 0; i < MM; i++) {
            total[i][0] = _mm512_fmadd_ps(acc[i][0], scale, total[i][0]);
            total[i][1] = _mm512_fmadd_ps(acc[i][1], scale, total[i][1]);
        }
    }
    for (int i = 0; i < MM; i++) {
        const float* xs = xsum + i * groups;
        __m512 biased = _mm512_setzero_ps();
        for (int64_t g = 0; g < groups; g += 16) {
            const int64_t n = MIN(16, groups - g);
            biased = _mm512_fmadd_ps(load_scalars(gc.biases, gc.type, g, n),
                                     _mm512_maskz_loadu_ps(first_lanes(n), xs + g), biased);
        }
        c[i * ldc] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(total[i][0], total[i][1]), biased));
    }
}

// The float row of any kind, for the rare rows the fixed-point product leaves (one
// instance: kind and activation rows are run-time values here).
T512 void moe_cpu_row_float_avx512(int kind, int mm, const moe_cpu_matrix* w, int64_t r, const float* a,
                                   int64_t lda, float* c, int64_t ldc) {
    row_kernel(kind, mm, w, r, a, lda, c, ldc);
}

// One chunk stored as floats (the tile dequantization of prefill).
INLINE T512 void store_chunk(const int kind, const moe_cpu_matrix* w, const group_cursor* gc, int64_t r,
                             const segment_params* p, int64_t seg, int64_t k0, float* o) {
    __m512 v[2];
    unpack_avx512(kind, w, gc, r, p, seg, k0, v);
    _mm512_storeu_ps(o, v[0]);
    _mm512_storeu_ps(o + 16, v[1]);
}

INLINE T512 int matmul_fixed(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w, int64_t row0,
                             float* c, int64_t ldc) {
    return moe_cpu_matmul_fixed_avx512(m, n, a, lda, w, row0, c, ldc);
}

#define DRIVER_TARGET T512
#define DRIVER_DENSE 0
#include "drivers.h"

const moe_cpu_format_kernels moe_cpu_formats_avx512 = {matmul, dequantize};

#endif
