// Register-blocked C = A . B^T for small M, with runtime dispatch on the instruction set.
// Each (MR rows of A) x (NR rows of B) block keeps MR * NR vector accumulators over the
// whole k loop; the NR rows of B are read from memory once (first A block) and from cache
// after. Blocks at the edges repeat the last valid row and discard the extra results, so
// the inner loop is always the full, unrolled block.
#include "moe_cpu_kernels.h"

#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
#include <immintrin.h>
#define MOE_X86 1
#endif

#ifdef MOE_X86

#define MIN(a, b) ((a) < (b) ? (a) : (b))

// ---- AVX-512: MR x NR blocks of 16-lane accumulators --------------------------------
#define DEFINE_GEMM_AVX512(MR, NR)                                                              \
__attribute__((target("avx512f")))                                                              \
static void gemm_nt_avx512_##MR##x##NR(int64_t m, int64_t n, int64_t k, const float* a,          \
                                       int64_t lda, const float* b, int64_t ldb, float* c,       \
                                       int64_t ldc) {                                            \
    const int64_t kv = k / 16 * 16;                                                             \
    const __mmask16 tail = (__mmask16)((1u << (k - kv)) - 1u);                                  \
    for (int64_t j = 0; j < n; j += NR) {                                                       \
        const float* bp[NR];                                                                    \
        for (int q = 0; q < NR; q++) bp[q] = b + MIN(j + q, n - 1) * ldb;                       \
        for (int64_t i = 0; i < m; i += MR) {                                                   \
            const float* ap[MR];                                                                \
            for (int p = 0; p < MR; p++) ap[p] = a + MIN(i + p, m - 1) * lda;                   \
            __m512 acc[MR][NR];                                                                 \
            for (int p = 0; p < MR; p++)                                                        \
                for (int q = 0; q < NR; q++) acc[p][q] = _mm512_setzero_ps();                   \
            for (int64_t x = 0; x < kv; x += 16) {                                              \
                __m512 bv[NR];                                                                  \
                for (int q = 0; q < NR; q++) bv[q] = _mm512_loadu_ps(bp[q] + x);               \
                for (int p = 0; p < MR; p++) {                                                  \
                    const __m512 av = _mm512_loadu_ps(ap[p] + x);                               \
                    for (int q = 0; q < NR; q++) acc[p][q] = _mm512_fmadd_ps(av, bv[q], acc[p][q]); \
                }                                                                               \
            }                                                                                   \
            if (tail) {                                                                         \
                __m512 bv[NR];                                                                  \
                for (int q = 0; q < NR; q++) bv[q] = _mm512_maskz_loadu_ps(tail, bp[q] + kv);   \
                for (int p = 0; p < MR; p++) {                                                  \
                    const __m512 av = _mm512_maskz_loadu_ps(tail, ap[p] + kv);                  \
                    for (int q = 0; q < NR; q++) acc[p][q] = _mm512_fmadd_ps(av, bv[q], acc[p][q]); \
                }                                                                               \
            }                                                                                   \
            for (int p = 0; p < MR && i + p < m; p++)                                           \
                for (int q = 0; q < NR && j + q < n; q++)                                       \
                    c[(i + p) * ldc + j + q] = _mm512_reduce_add_ps(acc[p][q]);                 \
        }                                                                                       \
    }                                                                                           \
}

// Decode products (M <= 4) do not come here: the row kernels of moe_cpu_formats.h serve
// every format there, float32 included.
DEFINE_GEMM_AVX512(4, 4)

// ---- AVX2 + FMA: 2 x 4 blocks of 8-lane accumulators (16 ymm registers) ----------
__attribute__((target("avx2,fma")))
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma")))
static void gemm_nt_avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                         const float* b, int64_t ldb, float* c, int64_t ldc) {
    enum { MR = 2, NR = 4, W = 8 };
    const int64_t kv = k / W * W;
    for (int64_t j = 0; j < n; j += NR) {
        const float* bp[NR];
        for (int q = 0; q < NR; q++) bp[q] = b + MIN(j + q, n - 1) * ldb;
        for (int64_t i = 0; i < m; i += MR) {
            const float* ap[MR];
            for (int p = 0; p < MR; p++) ap[p] = a + MIN(i + p, m - 1) * lda;
            __m256 acc[MR][NR];
            for (int p = 0; p < MR; p++)
                for (int q = 0; q < NR; q++) acc[p][q] = _mm256_setzero_ps();
            for (int64_t x = 0; x < kv; x += W) {
                __m256 bv[NR];
                for (int q = 0; q < NR; q++) bv[q] = _mm256_loadu_ps(bp[q] + x);
                for (int p = 0; p < MR; p++) {
                    const __m256 av = _mm256_loadu_ps(ap[p] + x);
                    for (int q = 0; q < NR; q++) acc[p][q] = _mm256_fmadd_ps(av, bv[q], acc[p][q]);
                }
            }
            for (int p = 0; p < MR && i + p < m; p++)
                for (int q = 0; q < NR && j + q < n; q++) {
                    float s = hsum256(acc[p][q]);
                    for (int64_t x = kv; x < k; x++) s += ap[p][x] * bp[q][x];
                    c[(i + p) * ldc + j + q] = s;
                }
        }
    }
}

typedef void (*gemm_fn)(int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t);

static gemm_fn select_kernel(void) {
    switch (moe_cpu_isa_level()) {
    case MOE_CPU_ISA_AVX512_GFNI:
    case MOE_CPU_ISA_AVX512_VNNI:
    case MOE_CPU_ISA_AVX512: return gemm_nt_avx512_4x4;
    case MOE_CPU_ISA_AVX2: return gemm_nt_avx2;
    default: return 0;
    }
}

static gemm_fn kernel(void) {
    // Benign race: every thread computes the same value.
    static gemm_fn chosen;
    static int selected;
    if (!__atomic_load_n(&selected, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&chosen, select_kernel(), __ATOMIC_RELAXED);
        __atomic_store_n(&selected, 1, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&chosen, __ATOMIC_RELAXED);
}

int moe_cpu_gemm_nt_available(void) { return kernel() != 0; }

void moe_cpu_gemm_nt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float* c, int64_t ldc) {
    if (m > 0 && n > 0) kernel()(m, n, k, a, lda, b, ldb, c, ldc);
}

#else

int moe_cpu_gemm_nt_available(void) { return 0; }

void moe_cpu_gemm_nt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float* c, int64_t ldc) {
    // Never called: callers use BLAS where no vector implementation exists.
    (void)m; (void)n; (void)k; (void)a; (void)lda; (void)b; (void)ldb; (void)c; (void)ldc;
}

#endif
