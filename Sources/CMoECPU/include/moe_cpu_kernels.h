/* Small-M matrix products for the CPU backend (x86_64 with AVX2+FMA or AVX-512).
 *
 * An MoE layer multiplies each expert's weights by the few rows routed to it: typically
 * 4-32 in prefill (decode, M <= 4, takes the row kernels of moe_cpu_formats.h). OpenBLAS
 * packs the weight matrix for every call, which at such M costs more than the product:
 * it streams weights at a fraction of the memory bandwidth (docs/cpu-backend.md has the
 * measurement). These kernels read each weight
 * row once from memory and reuse it from cache across all M rows. Large M still goes to
 * BLAS.
 */
#ifndef MOE_CPU_KERNELS_H
#define MOE_CPU_KERNELS_H

#include <stdint.h>

/* The instruction set level of the CPU kernels (isa.c): the best the CPU supports, capped
 * by the environment variable MOE_CPU_ISA=portable|avx2|avx512|avx512vnni|avx512gfni, read
 * once per process. AVX512_VNNI runs the AVX-512 kernels with vpdpwssd / vpdpbusd in the
 * fixed-point affine product (AVX512 computes the same integers with vpmaddwd + vpaddd);
 * AVX512_GFNI adds one vgf2p8affineqb for unpacking 4-bit codes (same results) and, with
 * VBMI, the 8-bit-activation products of q8_avx512.c (which sum in another order). */
#define MOE_CPU_ISA_PORTABLE 0
#define MOE_CPU_ISA_AVX2 1
#define MOE_CPU_ISA_AVX512 2
#define MOE_CPU_ISA_AVX512_VNNI 3
#define MOE_CPU_ISA_AVX512_GFNI 4
__attribute__((visibility("hidden"))) int moe_cpu_isa_level(void);

/* 1 if moe_cpu_gemm_nt has a vector implementation on this CPU, else 0 (then callers
 * use BLAS). */
/* Hidden: internal to libMoESwift, not part of its exported ABI. */
__attribute__((visibility("hidden"))) int moe_cpu_gemm_nt_available(void);

/* c[m x n] = a[m x k] . b[n x k]^T, row-major with leading dimensions in elements.
 * The summation order over k is fixed by (k, the instruction set), never by m or threads. */
__attribute__((visibility("hidden")))
void moe_cpu_gemm_nt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float* c, int64_t ldc);

/* ORs together the 64-bit words of [p, p + bytes) (p 64-byte aligned, bytes a multiple of
 * 256) with four independent accumulators and loads of `bits` bits (512 or 256; capped by
 * what this CPU has, and the portable loop without AVX2): the read probe behind
 * moe_measure_read_bandwidth, which keeps the better of the widths the kernels use. */
__attribute__((visibility("hidden")))
uint64_t moe_cpu_stream_read(const void* p, int64_t bytes, int bits);

#endif
