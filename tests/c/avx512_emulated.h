// Builds the AVX-512 kernels (Sources/CMoECPU/formats/avx512*.c) for a CPU with AVX2 only:
// SIMDe's portable AVX-512 intrinsics stand in for the instructions, so the code paths that
// AVX-512 machines take run, slowly, where the tests run.
#ifndef MOE_CPU_AVX512_EMULATED_H
#define MOE_CPU_AVX512_EMULATED_H
#define MOE_CPU_AVX512_EMULATED 1
#include <immintrin.h>
#include <string.h>
// The compiler's header has typedef'd the mask type already (unsigned long long), which
// SIMDe would redefine as uint64_t.
#define __mmask64 __mmask64
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/gfni.h>
#define T512
#define T512Q8

// What SIMDe 0.8.2 lacks, written here.
static inline simde__m512i moe_emu_halves(simde__m256i lo, simde__m256i hi) {
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(lo), hi, 1);
}
static inline simde__m128i moe_emu_cvtepi32_epi8(simde__m512i a) {
    int32_t v[16]; int8_t r[16];
    simde_mm512_storeu_si512(v, a);
    for (int i = 0; i < 16; i++) r[i] = (int8_t)v[i];
    return simde_mm_loadu_si128(r);
}
static inline simde__m256i moe_emu_cvtepi32_epi16(simde__m512i a) {
    int32_t v[16]; int16_t r[16];
    simde_mm512_storeu_si512(v, a);
    for (int i = 0; i < 16; i++) r[i] = (int16_t)v[i];
    return simde_mm256_loadu_si256(r);
}
static inline simde__m512i moe_emu_cvtepu8_epi32(simde__m128i a) {
    return moe_emu_halves(simde_mm256_cvtepu8_epi32(a), simde_mm256_cvtepu8_epi32(simde_mm_srli_si128(a, 8)));
}
static inline float moe_emu_reduce_add_ps(simde__m512 a) {
    // A tree of halves, then quarters, ...: the checks allow for rounding, not one order.
    float v[16];
    simde_mm512_storeu_ps(v, a);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) v[i] = v[i] + v[i + w];
    return v[0];
}
static inline simde__m512i moe_emu_zextsi256_si512(simde__m256i a) {
    return moe_emu_halves(a, simde_mm256_setzero_si256());
}
// Masked loads that touch only the elements their mask selects, as the instructions do
// (SIMDe's read the whole vector and mask it: past the end of an exact-size buffer):
// `count` elements of `size` bytes into `out`, those the mask leaves out zero.
static inline void moe_emu_masked_copy(void* out, uint64_t k, const void* p, int count, int size) {
    memset(out, 0, (size_t)(count * size));
    for (int i = 0; i < count; i++)
        if (k >> i & 1) memcpy((char*)out + size * i, (const char*)p + size * i, (size_t)size);
}
#define MOE_EMU_MASKZ_LOAD(name, type, mask, count, size, load)  \
    static inline type name(mask k, const void* p) {             \
        char v[(count) * (size)];                                 \
        moe_emu_masked_copy(v, k, p, count, size);                \
        return load((const void*)v);                              \
    }
MOE_EMU_MASKZ_LOAD(moe_emu_maskz_loadu_ps, simde__m512, uint16_t, 16, 4, simde_mm512_loadu_ps)
MOE_EMU_MASKZ_LOAD(moe_emu_maskz_loadu_epi16, simde__m256i, uint16_t, 16, 2, simde_mm256_loadu_si256)
MOE_EMU_MASKZ_LOAD(moe_emu_maskz_loadu_epi8, simde__m512i, uint64_t, 64, 1, simde_mm512_loadu_si512)
MOE_EMU_MASKZ_LOAD(moe_emu_mm_maskz_loadu_epi8, simde__m128i, uint16_t, 16, 1, simde_mm_loadu_si128)
MOE_EMU_MASKZ_LOAD(moe_emu_mm_maskz_loadu_epi16, simde__m128i, uint8_t, 8, 2, simde_mm_loadu_si128)
MOE_EMU_MASKZ_LOAD(moe_emu_mm256_maskz_loadu_ps, simde__m256, uint8_t, 8, 4, simde_mm256_loadu_ps)
#undef _mm512_maskz_loadu_ps
#undef _mm256_maskz_loadu_epi16
#undef _mm512_maskz_loadu_epi8
#undef _mm_maskz_loadu_epi8
#undef _mm_maskz_loadu_epi16
#undef _mm256_maskz_loadu_ps
#define _mm512_maskz_loadu_ps(k, p) moe_emu_maskz_loadu_ps((k), (p))
#define _mm256_maskz_loadu_epi16(k, p) moe_emu_maskz_loadu_epi16((k), (p))
#define _mm512_maskz_loadu_epi8(k, p) moe_emu_maskz_loadu_epi8((k), (p))
#define _mm_maskz_loadu_epi8(k, p) moe_emu_mm_maskz_loadu_epi8((k), (p))
#define _mm_maskz_loadu_epi16(k, p) moe_emu_mm_maskz_loadu_epi16((k), (p))
#define _mm256_maskz_loadu_ps(k, p) moe_emu_mm256_maskz_loadu_ps((k), (p))
#define _mm512_cvtepi32_epi8(a) moe_emu_cvtepi32_epi8(a)
#define _mm512_cvtepi32_epi16(a) moe_emu_cvtepi32_epi16(a)
#define _mm512_cvtepu8_epi32(a) moe_emu_cvtepu8_epi32(a)
#define _mm512_reduce_add_ps(a) moe_emu_reduce_add_ps(a)
#define _mm512_zextsi256_si512(a) moe_emu_zextsi256_si512(a)
#undef _mm512_permute_ps
#define _mm512_permute_ps(a, imm) simde_mm512_shuffle_ps((a), (a), (imm))
#endif
