// Does AVX512_BF16's dot product (vdpbf16ps: 32 bfloat16 products per instruction) make
// the prefill products of bfloat16 weights faster than what the CPU backend does, which is
// to widen a tile of bfloat16 rows to float32 in L2 and multiply with float32 FMAs
// (16 products per instruction)? One expert's products at Qwen3-30B-A3B's shape, m rows
// routed to it, over 16 experts' weights (streamed from memory): the gate/up shape (n = 768
// rows of k = 2048) and the down shape (2048 rows of 768), register blocks of 4 x 4 in both
// kernels. "bf16" multiplies activations already in bfloat16 (a bfloat16 model's inputs);
// "bf16 x2" two passes, activations split into bfloat16 high and low parts, which float32
// activations need to stay within the layer's tolerance. The widened path is the library's
// own (moe_cpu_dequantize_rows into a tile, moe_cpu_gemm_nt), built in. Prints a table;
// exits with 2 on a CPU without AVX512_BF16.
//   clang -O2 -w -ISources/CMoECPU/include -ISources/CMoESwift/include -o /tmp/bf16_dot \
//       benchmarks/native/bf16_dot.c Sources/CMoECPU/isa.c Sources/CMoECPU/gemm_nt.c \
//       Sources/CMoECPU/formats/*.c -lm && /tmp/bf16_dot
#include "moe_cpu_formats.h"
#include "moe_cpu_kernels.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIN(a, b) ((a) < (b) ? (a) : (b))
enum { MR = 4, NR = 4, EXPERTS = 16, TILE_BYTES = 256 << 10 };  // WeightMatrix.tileBytes

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

// The library's 4 x 4 blocks (gemm_nt.c) with vdpbf16ps on bfloat16 activations and weights as stored.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void gemm_bf16(int64_t m, int64_t n, int64_t k,
                                                                            const uint16_t* a, const uint16_t* b,
                                                                            float* c, int64_t ldc) {
    for (int64_t j = 0; j < n; j += NR) {
        const uint16_t* bp[NR];
        for (int q = 0; q < NR; q++) bp[q] = b + MIN(j + q, n - 1) * k;
        for (int64_t i = 0; i < m; i += MR) {
            const uint16_t* ap[MR];
            for (int p = 0; p < MR; p++) ap[p] = a + MIN(i + p, m - 1) * k;
            __m512 acc[MR][NR];
            for (int p = 0; p < MR; p++)
                for (int q = 0; q < NR; q++) acc[p][q] = _mm512_setzero_ps();
            for (int64_t x = 0; x < k; x += 32) {
                __m512bh bv[NR];
                for (int q = 0; q < NR; q++) bv[q] = (__m512bh)_mm512_loadu_si512(bp[q] + x);
                for (int p = 0; p < MR; p++) {
                    const __m512bh av = (__m512bh)_mm512_loadu_si512(ap[p] + x);
                    for (int q = 0; q < NR; q++) acc[p][q] = _mm512_dpbf16_ps(acc[p][q], av, bv[q]);
                }
            }
            for (int p = 0; p < MR && i + p < m; p++)
                for (int q = 0; q < NR && j + q < n; q++) c[(i + p) * ldc + j + q] = _mm512_reduce_add_ps(acc[p][q]);
        }
    }
}

static void run(int64_t m, int64_t n, int64_t k) {
    float* a = aligned_alloc(64, m * k * 4);
    uint16_t* a16 = aligned_alloc(64, m * k * 2);
    uint16_t* b = aligned_alloc(64, (size_t)EXPERTS * n * k * 2);
    float *c = aligned_alloc(64, m * n * 4), *c16 = aligned_alloc(64, m * n * 4), *tile = aligned_alloc(64, TILE_BYTES);
    const int64_t tile_rows = TILE_BYTES / (4 * k);
    const moe_cpu_matrix w = {.format = MOE_FORMAT_BF16, .cols = k, .row_bytes = 2 * k, .data = b};
    srand(1);
    for (int64_t i = 0; i < m * k; i++) {
        a[i] = (float)(rand() % 255 - 127) / 64;  // exact in bfloat16
        uint32_t u;
        memcpy(&u, &a[i], 4);
        a16[i] = (uint16_t)(u >> 16);
    }
    for (int64_t i = 0; i < (int64_t)EXPERTS * n * k; i++) b[i] = (uint16_t)(0x3c00 + (rand() & 0xff) + ((rand() & 1) << 15));
    double best[3] = {1e30, 1e30, 1e30};
    for (int round = 0; round < 7; round++) {
        const double t0 = now();
        for (int e = 0; e < EXPERTS; e++)  // WeightMatrix.multiply's prefill loop
            for (int64_t j0 = 0; j0 < n; j0 += tile_rows) {
                const int64_t count = MIN(tile_rows, n - j0);
                moe_cpu_dequantize_rows(&w, (int64_t)e * n + j0, count, tile);
                moe_cpu_gemm_nt(m, count, k, a, k, tile, k, c + j0, n);
            }
        const double t1 = now();
        for (int e = 0; e < EXPERTS; e++) gemm_bf16(m, n, k, a16, b + (int64_t)e * n * k, c16, n);
        const double t2 = now();
        for (int e = 0; e < EXPERTS; e++)
            for (int pass = 0; pass < 2; pass++) gemm_bf16(m, n, k, a16, b + (int64_t)e * n * k, c16, n);
        const double t3 = now();
        best[0] = fmin(best[0], t1 - t0), best[1] = fmin(best[1], t2 - t1), best[2] = fmin(best[2], t3 - t2);
    }
    double err = 0, scale = 0;
    for (int64_t i = 0; i < m * n; i++) err = fmax(err, fabs(c[i] - c16[i])), scale = fmax(scale, fabs(c[i]));
    const double macs = (double)EXPERTS * m * n * k;
    printf("| %4lld | %4lld | %4lld | %8.2f (%5.1f) | %8.2f (%5.1f) | %8.2f | %5.2fx | %5.2fx | %.1e |\n", (long long)m,
           (long long)n, (long long)k, best[0] * 1e3, macs / best[0] / 1e9, best[1] * 1e3, macs / best[1] / 1e9,
           best[2] * 1e3, best[0] / best[1], best[0] / best[2], err / scale);
    free(a), free(a16), free(b), free(c), free(c16), free(tile);
}

int main(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) {
        fprintf(stderr, "this CPU has no AVX512_BF16\n");
        return 2;
    }
    printf("16 experts' products, best of 7; ms (GMAC/s); speedup = widened float32 time / bf16 time\n\n");
    printf("| m | n | k | widened + f32 FMA | bf16 vdpbf16ps | bf16 x2 | bf16 speedup | x2 speedup | max |diff| / max |c| |\n");
    printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const int64_t shapes[][3] = {{16, 768, 2048}, {64, 768, 2048}, {16, 2048, 768}, {64, 2048, 768}};
    for (int s = 0; s < 4; s++) run(shapes[s][0], shapes[s][1], shapes[s][2]);
    return 0;
}
