// 8-bit activations (activation_quantization "q8", moe_options.h): the quantizer that
// every backend's integer products and the grid values share. Each row is cut into blocks
// of MOE_Q8_ACTIVATION_BLOCK elements, each quantized on its own so that one outlier
// channel coarsens only its own block.
#include "ggml_avx2_blocks.h"

// The block's operations are the reference's (reference.quantize_activations_q8), in
// float32 and in the same order, so that its grid values are these bit for bit: amax,
// then d = amax / 127 (a division, as the reference divides), then x / d rounded half to
// even (nearbyintf in the default rounding mode).
static void quantize_block(const float* x, int64_t len, int8_t* codes, float* scale, float* sum, float* grid) {
    float amax = 0;
    int finite = 1;
    for (int64_t i = 0; i < len; i++) {
        float a = fabsf(x[i]);
        finite &= isfinite(a) != 0;
        amax = a > amax ? a : amax;
    }
    float d = finite ? amax / 127.0f : NAN;
    int8_t q[MOE_Q8_ACTIVATION_BLOCK];
    for (int64_t i = 0; i < len; i++) {
        // d = 0 (zeros, or amax / 127 below the smallest float) keeps codes 0; a NaN d
        // gives codes 0 too, and its NaN scale makes every product of the block NaN.
        // The clamp only acts where d is subnormal (amax / 127 then loses bits).
        q[i] = d > 0 ? (int8_t)fminf(fmaxf(nearbyintf(x[i] / d), -127.0f), 127.0f) : 0;
    }
    if (codes) memcpy(codes, q, (size_t)len);
    if (scale) *scale = d;
    if (sum) {
        int32_t total = 0;
        for (int64_t i = 0; i < len; i++) total += q[i];
        *sum = d * (float)total;
    }
    if (grid) {
        for (int64_t i = 0; i < len; i++) grid[i] = d * (float)q[i];
    }
}

#ifdef MOE_CPU_FORMATS_X86
_Static_assert(MOE_Q8_ACTIVATION_BLOCK == 32, "quantize_block_avx2 holds a block in four registers of 8");

// A whole block, every output wanted: quantize_block's operations lane by lane (a vector
// division and round-to-nearest-even are the scalar ones), so the results are its bits.
// Decode quantizes every row it multiplies, where the scalar loop's call to nearbyintf and
// division per element were the cost. All of x is loaded before grid (which may be x) is
// written.
T256 static void quantize_block_avx2(const float* x, int8_t* codes, float* scale, float* sum, float* grid) {
    const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
    __m256 v[4], amax = _mm256_setzero_ps(), finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        const __m256 a = _mm256_andnot_ps(sign, v[i]);
        finite = _mm256_and_ps(finite, _mm256_cmp_ps(a, inf, _CMP_LT_OQ));  // false for NaN too
        amax = _mm256_max_ps(amax, a);
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm256_movemask_ps(finite) == 0xff ? _mm_cvtss_f32(m) / 127.0f : NAN;
    __m256i q[4];
    const __m256 dv = _mm256_set1_ps(d);
    for (int i = 0; i < 4; i++) {
        const __m256 r = _mm256_round_ps(_mm256_div_ps(v[i], dv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 c = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
        q[i] = d > 0 ? _mm256_cvttps_epi32(c) : _mm256_setzero_si256();
    }
    // Two packs interleave the registers by 4-element groups; one permute restores the order.
    const __m256i bytes = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i*)codes, bytes);
    __m256i t = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    *scale = d;
    *sum = d * (float)_mm_cvtsi128_si32(s);
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(grid + 8 * i, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(q[i])));
}
#endif

void moe_cpu_q8_quantize(const float* x, int64_t n, int8_t* codes, float* scales, float* sums, float* grid) {
    int64_t b0 = 0, b = 0;
#ifdef MOE_CPU_FORMATS_X86
    if (codes && scales && sums && grid && moe_cpu_isa_level() >= MOE_CPU_ISA_AVX2) {
        for (; n - b0 >= MOE_Q8_ACTIVATION_BLOCK; b0 += MOE_Q8_ACTIVATION_BLOCK, b++)
            quantize_block_avx2(x + b0, codes + b0, scales + b, sums + b, grid + b0);
    }
#endif
    for (; b0 < n; b0 += MOE_Q8_ACTIVATION_BLOCK, b++)
        quantize_block(x + b0, MIN((int64_t)MOE_Q8_ACTIVATION_BLOCK, n - b0), codes ? codes + b0 : NULL,
                       scales ? scales + b : NULL, sums ? sums + b : NULL, grid ? grid + b0 : NULL);
}

int moe_cpu_q8_supported(const moe_cpu_matrix* w) {
#ifdef MOE_CPU_FORMATS_X86
    if (moe_cpu_isa_level() < MOE_CPU_ISA_AVX2) return 0;
    if (ggml_avx2_has_products(w->format)) return 1;
    // Ours: affine 4- and 8-bit codes and mxfp4, 4-bit ones in the CPU's nibble order.
    const int kind = kernel_kind(w);
    return kind == K_Q4 || kind == K_Q8 || kind == K_MXFP4;
#else
    (void)w;
    return 0;
#endif
}

int moe_cpu_matmul_q8(int64_t m, int64_t n, const moe_cpu_q8_rows* a, const moe_cpu_matrix* w, int64_t row0,
                      float* c, int64_t ldc) {
    if (m <= 0 || n <= 0) return 1;
#ifdef MOE_CPU_FORMATS_X86
    if (moe_cpu_isa_level() >= MOE_CPU_ISA_AVX512_GFNI && moe_cpu_q8_matmul_avx512(m, n, a, w, row0, c, ldc))
        return 1;
    if (moe_cpu_q8_supported(w)) return moe_cpu_q8_matmul_avx2(m, n, a, w, row0, c, ldc);
#endif
    return 0;
}
