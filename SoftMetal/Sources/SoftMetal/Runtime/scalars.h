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

// bfloat16: stored as 16 bits, every operation computed in float and rounded to nearest
// even (NaN stays NaN). `__bf16` arithmetic would need __truncsfbf2, which libgcc 12 lacks.
// constexpr (`static constexpr bfloat m = numeric_limits<bfloat>::max();`, MLX's utils.h).
static constexpr inline float bf_to_float(uint16_t b) { return __builtin_bit_cast(float, (uint32_t)b << 16); }
static constexpr inline uint16_t float_to_bf(float f) {
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
}  // namespace __sm

struct bfloat {
    uint16_t __bits;
    bfloat() = default;
    constexpr bfloat(const bfloat&) = default;
    constexpr bfloat(float f) : __bits(__sm::float_to_bf(f)) {}
    constexpr bfloat(double f) : __bits(__sm::float_to_bf((float)f)) {}
    constexpr bfloat(half f) : __bits(__sm::float_to_bf((float)f)) {}
    constexpr bfloat(int i) : __bits(__sm::float_to_bf((float)i)) {}
    constexpr bfloat(uint i) : __bits(__sm::float_to_bf((float)i)) {}
    constexpr bfloat(short i) : __bits(__sm::float_to_bf((float)i)) {}
    constexpr bfloat(ushort i) : __bits(__sm::float_to_bf((float)i)) {}
    constexpr bfloat(long i) : __bits(__sm::float_to_bf((float)i)) {}
    constexpr bfloat(unsigned long i) : __bits(__sm::float_to_bf((float)i)) {}
    constexpr bfloat(bool b) : __bits(__sm::float_to_bf(b ? 1.0f : 0.0f)) {}
    bfloat& operator=(const bfloat&) = default;
    constexpr operator float() const { return __sm::bf_to_float(__bits); }
    explicit operator half() const { return (half)(float)*this; }
    constexpr bfloat operator-() const { return bfloat(-(float)*this); }  // exact: flips the sign
    constexpr bfloat operator+() const { return *this; }
};
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
}  // namespace __sm
#define SM_BF_OP(op)                                                                               \
    constexpr inline bfloat operator op(bfloat a, bfloat b) { return bfloat((float)a op(float) b); }        \
    template <class T, class R = typename __sm::bf_arith<T>::type,                                 \
              class = __sm::enable_if_t<!__sm::same<R, void>::value && !__sm::same<T, bfloat>::value>> \
    constexpr inline R operator op(bfloat a, T b) { return R((float)a op(float) b); }                       \
    template <class T, class R = typename __sm::bf_arith<T>::type,                                 \
              class = __sm::enable_if_t<!__sm::same<R, void>::value && !__sm::same<T, bfloat>::value>> \
    constexpr inline R operator op(T a, bfloat b) { return R((float)a op(float) b); }                       \
    template <class T> constexpr inline bfloat& operator op##=(bfloat & a, T b) { return a = bfloat((float)a op(float) b); }
SM_BF_OP(+)
SM_BF_OP(-)
SM_BF_OP(*)
SM_BF_OP(/)
#undef SM_BF_OP
#define SM_BF_CMP(op)                                                                              \
    constexpr inline bool operator op(bfloat a, bfloat b) { return (float)a op(float) b; }                  \
    template <class T, class = __sm::enable_if_t<!__sm::same<typename __sm::bf_arith<T>::type, void>::value && !__sm::same<T, bfloat>::value>> \
    constexpr inline bool operator op(bfloat a, T b) { return (float)a op(float) b; }                       \
    template <class T, class = __sm::enable_if_t<!__sm::same<typename __sm::bf_arith<T>::type, void>::value && !__sm::same<T, bfloat>::value>> \
    constexpr inline bool operator op(T a, bfloat b) { return (float)a op(float) b; }
SM_BF_CMP(<)
SM_BF_CMP(>)
SM_BF_CMP(<=)
SM_BF_CMP(>=)
SM_BF_CMP(==)
SM_BF_CMP(!=)
#undef SM_BF_CMP
typedef bfloat bfloat16_t;
}  // namespace metal
