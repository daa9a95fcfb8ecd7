// moe_cpu_formats.h's products and dequantization: the kernels of one instruction set
// (one file each in this folder), chosen by moe_cpu_isa_level() at every call.
#include "internal.h"

// The AVX-512 levels share one set of kernels: VNNI and GFNI only change instructions
// inside avx512_fixed.c, which reads the level itself.
static const moe_cpu_format_kernels* kernels_for(int level) {
#ifdef MOE_CPU_FORMATS_X86
    if (level >= MOE_CPU_ISA_AVX512) return &moe_cpu_formats_avx512;
    if (level == MOE_CPU_ISA_AVX2) return &moe_cpu_formats_avx2;
#else
    (void)level;
#endif
    return &moe_cpu_formats_portable;
}

// Dense rows take the 256-bit kernels on AVX-512 machines too. These products only stream
// memory (from L2 the 512-bit row is several times faster than DRAM delivers), and
// streaming from DRAM is what 512-bit code did worse on the Zen 4 machines this was
// measured on (docs/cpu-backend.md).
void moe_cpu_matmul_formatted(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                              int64_t row0, float* c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    if (is_ggml(w->format)) {
#ifdef MOE_CPU_FORMATS_X86
        if (moe_cpu_isa_level() >= MOE_CPU_ISA_AVX2 && moe_cpu_ggml_matmul_avx2(m, n, a, lda, w, row0, c, ldc)) return;
#endif
        moe_cpu_ggml_matmul_portable(m, n, a, lda, w, row0, c, ldc);
        return;
    }
    int level = moe_cpu_isa_level();
    if (level >= MOE_CPU_ISA_AVX512 && is_dense(kernel_kind(w))) level = MOE_CPU_ISA_AVX2;
    kernels_for(level)->matmul(m, n, a, lda, w, row0, c, ldc);
}

void moe_cpu_dequantize_rows(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out) {
    if (rows <= 0) return;
    if (is_ggml(w->format)) {
        moe_cpu_ggml_dequantize_rows(w, row0, rows, out);
        return;
    }
    kernels_for(moe_cpu_isa_level())->dequantize(w, row0, rows, out);
}
