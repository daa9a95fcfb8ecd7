// ---- Apple's compiler builtins that headers call directly (MLX's bf16_math.h, utils.h) ----
// Apple's <metal_math> implements its functions with `__metal_<name>(x..., fast)` builtins;
// the last argument says fast or precise math. Here both are the float result, as for
// metal::fast. Provided for the scalar types SoftMetal's metal:: functions take.
#define __METAL_FAST_MATH__ true
#define __METAL_PRECISE_MATH__ false
#ifndef __METAL_MAYBE_FAST_MATH__  /* set from MTLCompileOptions.mathFloatingPointFunctions */
#define __METAL_MAYBE_FAST_MATH__ __METAL_PRECISE_MATH__
#endif
#define SM_BUILTIN1(name)                                                                     \
    template <class T> inline auto __metal_##name(T x, bool = false) { return metal::name(x); }
#define SM_BUILTIN2(name, fn)                                                                 \
    template <class T> inline auto __metal_##name(T x, T y, bool = false) { return metal::fn(x, y); }
SM_BUILTIN1(fabs) SM_BUILTIN1(acos) SM_BUILTIN1(acosh) SM_BUILTIN1(asin) SM_BUILTIN1(asinh)
SM_BUILTIN1(atan) SM_BUILTIN1(atanh) SM_BUILTIN1(ceil) SM_BUILTIN1(cos) SM_BUILTIN1(cosh)
SM_BUILTIN1(exp) SM_BUILTIN1(exp10) SM_BUILTIN1(exp2) SM_BUILTIN1(floor) SM_BUILTIN1(fract)
SM_BUILTIN1(log) SM_BUILTIN1(log10) SM_BUILTIN1(log2) SM_BUILTIN1(rint) SM_BUILTIN1(round)
SM_BUILTIN1(rsqrt) SM_BUILTIN1(sin) SM_BUILTIN1(sinh) SM_BUILTIN1(sqrt) SM_BUILTIN1(tan)
SM_BUILTIN1(tanh) SM_BUILTIN1(trunc)
SM_BUILTIN2(atan2, atan2) SM_BUILTIN2(divide, divide) SM_BUILTIN2(fmax, fmax) SM_BUILTIN2(fmin, fmin)
SM_BUILTIN2(fmod, fmod) SM_BUILTIN2(pow, pow) SM_BUILTIN2(powr, powr)
#undef SM_BUILTIN1
#undef SM_BUILTIN2
inline float __metal_cospi(float x, bool = false) { return __builtin_cosf(M_PI_F * x); }
inline float __metal_sinpi(float x, bool = false) { return __builtin_sinf(M_PI_F * x); }
inline float __metal_tanpi(float x, bool = false) { return __builtin_tanf(M_PI_F * x); }
inline float __metal_fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float __metal_fmax3(float a, float b, float c, bool = false) { return metal::max3(a, b, c); }
inline float __metal_fmin3(float a, float b, float c, bool = false) { return metal::min3(a, b, c); }
inline float __metal_fmedian3(float a, float b, float c, bool = false) { return metal::median3(a, b, c); }
inline float __metal_frexp(float x, int* e) { return __builtin_frexpf(x, e); }
inline float __metal_ldexp(float x, int k, bool = false) { return __builtin_ldexpf(x, k); }
inline float __metal_nextafter(float x, float y) { return __builtin_nextafterf(x, y); }
// Simd builtins: the same collectives as metal::simd_* (the line recorded for the divergence
// check is the caller's, i.e. the header's wrapper).
#define SM_SIMD_BUILTIN(name)                                                                 \
    template <class T> inline T __metal_##name(T v, uint __line = __builtin_LINE()) { return metal::name(v, __line); }
#define SM_SIMD_BUILTIN_ARG(name)                                                             \
    template <class T> inline T __metal_##name(T v, ushort a, uint __line = __builtin_LINE()) { return metal::name(v, a, __line); }
SM_SIMD_BUILTIN(simd_sum) SM_SIMD_BUILTIN(simd_product) SM_SIMD_BUILTIN(simd_min) SM_SIMD_BUILTIN(simd_max)
SM_SIMD_BUILTIN(simd_xor) SM_SIMD_BUILTIN(simd_prefix_inclusive_sum) SM_SIMD_BUILTIN(simd_prefix_exclusive_sum)
SM_SIMD_BUILTIN(simd_prefix_inclusive_product) SM_SIMD_BUILTIN(simd_prefix_exclusive_product)
SM_SIMD_BUILTIN_ARG(simd_broadcast) SM_SIMD_BUILTIN_ARG(simd_shuffle) SM_SIMD_BUILTIN_ARG(simd_shuffle_up)
SM_SIMD_BUILTIN_ARG(simd_shuffle_down) SM_SIMD_BUILTIN_ARG(simd_shuffle_xor)
SM_SIMD_BUILTIN_ARG(simd_shuffle_rotate_up) SM_SIMD_BUILTIN_ARG(simd_shuffle_rotate_down)
#undef SM_SIMD_BUILTIN
#undef SM_SIMD_BUILTIN_ARG
template <class T> inline T __metal_simd_shuffle_and_fill_up(T v, T f, ushort d, ushort m, uint __line = __builtin_LINE()) {
    return metal::simd_shuffle_and_fill_up(v, f, d, m, __line);
}
template <class T> inline T __metal_simd_shuffle_and_fill_down(T v, T f, ushort d, ushort m, uint __line = __builtin_LINE()) {
    return metal::simd_shuffle_and_fill_down(v, f, d, m, __line);
}
template <class T> inline T __metal_get_simdgroup_size(T) { return T(32); }

// The cost of one fiber switch (ns): two fibers on this thread switch back and forth.
namespace metal { namespace __sm {
static void* bench_main_sp;
static void* bench_fiber_sp;
static void bench_fiber() {
    for (;;) __sm_switch(&bench_fiber_sp, bench_main_sp);
}
}}
extern "C" int clock_gettime(int, void*);
extern "C" __attribute__((visibility("default"))) double __sm_bench_switch(uint64_t iterations) {
    static char stack[65536] __attribute__((aligned(64)));
    metal::__sm::bench_fiber_sp = metal::__sm::initial_frame(stack + sizeof stack, &metal::__sm::bench_fiber);
    struct { long s, ns; } t0, t1;
    clock_gettime(1, &t0);
    for (uint64_t i = 0; i < iterations; i++) __sm_switch(&metal::__sm::bench_main_sp, metal::__sm::bench_fiber_sp);
    clock_gettime(1, &t1);
    double ns = (double)(t1.s - t0.s) * 1e9 + (double)(t1.ns - t0.ns);
    return ns / (2.0 * (double)iterations);
}
