// Affine 4-bit codes against fixed-point activations, with AVX2: the decode product that
// avx2.c tries first for K_Q4. The scheme is avx512_fixed.c's (which explains it): each
// activation group written as D t_k, t_k = 65536 t2 + 256 t1 + t0 in signed 8-bit digits
// (|error| <= 2^-24 of the group's largest value, as float32's own rounding), the codes
// multiplying each digit plane exactly in integers (vpmaddubsw, vpmaddwd), one conversion
// and one FMA per group. The factored float row (avx2.c) converts and multiplies every
// weight: one conversion and one FMA per 8; here a vpmaddubsw does 32 products.
#include "internal.h"

#ifdef MOE_CPU_FORMATS_X86

// Signed low byte of each int32 lane.
INLINE T256 __m256i low_digit(__m256i t) { return _mm256_srai_epi32(_mm256_slli_epi32(t, 24), 24); }

// Four vectors of 8 int32 (each within int8) -> their 32 bytes in order.
INLINE T256 __m256i pack_digits(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The m activation rows as digit planes (fixed_rows, 4-bit order), D and the float sum of
// each group; 1 if every value is finite (the rows are then prepared), else 0.
INLINE T256 int prepare_fixed_avx2(int64_t m, const float* a, int64_t lda, int64_t cols, int64_t gs,
                                   const fixed_rows* out) {
    const int64_t groups = cols / gs;
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    float inv[FIXED_MAX_GROUPS];
    for (int64_t i = 0; i < m; i++) {
        const float* x = a + i * lda;
        float* d = out->scale + i * groups;
        for (int64_t g = 0; g < groups; g++) {
            __m256 big = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
            for (int64_t k = g * gs; k < (g + 1) * gs; k += 8) {
                const __m256 v = _mm256_loadu_ps(x + k);
                big = _mm256_max_ps(big, _mm256_and_ps(v, magnitude));
                sum = _mm256_add_ps(sum, v);
            }
            __m128 t = _mm_max_ps(_mm256_castps256_ps128(big), _mm256_extractf128_ps(big, 1));
            t = _mm_max_ps(t, _mm_movehl_ps(t, t));
            const float top = _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
            if (!fixed_group(out, inv, groups, i, g, top, hsum8(sum), (float)FIXED_TOP)) return 0;
        }
        for (int64_t k = 0; k < cols; k += 32) {
            __m256i planes[3][4];
            for (int q = 0; q < 4; q++) {
                const int64_t src = fixed_source(K_Q4, k + 8 * q, cols), g = src / gs;
                const __m256 v = _mm256_loadu_ps(x + src), scale = _mm256_set1_ps(inv[g]);
                const __m256 h = _mm256_round_ps(_mm256_mul_ps(v, scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                const __m256 rest = _mm256_mul_ps(_mm256_fnmadd_ps(h, _mm256_set1_ps(d[g]), v), scale);  // v - h d exactly, / d
                const __m256i t = _mm256_add_epi32(_mm256_cvtps_epi32(h), _mm256_cvtps_epi32(rest));
                const __m256i t0 = low_digit(t), t12 = _mm256_srai_epi32(_mm256_sub_epi32(t, t0), 8);
                const __m256i t1 = low_digit(t12), t2 = _mm256_srai_epi32(_mm256_sub_epi32(t12, t1), 8);
                planes[0][q] = t2, planes[1][q] = t1, planes[2][q] = t0;
            }
            for (int plane = 0; plane < 3; plane++)
                _mm256_storeu_si256((__m256i*)(out->digits + (3 * i + plane) * cols + k),
                                    pack_digits(planes[plane][0], planes[plane][1], planes[plane][2], planes[plane][3]));
        }
    }
    return 1;
}

// cs[i][g] = scale[g] * D of activation row i, group g, and bias . xsum per activation row;
// 0 if some cs underflowed below float32's normal range (the row then takes the float
// path, which does not form that product).
INLINE T256 int fixed_row_scales(const int MM, const group_cursor* gc, int64_t groups, const fixed_rows* x,
                                float cs[][FIXED_MAX_GROUPS], float* biased) {
    float s[FIXED_MAX_GROUPS], b[FIXED_MAX_GROUPS];
    group_floats(gc->scales, gc->type, groups, s);
    group_floats(gc->biases, gc->type, groups, b);
    int lost = 0;
    for (int i = 0; i < MM; i++) {
        const float* d = x->scale + i * groups;
        const float* xs = x->xsum + i * groups;
        __m256 bias = _mm256_setzero_ps();
        int64_t g = 0;
        for (; g + 8 <= groups; g += 8) {
            const __m256 sg = _mm256_loadu_ps(s + g), dg = _mm256_loadu_ps(d + g), sd = _mm256_mul_ps(sg, dg);
            _mm256_storeu_ps(cs[i] + g, sd);
            const __m256 tiny = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), sd), _mm256_set1_ps(0x1p-126f), _CMP_LT_OQ);
            const __m256 nonzero = _mm256_and_ps(_mm256_cmp_ps(sg, _mm256_setzero_ps(), _CMP_NEQ_UQ),
                                                 _mm256_cmp_ps(dg, _mm256_setzero_ps(), _CMP_NEQ_UQ));
            lost |= _mm256_movemask_ps(_mm256_and_ps(tiny, nonzero));
            bias = _mm256_fmadd_ps(_mm256_loadu_ps(b + g), _mm256_loadu_ps(xs + g), bias);
        }
        float tail = 0.0f;
        for (; g < groups; g++) {
            cs[i][g] = s[g] * d[g];
            lost |= fabsf(cs[i][g]) < 0x1p-126f && s[g] != 0.0f && d[g] != 0.0f;
            tail = fmaf(b[g], xs[g], tail);
        }
        biased[i] = hsum8(bias) + tail;
    }
    return lost == 0;
}

