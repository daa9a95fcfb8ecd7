// ---- math ----
namespace metal {
#define SM_F1(name, fn)                                                                      \
    inline float name(float x) { return fn(x); }                                             \
    inline half name(half x) { return (half)fn((float)x); }                                  \
    /* bfloat: a template, so that a kernel's own `bfloat name(bfloat)` (MLX's bf16_math.h) */ \
    /* is a distinct, preferred overload rather than a redefinition */                        \
    template <class B, class = __sm::enable_if_t<__sm::same<B, bfloat>::value>>             \
    inline float name(B x) { return fn((float)x); }                                          \
    /* an unsuffixed literal (`floor(v*0.0625)`) is float in MSL, which has no double */     \
    inline float name(double x) { return fn((float)x); }                                     \
    template <class V, class = __sm::enable_if_t<__sm::is_vec<V>::value>> inline V name(V v) { \
        V r;                                                                                 \
        for (int i = 0; i < __sm::vtraits<V>::N; i++) r[i] = name(v[i]);                      \
        return r;                                                                            \
    }
#define SM_F2(name, fn)                                                                      \
    inline float name(float x, float y) { return fn(x, y); }                                 \
    inline half name(half x, half y) { return (half)fn((float)x, (float)y); }                \
    inline float name(double x, double y) { return fn((float)x, (float)y); }                 \
    template <class V, class = __sm::enable_if_t<__sm::is_vec<V>::value>> inline V name(V a, V b) { \
        V r;                                                                                 \
        for (int i = 0; i < __sm::vtraits<V>::N; i++) r[i] = name(a[i], b[i]);                 \
        return r;                                                                            \
    }                                                                                        \
    /* a scalar with a vector converts to the vector type (`fmax(0, x)` with x a float4) */  \
    template <class V, class S, class = __sm::enable_if_t<__sm::is_vec<V>::value && !__sm::is_vec<S>::value>> \
    inline V name(S a, V b) { return name(V(typename __sm::vtraits<V>::E(a)), b); }          \
    template <class V, class S, class = __sm::enable_if_t<__sm::is_vec<V>::value && !__sm::is_vec<S>::value>> \
    inline V name(V a, S b) { return name(a, V(typename __sm::vtraits<V>::E(b))); }
namespace __sm {
static inline float rsqrtf_(float x) { return 1.0f / __builtin_sqrtf(x); }
static inline float fractf_(float x) { return x - __builtin_floorf(x); }
static inline float exp10f_(float x) { return __builtin_powf(10.0f, x); }
static inline float saturatef_(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
static inline float signf_(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x == x ? x : 0.0f)); }
}  // namespace __sm
SM_F1(exp, __builtin_expf)
SM_F1(exp2, __builtin_exp2f)
SM_F1(exp10, __sm::exp10f_)
SM_F1(log, __builtin_logf)
SM_F1(log2, __builtin_log2f)
SM_F1(log10, __builtin_log10f)
SM_F1(sqrt, __builtin_sqrtf)
SM_F1(rsqrt, __sm::rsqrtf_)
SM_F1(sin, __builtin_sinf)
SM_F1(cos, __builtin_cosf)
SM_F1(tan, __builtin_tanf)
SM_F1(asin, __builtin_asinf)
SM_F1(acos, __builtin_acosf)
SM_F1(atan, __builtin_atanf)
SM_F1(sinh, __builtin_sinhf)
SM_F1(cosh, __builtin_coshf)
SM_F1(tanh, __builtin_tanhf)
SM_F1(asinh, __builtin_asinhf)
SM_F1(acosh, __builtin_acoshf)
SM_F1(atanh, __builtin_atanhf)
SM_F1(floor, __builtin_floorf)
SM_F1(ceil, __builtin_ceilf)
SM_F1(round, __builtin_roundf)
SM_F1(rint, __builtin_rintf)
SM_F1(trunc, __builtin_truncf)
SM_F1(fract, __sm::fractf_)
SM_F1(fabs, __builtin_fabsf)
SM_F1(saturate, __sm::saturatef_)
SM_F1(sign, __sm::signf_)
// No erf: MSL has none (MLX and others define their own `erf`, which a stand-in here
// would silently shadow or make ambiguous).
SM_F2(pow, __builtin_powf)
SM_F2(powr, __builtin_powf)
SM_F2(atan2, __builtin_atan2f)
SM_F2(fmod, __builtin_fmodf)
SM_F2(copysign, __builtin_copysignf)
SM_F2(fmin, __builtin_fminf)
SM_F2(fmax, __builtin_fmaxf)
SM_F2(fdim, __builtin_fdimf)
#undef SM_F1
#undef SM_F2
inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline half fma(half a, half b, half c) { return (half)__builtin_fmaf((float)a, (float)b, (float)c); }
template <class V, class = __sm::enable_if_t<__sm::is_vec<V>::value>> inline V fma(V a, V b, V c) {
    V r;
    for (int i = 0; i < __sm::vtraits<V>::N; i++) r[i] = fma(a[i], b[i], c[i]);
    return r;
}

