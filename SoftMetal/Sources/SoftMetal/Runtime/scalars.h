namespace metal {

// ---- scalar types ----
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef int64_t long_t;
typedef uint64_t ulong;
typedef _Float16 half;
using ::size_t;
using ::ptrdiff_t;

namespace __sm {
template <class T> struct remove_cvref { typedef T type; };
template <class T> struct remove_cvref<const T> { typedef T type; };
template <class T> struct remove_cvref<volatile T> { typedef T type; };
template <class T> struct remove_cvref<const volatile T> { typedef T type; };
template <class T> struct remove_cvref<T&> : remove_cvref<T> {};
template <class T> struct remove_cvref<T&&> : remove_cvref<T> {};
template <class T> using rcv = typename remove_cvref<T>::type;
template <class T> struct identity { typedef T type; };
template <bool B, class T = void> struct enable_if {};
template <class T> struct enable_if<true, T> { typedef T type; };
template <bool B, class T = void> using enable_if_t = typename enable_if<B, T>::type;
template <class A, class B> struct same { static constexpr bool value = false; };
template <class A> struct same<A, A> { static constexpr bool value = true; };
template <class...> using void_t = void;
template <class T> T&& declval();

// bfloat is clang's __bf16, an arithmetic type, so that it takes part in the usual
// arithmetic conversions as MSL's does (`c ? bf : f` is a float; a class type with
// conversions both ways made that ambiguous). Every operation rounds to nearest even
// (the build passes -fbfloat16-excess-precision=none); NaN stays NaN.
static constexpr inline uint16_t float_to_bf(float f) {
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
}  // namespace __sm

typedef __bf16 bfloat;
namespace __sm {
template <class T> struct bf_arith { typedef void type; };  // bfloat op T
template <> struct bf_arith<bfloat> { typedef bfloat type; };
template <> struct bf_arith<float> { typedef float type; };
template <> struct bf_arith<double> { typedef float type; };
template <> struct bf_arith<half> { typedef float type; };
template <> struct bf_arith<int> { typedef bfloat type; };
template <> struct bf_arith<uint> { typedef bfloat type; };
template <> struct bf_arith<short> { typedef bfloat type; };
template <> struct bf_arith<ushort> { typedef bfloat type; };
template <> struct bf_arith<long> { typedef bfloat type; };
template <> struct bf_arith<unsigned long> { typedef bfloat type; };
template <> struct bf_arith<char> { typedef bfloat type; };
template <> struct bf_arith<signed char> { typedef bfloat type; };
template <> struct bf_arith<uchar> { typedef bfloat type; };
// A cast between bfloat and half: MSL converts (MLX's copy kernels cast bfloat16 to half),
// clang refuses every conversion between __bf16 and _Float16, so it goes through float,
// which holds both exactly. The translator routes casts to half, bfloat and a template's
// type parameters here.
template <class To, class From> constexpr inline To scalar_cast(From f) {
    if constexpr ((same<rcv<To>, half>::value && same<rcv<From>, bfloat>::value) ||
                  (same<rcv<To>, bfloat>::value && same<rcv<From>, half>::value))
        return (To)(float)f;
    else
        return (To)f;
}
}  // namespace __sm
typedef bfloat bfloat16_t;
}  // namespace metal

// The library calls clang lowers float -> __bf16 and double -> __bf16 to, defined in each
// library (hidden): libgcc before 13 has neither, and a library imports no more than it must.
extern "C" __attribute__((visibility("hidden"))) __bf16 __truncsfbf2(float f) {
    return __builtin_bit_cast(__bf16, metal::__sm::float_to_bf(f));
}
extern "C" __attribute__((visibility("hidden"))) __bf16 __truncdfbf2(double d) {
    // Through float rounded to odd, so that the second rounding is exact (no double rounding).
    float f = (float)d;
    if ((double)f != d && f == f) {
        uint32_t u = __builtin_bit_cast(uint32_t, f);
        if (__builtin_fabs((double)f) > __builtin_fabs(d)) u -= 1;  // toward zero: truncated
        f = __builtin_bit_cast(float, u | 1u);
    }
    return __truncsfbf2(f);
}