// One 4-bit row (split layout, 32 code bytes = 64 codes a step) against MM <= 4 prepared
// activation rows: c[i * ldc]; 0 (nothing written) if its scales underflow. A step's
// integer sum covers one group (GS 64), half of one (GS 128: two steps), or two (GS 32:
// lanes 0-3 the first, 4-7 the second). Per digit plane, the two halves' vpmaddubsw sums
// (at most 2 * 15 * 128 each pair) add in int16; the planes join in int32 as
// 256 (256 T2 + T1) + T0, which the group sizes keep inside int32 (avx512_fixed.c).
INLINE T256 int row_fixed_avx2(const int MM, const int GS, const moe_cpu_matrix* w, int64_t r, const fixed_rows* x,
                               float* c, int64_t ldc) {
    const int64_t cols = w->cols, groups = cols / GS;
    const group_cursor gc = group_cursor_for(w, r);
    const uint8_t* row = row_data(w, r);
    float cs[4][FIXED_MAX_GROUPS], biased[4];
    if (!fixed_row_scales(MM, &gc, groups, x, cs, biased)) return 0;
    const __m256i nibble = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1), radix = _mm256_set1_epi16(256);
    __m256 total[4];
    for (int i = 0; i < MM; i++) total[i] = _mm256_setzero_ps();
    const int steps = GS == 128 ? 2 : 1;  // steps per integer sum
    for (int64_t k = 0; k < cols; k += 64 * steps) {
        __m256i lo[2], hi[2];
        for (int h = 0; h < steps; h++) {
            const uint8_t* p = row + ((k + 64 * h) >> 1);
            _mm_prefetch((const char*)p + CODE_PREFETCH, _MM_HINT_T0);
            const __m256i q = _mm256_loadu_si256((const __m256i*)p);
            lo[h] = _mm256_and_si256(q, nibble);
            hi[h] = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
        }
        for (int i = 0; i < MM; i++) {
            __m256i p16[3];
            for (int plane = 0; plane < 3; plane++) {
                const int8_t* dg = x->digits + (3 * i + plane) * cols + k;
                p16[plane] = _mm256_setzero_si256();
                for (int h = 0; h < steps; h++) {
                    const __m256i a = _mm256_maddubs_epi16(lo[h], _mm256_loadu_si256((const __m256i*)(dg + 64 * h)));
                    const __m256i b = _mm256_maddubs_epi16(hi[h], _mm256_loadu_si256((const __m256i*)(dg + 64 * h + 32)));
                    p16[plane] = _mm256_add_epi16(p16[plane], _mm256_add_epi16(a, b));
                }
            }
            // int16 sums: at most 2 steps * 2 halves * 2 * 15 * 128 = 15360 in magnitude.
            const __m256i high = _mm256_add_epi32(_mm256_madd_epi16(p16[0], radix), _mm256_madd_epi16(p16[1], ones));
            const __m256i t = _mm256_add_epi32(_mm256_slli_epi32(high, 8), _mm256_madd_epi16(p16[2], ones));
            const int64_t g = k / GS;
            const __m256 scale = GS == 32 ? _mm256_setr_m128(_mm_set1_ps(cs[i][g]), _mm_set1_ps(cs[i][g + 1]))
                                          : _mm256_set1_ps(cs[i][g]);
            total[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), scale, total[i]);
        }
    }
    for (int i = 0; i < MM; i++) c[i * ldc] = hsum8(total[i]) + biased[i];
    return 1;
}