// min / max / clamp / abs for every scalar type, element-wise for vectors.
#define SM_MINMAX(T)                                                               \
    inline T min(T a, T b) { return b < a ? b : a; }                               \
    inline T max(T a, T b) { return a < b ? b : a; }                               \
    inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
SM_MINMAX(int)
SM_MINMAX(uint)
SM_MINMAX(short)
SM_MINMAX(ushort)
SM_MINMAX(signed char)
SM_MINMAX(uchar)
SM_MINMAX(long_t)
SM_MINMAX(ulong)
#undef SM_MINMAX
// float min/max follow fmin/fmax: a NaN operand yields the other one.
inline float min(float a, float b) { return __builtin_fminf(a, b); }
inline float max(float a, float b) { return __builtin_fmaxf(a, b); }
inline float clamp(float x, float lo, float hi) { return min(max(x, lo), hi); }
inline half min(half a, half b) { return (half)__builtin_fminf((float)a, (float)b); }
inline half max(half a, half b) { return (half)__builtin_fmaxf((float)a, (float)b); }
inline half clamp(half x, half lo, half hi) { return min(max(x, lo), hi); }
// bfloat overloads are templates constrained to bfloat (`SM_BF_ONLY`): MSL declares its
// math generically, so a kernel may declare its own `bfloat max(bfloat, bfloat)` (MLX's
// bf16_math.h does), which must then be a distinct, preferred overload, not a redefinition.
#define SM_BF_ONLY template <class B, class = __sm::enable_if_t<__sm::same<B, bfloat>::value>>
SM_BF_ONLY inline bfloat min(B a, B b) { return bfloat(__builtin_fminf((float)a, (float)b)); }
SM_BF_ONLY inline bfloat max(B a, B b) { return bfloat(__builtin_fmaxf((float)a, (float)b)); }
SM_BF_ONLY inline bfloat clamp(B x, B lo, B hi) { return bfloat(__builtin_fminf(__builtin_fmaxf((float)x, (float)lo), (float)hi)); }
template <class V, class = __sm::enable_if_t<__sm::is_vec<V>::value>> inline V min(V a, V b) {
    V r;
    for (int i = 0; i < __sm::vtraits<V>::N; i++) r[i] = min(a[i], b[i]);
    return r;
}
template <class V, class = __sm::enable_if_t<__sm::is_vec<V>::value>> inline V max(V a, V b) {
    V r;
    for (int i = 0; i < __sm::vtraits<V>::N; i++) r[i] = max(a[i], b[i]);
    return r;
}
template <class V, class = __sm::enable_if_t<__sm::is_vec<V>::value>> inline V clamp(V x, V lo, V hi) {
    V r;
    for (int i = 0; i < __sm::vtraits<V>::N; i++) r[i] = clamp(x[i], lo[i], hi[i]);
    return r;
}
template <class V, class = __sm::enable_if_t<__sm::is_vec<V>::value>>
inline V clamp(V x, typename __sm::vtraits<V>::E lo, typename __sm::vtraits<V>::E hi) {
    V r;
    for (int i = 0; i < __sm::vtraits<V>::N; i++) r[i] = clamp(x[i], lo, hi);
    return r;
}
inline int abs(int x) { return x < 0 ? -x : x; }
inline short abs(short x) { return (short)(x < 0 ? -x : x); }
inline signed char abs(signed char x) { return (signed char)(x < 0 ? -x : x); }
inline long_t abs(long_t x) { return x < 0 ? -x : x; }
inline uint abs(uint x) { return x; }
inline float abs(float x) { return __builtin_fabsf(x); }
inline half abs(half x) { return (half)__builtin_fabsf((float)x); }
SM_BF_ONLY inline bfloat abs(B x) { return __builtin_bit_cast(bfloat, (uint16_t)(__builtin_bit_cast(uint16_t, x) & 0x7fff)); }
template <class V, class = __sm::enable_if_t<__sm::is_vec<V>::value>> inline V abs(V v) {
    V r;
    for (int i = 0; i < __sm::vtraits<V>::N; i++) r[i] = abs(v[i]);
    return r;
}
inline float mix(float x, float y, float a) { return x + (y - x) * a; }
inline half mix(half x, half y, half a) { return x + (y - x) * a; }
template <class V, class = __sm::enable_if_t<__sm::is_vec<V>::value>> inline V mix(V x, V y, V a) { return x + (y - x) * a; }
template <class V, class = __sm::enable_if_t<__sm::is_vec<V>::value>>
inline V mix(V x, V y, typename __sm::vtraits<V>::E a) { return x + (y - x) * a; }
inline float step(float edge, float x) { return x < edge ? 0.0f : 1.0f; }
inline half step(half edge, half x) { return x < edge ? (half)0 : (half)1; }
inline float smoothstep(float e0, float e1, float x) {
    float t = clamp((x - e0) / (e1 - e0), 0.0f, 1.0f);
    return t * t * (3.0f - 2.0f * t);
}
inline bool isnan(float x) { return __builtin_isnan(x); }
inline bool isnan(half x) { return __builtin_isnan((float)x); }
SM_BF_ONLY inline bool isnan(B x) { return __builtin_isnan((float)x); }
inline bool isinf(float x) { return __builtin_isinf(x); }
inline bool isinf(half x) { return __builtin_isinf((float)x); }
inline bool isfinite(float x) { return __builtin_isfinite(x); }
inline bool isfinite(half x) { return __builtin_isfinite((float)x); }
inline bool signbit(float x) { return __builtin_signbit(x); }
inline bool signbit(half x) { return __builtin_signbit((float)x); }
inline float ldexp(float x, int e) { return __builtin_ldexpf(x, e); }
inline float divide(float a, float b) { return a / b; }
template <class V, class E = typename __sm::vtraits<V>::E, class = __sm::enable_if_t<__sm::is_vec<V>::value>>
inline E dot(V a, V b) {
    E s = a[0] * b[0];
    for (int i = 1; i < __sm::vtraits<V>::N; i++) s += a[i] * b[i];
    return s;
}
template <class V, class E = typename __sm::vtraits<V>::E, class = __sm::enable_if_t<__sm::is_vec<V>::value>>
inline E length(V a) { return sqrt(dot(a, a)); }
template <class V, class E = typename __sm::vtraits<V>::E, class = __sm::enable_if_t<__sm::is_vec<V>::value>>
inline E length_squared(V a) { return dot(a, a); }
template <class V, class E = typename __sm::vtraits<V>::E, class = __sm::enable_if_t<__sm::is_vec<V>::value>>
inline E distance(V a, V b) { return length(a - b); }
template <class V, class = __sm::enable_if_t<__sm::is_vec<V>::value>> inline V normalize(V a) { return a * rsqrt(dot(a, a)); }
inline float3 cross(float3 a, float3 b) { return float3{a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x}; }
template <class V, class = __sm::enable_if_t<__sm::is_vec<V>::value>> inline bool all(V v) {
    for (int i = 0; i < __sm::vtraits<V>::N; i++) if (!v[i]) return false;
    return true;
}
template <class V, class = __sm::enable_if_t<__sm::is_vec<V>::value>> inline bool any(V v) {
    for (int i = 0; i < __sm::vtraits<V>::N; i++) if (v[i]) return true;
    return false;
}
// Comparisons of clang vectors give integer vectors (-1 / 0); all / any / select accept them.
template <class T, class C, class = __sm::enable_if_t<!__sm::is_vec<T>::value>> inline T select(T a, T b, C c) { return c ? b : a; }
template <class V, class C, class = __sm::enable_if_t<__sm::is_vec<V>::value>, class = void>
inline V select(V a, V b, C c) {
    V r;
    for (int i = 0; i < __sm::vtraits<V>::N; i++) {
        if constexpr (__sm::is_vec<C>::value) r[i] = c[i] ? b[i] : a[i];
        else r[i] = c ? b[i] : a[i];
    }
    return r;
}
inline uint popcount(uint x) { return (uint)__builtin_popcount(x); }
inline int popcount(int x) { return __builtin_popcount((uint)x); }
inline ulong popcount(ulong x) { return (ulong)__builtin_popcountll(x); }
inline uint clz(uint x) { return x ? (uint)__builtin_clz(x) : 32u; }
inline int clz(int x) { return x ? __builtin_clz((uint)x) : 32; }
inline uint ctz(uint x) { return x ? (uint)__builtin_ctz(x) : 32u; }
inline int ctz(int x) { return x ? __builtin_ctz((uint)x) : 32; }
inline uint mulhi(uint a, uint b) { return (uint)(((uint64_t)a * b) >> 32); }
inline int mulhi(int a, int b) { return (int)(((int64_t)a * b) >> 32); }
inline uint reverse_bits(uint x) { return __builtin_bitreverse32(x); }
inline uint rotate(uint v, uint i) { i &= 31; return (v << i) | (v >> ((32 - i) & 31)); }
inline uint extract_bits(uint x, uint offset, uint bits) { return bits >= 32 ? x : (x >> offset) & ((1u << bits) - 1); }

