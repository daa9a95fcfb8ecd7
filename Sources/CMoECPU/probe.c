// The read probe of moe_cpu_kernels.h: the benchmark's bandwidth roof measured with the
// loads the kernels themselves use (512-bit for the quantized products on AVX-512, 256-bit
// for dense ones everywhere), so that no kernel of this library can be "above" it.
#include "moe_cpu_kernels.h"

#include <string.h>

static uint64_t stream_read_portable(const uint8_t* p, int64_t bytes) {
    uint64_t acc[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < bytes; i += 32)
        for (int q = 0; q < 4; q++) {
            uint64_t v;
            memcpy(&v, p + i + 8 * q, 8);
            acc[q] |= v;
        }
    return acc[0] | acc[1] | acc[2] | acc[3];
}

#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
#include <immintrin.h>

// Four independent accumulators keep four cache lines in flight per step.
__attribute__((target("avx512f"))) static uint64_t stream_read_avx512(const uint8_t* p, int64_t bytes) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < bytes; i += 256) {
        a0 = _mm512_or_si512(a0, _mm512_load_si512(p + i));
        a1 = _mm512_or_si512(a1, _mm512_load_si512(p + i + 64));
        a2 = _mm512_or_si512(a2, _mm512_load_si512(p + i + 128));
        a3 = _mm512_or_si512(a3, _mm512_load_si512(p + i + 192));
    }
    const __m512i a = _mm512_or_si512(_mm512_or_si512(a0, a1), _mm512_or_si512(a2, a3));
    uint64_t lanes[8];
    _mm512_storeu_si512(lanes, a);
    return lanes[0] | lanes[1] | lanes[2] | lanes[3] | lanes[4] | lanes[5] | lanes[6] | lanes[7];
}

__attribute__((target("avx2"))) static uint64_t stream_read_avx2(const uint8_t* p, int64_t bytes) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < bytes; i += 128) {
        a0 = _mm256_or_si256(a0, _mm256_load_si256((const __m256i*)(p + i)));
        a1 = _mm256_or_si256(a1, _mm256_load_si256((const __m256i*)(p + i + 32)));
        a2 = _mm256_or_si256(a2, _mm256_load_si256((const __m256i*)(p + i + 64)));
        a3 = _mm256_or_si256(a3, _mm256_load_si256((const __m256i*)(p + i + 96)));
    }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i*)lanes, _mm256_or_si256(_mm256_or_si256(a0, a1), _mm256_or_si256(a2, a3)));
    return lanes[0] | lanes[1] | lanes[2] | lanes[3];
}

uint64_t moe_cpu_stream_read(const void* p, int64_t bytes, int bits) {
    const int level = moe_cpu_isa_level();
    if (level >= MOE_CPU_ISA_AVX512 && bits >= 512) return stream_read_avx512(p, bytes);
    if (level >= MOE_CPU_ISA_AVX2) return stream_read_avx2(p, bytes);
    return stream_read_portable(p, bytes);
}

#else

uint64_t moe_cpu_stream_read(const void* p, int64_t bytes, int bits) {
    (void)bits;
    return stream_read_portable(p, bytes);
}

#endif