// One function per (activation rows, group size): rows [r0, r0 + nb) of a call, into c
// (row q at c + q), done[q] = 0 for a row left to the float path.
typedef void fixed_rows_fn(const moe_cpu_matrix* w, int64_t r0, int64_t nb, const fixed_rows* x, float* c,
                           int64_t ldc, int* done);
#define FIXED_ROWS(MM, GS)                                                                                     \
    static T256 void fixed_rows_##MM##_##GS(const moe_cpu_matrix* w, int64_t r0, int64_t nb, const fixed_rows* x, \
                                            float* c, int64_t ldc, int* done) {                               \
        for (int64_t q = 0; q < nb; q++) done[q] = row_fixed_avx2(MM, GS, w, r0 + q, x, c + q, ldc);         \
    }
#define FIXED_ROWS_GS(MM) FIXED_ROWS(MM, 32) FIXED_ROWS(MM, 64) FIXED_ROWS(MM, 128)
FIXED_ROWS_GS(1)
FIXED_ROWS_GS(2)
FIXED_ROWS_GS(3)
FIXED_ROWS_GS(4)
#define FIXED_ENTRY(MM) {fixed_rows_##MM##_32, fixed_rows_##MM##_64, fixed_rows_##MM##_128}
// [activation rows - 1][group size 32, 64, 128]
static fixed_rows_fn* const fixed_rows_table[4][3] = {FIXED_ENTRY(1), FIXED_ENTRY(2), FIXED_ENTRY(3), FIXED_ENTRY(4)};

// The fixed-point product for K_Q4 in groups of 32, 64 or 128 over whole steps of 64 codes,
// four activation rows at a time; 0 (nothing done) for anything else, rows with too many
// groups, activations that are not all finite or scratch that cannot be allocated: the
// float product then serves. A weight row whose scales underflow against these
// activations takes the float row. Calls of several activation rows come here too, though
// from two rows on the float product alone was about as fast (each further row costs three
// digit planes of vpmaddubsw where the float row adds one FMA per 8 weights): a row's
// result must not depend on the rows that share its call.
T256 int moe_cpu_matmul_fixed_avx2(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                                   int64_t row0, float* c, int64_t ldc) {
    const int gsi = w->group_size == 32 ? 0 : w->group_size == 64 ? 1 : w->group_size == 128 ? 2 : -1;
    if (kernel_kind(w) != K_Q4 || gsi < 0 || w->cols % 64 || w->cols % w->group_size) return 0;
    const int64_t cols = w->cols, groups = cols / w->group_size;
    if (groups > FIXED_MAX_GROUPS) return 0;
    const int64_t rows = MIN(m, 4);
    uint8_t* scratch = moe_cpu_fixed_scratch((size_t)rows * (3 * cols + 8 * groups));
    if (scratch == NULL) return 0;
    float* scales = (float*)(scratch + rows * 3 * cols);
    const fixed_rows x = {NULL, NULL, (int8_t*)scratch, scales, scales + rows * groups};
    for (int64_t i0 = 0; i0 < m; i0 += 4) {
        const int mm = (int)MIN(4, m - i0);
        const fixed_key key = {FIXED_LAYOUT_AVX2_Q4, w->group_size, rows, mm, cols};
        if (!moe_cpu_fixed_scratch_holds(&key, a + i0 * lda, lda)) {
            const int prepared = prepare_fixed_avx2(mm, a + i0 * lda, lda, cols, w->group_size, &x);
            moe_cpu_fixed_scratch_prepared(prepared ? &key : NULL, a + i0 * lda, lda);
            // Rows done so far stay; the float product redoes the call (the same meaning).
            if (!prepared) return 0;
        }
        fixed_rows_fn* const rows_fn = fixed_rows_table[mm - 1][gsi];
        for (int64_t j = 0; j < n; j += 4) {
            const int64_t nb = MIN(4, n - j);
            int done[4];
            rows_fn(w, row0 + j, nb, &x, c + i0 * ldc + j, ldc, done);
            for (int64_t q = 0; q < nb; q++)
                if (!done[q]) moe_cpu_row_float_avx2(K_Q4, mm, w, row0 + j + q, a + i0 * lda, lda, c + i0 * ldc + j + q, ldc);
        }
    }
    return 1;
}

#endif
