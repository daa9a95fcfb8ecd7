// The instruction set the CPU kernels use: the best this CPU has, or a lower one named by
// MOE_CPU_ISA (portable, avx2, avx512, avx512vnni, avx512gfni). Lowering it runs, on a
// machine with AVX-512, the code paths that other users' machines take
// (tests/python/test_cpu_isa.py runs every format on each of them); it never raises the
// level above what the CPU supports.
#include "moe_cpu_kernels.h"

#include <stdlib.h>
#include <string.h>

static int detected_level(void) {
#ifdef MOE_CPU_AVX512_EMULATED  // tests/c/avx512_emulated.h: every AVX-512 level, in software
    return MOE_CPU_ISA_AVX512_GFNI;
#endif
#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        if (!__builtin_cpu_supports("avx512vnni")) return MOE_CPU_ISA_AVX512;
        // Every CPU with GFNI and AVX-512 has VBMI (Ice Lake on, Zen 4 on); q8_avx512.c takes both.
        return __builtin_cpu_supports("gfni") && __builtin_cpu_supports("avx512vbmi") ? MOE_CPU_ISA_AVX512_GFNI
                                                                                     : MOE_CPU_ISA_AVX512_VNNI;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return MOE_CPU_ISA_AVX2;
#endif
    return MOE_CPU_ISA_PORTABLE;
}

static int requested_level(void) {
    const char* name = getenv("MOE_CPU_ISA");
    if (name == NULL || name[0] == 0) return MOE_CPU_ISA_AVX512_GFNI;
    if (strcmp(name, "portable") == 0) return MOE_CPU_ISA_PORTABLE;
    if (strcmp(name, "avx2") == 0) return MOE_CPU_ISA_AVX2;
    if (strcmp(name, "avx512") == 0) return MOE_CPU_ISA_AVX512;
    if (strcmp(name, "avx512vnni") == 0) return MOE_CPU_ISA_AVX512_VNNI;
    return MOE_CPU_ISA_AVX512_GFNI;
}

int moe_cpu_isa_level(void) {
    // Benign race: every thread computes the same value.
    static int level = -1;
    int l = __atomic_load_n(&level, __ATOMIC_RELAXED);
    if (l < 0) {
        const int detected = detected_level(), requested = requested_level();
        l = requested < detected ? requested : detected;
        __atomic_store_n(&level, l, __ATOMIC_RELAXED);
    }
    return l;
}
