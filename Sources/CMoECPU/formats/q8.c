// 8-bit activations (activation_quantization "q8", moe_options.h): the quantizer that
// every backend's integer products and the grid values share. Each row is cut into blocks
// of MOE_Q8_ACTIVATION_BLOCK elements, each quantized on its own so that one outlier
// channel coarsens only its own block.
#include "ggml_avx2_blocks.h"

// The block's operations are the reference's (reference.quantize_activations_q8), in
// float32 and in the same order, so that its grid values are these bit for bit: amax,
// then d = amax / 127 (a division, as the reference divides), then x / d rounded half to
// even (nearbyintf in the default rounding mode).
void moe_cpu_q8_quantize(const float* x, int64_t n, int8_t* codes, float* scales, float* sums, float* grid) {
    for (int64_t b0 = 0, b = 0; b0 < n; b0 += MOE_Q8_ACTIVATION_BLOCK, b++) {
        int64_t len = MIN((int64_t)MOE_Q8_ACTIVATION_BLOCK, n - b0);
        float amax = 0;
        int finite = 1;
        for (int64_t i = 0; i < len; i++) {
            float a = fabsf(x[b0 + i]);
            finite &= isfinite(a) != 0;
            amax = a > amax ? a : amax;
        }
        float d = finite ? amax / 127.0f : NAN;
        int8_t q[MOE_Q8_ACTIVATION_BLOCK];
        for (int64_t i = 0; i < len; i++) {
            // d = 0 (zeros, or amax / 127 below the smallest float) keeps codes 0; a NaN d
            // gives codes 0 too, and its NaN scale makes every product of the block NaN.
            // The clamp only acts where d is subnormal (amax / 127 then loses bits).
            q[i] = d > 0 ? (int8_t)fminf(fmaxf(nearbyintf(x[b0 + i] / d), -127.0f), 127.0f) : 0;
        }
        if (codes) memcpy(codes + b0, q, (size_t)len);
        if (scales) scales[b] = d;
        if (sums) {
            int32_t total = 0;
            for (int64_t i = 0; i < len; i++) total += q[i];
            sums[b] = d * (float)total;
        }
        if (grid) {
            for (int64_t i = 0; i < len; i++) grid[b0 + i] = d * (float)q[i];
        }
    }
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