#define SM_MATH_USINGS \
    using metal::exp; using metal::exp2; using metal::exp10; using metal::log; using metal::log2; using metal::log10; \
    using metal::sqrt; using metal::rsqrt; using metal::sin; using metal::cos; using metal::tan; using metal::tanh; \
    using metal::sinh; using metal::cosh; using metal::asin; using metal::acos; using metal::atan; using metal::atan2; \
    using metal::pow; using metal::powr; using metal::fmin; using metal::fmax; using metal::fabs; using metal::floor; \
    using metal::ceil; using metal::round; using metal::trunc; using metal::fract; using metal::fmod; using metal::divide; \
    using metal::normalize; using metal::length; using metal::distance; using metal::fma; using metal::min; using metal::max; \
    using metal::clamp; using metal::abs; using metal::saturate; using metal::copysign;
namespace precise { SM_MATH_USINGS }
// No faster approximations here: fast:: gives the float result too. A namespace of its own
// (not an alias of precise) so that kernels can add to it, as MLX's bf16_math.h does.
namespace fast { SM_MATH_USINGS }
#undef SM_MATH_USINGS

inline float max3(float a, float b, float c) { return max(max(a, b), c); }
inline float min3(float a, float b, float c) { return min(min(a, b), c); }
inline float median3(float a, float b, float c) { return max(min(a, b), min(max(a, b), c)); }
inline int max3(int a, int b, int c) { return max(max(a, b), c); }
inline int min3(int a, int b, int c) { return min(min(a, b), c); }
inline uint max3(uint a, uint b, uint c) { return max(max(a, b), c); }
inline uint min3(uint a, uint b, uint c) { return min(min(a, b), c); }
inline float sincos(float x, float& c) { c = __builtin_cosf(x); return __builtin_sinf(x); }

