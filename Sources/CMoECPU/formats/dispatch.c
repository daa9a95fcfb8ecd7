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
// memory (the 512-bit row does 60 GB/s of bf16 from L2 on one core, several times what
// DRAM delivers), and streaming is what 512-bit code does worse: on the Zen 4 machines of
// this project the 256-bit rows made the Qwen3-30B-A3B-shaped decode layer 1.19x (f32)
// and 1.24x (bf16) faster, measured in alternating blocks in one process, and the f32
// row over 410 MB on two threads read 8-26% more GB/s (four alternating runs). ggml's
// CPU build in the benchmark is AVX2-only, and it was ahead of the 512-bit rows.
void moe_cpu_matmul_formatted(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                              int64_t row0, float* c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    int level = moe_cpu_isa_level();
    if (level >= MOE_CPU_ISA_AVX512 && is_dense(kernel_kind(w))) level = MOE_CPU_ISA_AVX2;
    kernels_for(level)->matmul(m, n, a, lda, w, row0, c, ldc);
}

void moe_cpu_dequantize_rows(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out) {
    if (rows <= 0) return;
    kernels_for(moe_cpu_isa_level())->dequantize(w, row0, rows, out);
}