// <metal_array>: metal::array<T, N>, an aggregate (`return {a, b};`).
template <class T, size_t N> struct array {
    T __elems[N];
    constexpr size_t size() const { return N; }
    constexpr T& operator[](size_t i) { return __elems[i]; }
    constexpr const T& operator[](size_t i) const { return __elems[i]; }
    T* begin() { return __elems; }
    T* end() { return __elems + N; }
    const T* begin() const { return __elems; }
    const T* end() const { return __elems + N; }
};

// <metal_type_traits> and <metal_limits>, the parts kernels use.
using std::is_same;
using std::enable_if;
using std::enable_if_t;
using std::conditional;
using std::conditional_t;
using std::is_integral;
using std::is_signed;
using std::is_unsigned;
using std::remove_cv;
using std::remove_cv_t;
using std::integral_constant;
using std::bool_constant;
using std::true_type;
using std::false_type;
using std::is_convertible;
using std::remove_reference;
using std::remove_reference_t;
using std::decay;
using std::decay_t;
template <class A, class B> constexpr bool is_same_v = std::is_same<A, B>::value;
template <class A, class B> constexpr bool is_convertible_v = std::is_convertible<A, B>::value;
// Internals of Apple's <metal_type_traits> that headers use (MLX's atomic.h, under
// `#pragma METAL internals : enable`, which is ignored here).
template <class... B> struct _disjunction : std::disjunction<B...> {};
template <class... B> struct _conjunction : std::conjunction<B...> {};
// <metal_type_traits>' remove_addrspace (MLX's steel/utils/integral_constant.h): address
// spaces are not part of types here, so it is the identity.
template <class T> struct remove_addrspace { using type = T; };
template <class T> using remove_addrspace_t = typename remove_addrspace<T>::type;
// <metal_uniform>: uniform<T> marks a value the same in every thread; here it is T itself.
template <class T> using uniform = T;
template <class T> constexpr T make_uniform(T x) { return x; }
template <class T> constexpr bool is_integral_v = std::is_integral<T>::value;
template <class T> constexpr bool is_signed_v = std::is_signed<T>::value;
template <class T> constexpr bool is_unsigned_v = std::is_unsigned<T>::value;
template <class T> struct is_floating_point : std::integral_constant<bool, std::is_floating_point<T>::value ||
    std::is_same<T, half>::value || std::is_same<T, bfloat>::value> {};
template <class T> constexpr bool is_floating_point_v = is_floating_point<T>::value;
template <class T> struct numeric_limits;
#define SM_LIMITS(T, lo, hi, low, eps, inf, qnan, isint)                                          \
    template <> struct numeric_limits<T> {                                                        \
        static constexpr bool is_specialized = true, is_integer = isint;                          \
        static constexpr T min() { return lo; }                                                  \
        static constexpr T max() { return hi; }                                                  \
        static constexpr T lowest() { return low; }                                              \
        static constexpr T epsilon() { return eps; }                                             \
        static constexpr T infinity() { return inf; }                                            \
        static constexpr T quiet_NaN() { return qnan; }                                          \
    };
SM_LIMITS(float, FLT_MIN, FLT_MAX, -FLT_MAX, FLT_EPSILON, __builtin_inff(), __builtin_nanf(""), false)
SM_LIMITS(half, HALF_MIN, HALF_MAX, (half)-65504.0f, HALF_EPSILON, (half)__builtin_inff(), (half)__builtin_nanf(""), false)
SM_LIMITS(bfloat, bfloat(1.175494351e-38f), bfloat(BFLOAT_MAX), bfloat(-BFLOAT_MAX), bfloat(0.0078125f), bfloat(__builtin_inff()), bfloat(__builtin_nanf("")), false)
SM_LIMITS(int, INT_MIN, INT_MAX, INT_MIN, 0, 0, 0, true)
SM_LIMITS(uint, 0u, UINT_MAX, 0u, 0u, 0u, 0u, true)
SM_LIMITS(short, (short)SHRT_MIN, (short)SHRT_MAX, (short)SHRT_MIN, (short)0, (short)0, (short)0, true)
SM_LIMITS(ushort, (ushort)0, (ushort)USHRT_MAX, (ushort)0, (ushort)0, (ushort)0, (ushort)0, true)
SM_LIMITS(long_t, LONG_MIN, LONG_MAX, LONG_MIN, 0, 0, 0, true)
SM_LIMITS(ulong, 0ul, ULONG_MAX, 0ul, 0ul, 0ul, 0ul, true)
SM_LIMITS(signed char, (signed char)SCHAR_MIN, (signed char)SCHAR_MAX, (signed char)SCHAR_MIN, (signed char)0, (signed char)0, (signed char)0, true)
SM_LIMITS(uchar, (uchar)0, (uchar)UCHAR_MAX, (uchar)0, (uchar)0, (uchar)0, (uchar)0, true)
SM_LIMITS(bool, false, true, false, false, false, false, true)
#undef SM_LIMITS
}  // namespace metal
