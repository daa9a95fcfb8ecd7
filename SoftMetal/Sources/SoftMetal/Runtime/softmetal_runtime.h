// softmetal_runtime.h - SoftMetal's stand-in for <metal_stdlib>: the part of the Metal
// Shading Language library that compute kernels use, as C++17 for clang++, plus the fiber
// runtime that runs a threadgroup's GPU threads ("lanes") on one OS thread.
//
// Compiled into every kernel library (the translated MSL includes it first). It is
// embedded in the SoftMetal module and its text is part of the compile-cache key.
//
// Layout of execution: a dispatch runs threadgroups; one threadgroup runs as N fibers on
// the calling OS thread, scheduled round-robin: a lane runs until it blocks (a barrier, a
// simd operation) or returns, then the next runnable lane in the run order continues.
// With SM_FLAG_RUN_AHEAD a simdgroup runs until all its lanes wait at a threadgroup
// barrier (or returned) before the next simdgroup (in forward or reverse order) starts.
// Collective operations complete eagerly in the lane that arrives last. Each lane's state
// (struct Lane) lives at the top of its stack block; stack blocks are aligned to their
// power-of-two size, so the running lane is found from the stack pointer (no TLS).
#pragma once
#include <stdint.h>
#include <stddef.h>
#include <type_traits>

#define __METAL_VERSION__ 310
#define __SOFTMETAL__ 1
#define METAL_FUNC inline __attribute__((always_inline))
#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#define HUGE_VALF (__builtin_inff())
#define MAXFLOAT 3.402823466e+38f
#define FLT_MAX 3.402823466e+38f
#define FLT_MIN 1.175494351e-38f
#define FLT_EPSILON 1.192092896e-07f
#define HALF_MAX ((half)65504.0f)
#define MAXHALF ((half)65504.0f)
#define HALF_MIN ((half)6.10351562e-5f)
#define HALF_EPSILON ((half)9.765625e-4f)
#define BFLOAT_MAX 3.38953139e+38f
#define CHAR_BIT 8
#define SCHAR_MAX 127
#define SCHAR_MIN (-128)
#define UCHAR_MAX 255
#define SHRT_MAX 32767
#define SHRT_MIN (-32768)
#define USHRT_MAX 65535
#define INT_MAX 2147483647
#define INT_MIN (-2147483647 - 1)
#define UINT_MAX 4294967295u
#define LONG_MAX 9223372036854775807L
#define LONG_MIN (-9223372036854775807L - 1)
#define ULONG_MAX 18446744073709551615UL
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_PI_4_F 0.78539816339744830962f
#define M_1_PI_F 0.31830988618379067154f
#define M_2_PI_F 0.63661977236758134308f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.70710678118654752440f
#define M_E_F 2.71828182845904523536f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.43429448190325182765f
#define M_LN2_F 0.69314718055994530942f
#define M_LN10_F 2.30258509299404568402f

// ---- The C ABI shared with the host (must match Sources/CSoftMetal/include/csoftmetal.h) ----
extern "C" {
#define SM_ABI_VERSION 6
#define SM_MAX_BUFFERS 31
#define SM_MAX_THREADGROUP_MEMORY 31
#define SM_FLAG_POISON 1u
#define SM_FLAG_RUN_AHEAD 2u
#define SM_FLAG_REVERSE_SIMDGROUPS 4u
#define SM_OK 0
#define SM_ERROR_OUT_OF_BOUNDS 1
#define SM_ERROR_DIVERGENCE 2
#define SM_ERROR_RUNTIME 3
#define SM_ERROR_CHECK 7
typedef struct sm_dispatch {
    uint32_t abi_version;
    uint32_t flags;
    const char* kernel_name;
    void* buffers[SM_MAX_BUFFERS];
    uint64_t buffer_lengths[SM_MAX_BUFFERS];
    void* tg_mem[SM_MAX_THREADGROUP_MEMORY];
    uint64_t tg_mem_lengths[SM_MAX_THREADGROUP_MEMORY];
    void* tg_static;
    uint64_t tg_static_capacity;
    uint32_t threadgroups[3];
    uint32_t tptg[3];
    uint32_t grid[3];
    uint32_t first_group, end_group;
    uint32_t order_mul, order_add;
    uint64_t seed;
    void* stacks;
    uint64_t stack_size;
    uint32_t stack_count;
    uint32_t error_kind;
    void* scratch;
    uint64_t scratch_size;
    char* error;
    uint32_t error_capacity;
    uint32_t max_threads;
    struct sm_check* check;
} sm_dispatch;
/* The memory check (a library compiled with SM_CHECK_MEMORY: every load and store of the
 * kernel calls the runtime). Filled by the host, which runs checked dispatches one at a
 * time on one OS thread; the runtime writes the first finding. */
#define SM_CHECK_NONE 0
#define SM_CHECK_BOUNDS 1         /* an access outside every bound buffer, threadgroup allocation and the thread's own memory */
#define SM_CHECK_RACE 2           /* two threads, one writing, touched a byte with nothing ordering them */
#define SM_CHECK_UNINITIALIZED 3  /* a read of threadgroup memory no thread of the threadgroup wrote, or of buffer bytes never written */
#define SM_REGION_NONE (-1000)
#define SM_REGION_ARENA (-100)    /* threadgroup variables declared in the kernel */
/* The last writer and last reader of one byte (device memory: within the dispatch;
 * threadgroup memory: within the threadgroup). group: linear threadgroup number + 1
 * (0: none); thread: index in the threadgroup (SM_SHADOW_ATOMIC: by an atomic); epoch:
 * threadgroup barriers the threadgroup had passed; sg_epoch: simd operations the
 * thread's simdgroup had completed; pc: code offset in the library. */
#define SM_SHADOW_ATOMIC 0xFFFFu
#define SM_SHADOW_MANY 0x8000u    /* r_thread: another thread read too (same group, epoch) */
#define SM_SHADOW_MIXED 0x4000u   /* r_thread: ... from another simdgroup or simd epoch */
typedef struct sm_shadow {
    uint32_t w_group; uint16_t w_thread, w_sg_epoch; uint32_t w_epoch, w_pc;
    uint32_t r_group; uint16_t r_thread, r_sg_epoch; uint32_t r_epoch, r_pc;
} sm_shadow;
typedef struct sm_check {
    sm_shadow* buffer_shadow[SM_MAX_BUFFERS];  /* one cell per byte of buffers[i] (NULL: no race tracking) */
    sm_shadow* tg_shadow[SM_MAX_THREADGROUP_MEMORY];
    sm_shadow* arena_shadow;                   /* tg_static_capacity cells */
    uint32_t races;                            /* report races (else the shadow only tracks initialisation) */
    uint32_t uninitialized;                    /* report reads of unwritten threadgroup memory */
    uintptr_t image_start, image_end;          /* out: the library's own image (constants) */
    /* out: the first finding */
    uint32_t kind;
    uint32_t size;                             /* bytes of the access */
    uint32_t is_write, other_is_write;
    int32_t region;                            /* buffer index, -(i + 1) for threadgroup(i), SM_REGION_* */
    uint64_t offset;                           /* in the region (buffer: from the bound pointer; arena: in the variable) */
    uint64_t region_length;                    /* bytes of the region (bound bytes, the variable's size) */
    uint32_t outside;                          /* in no region: `region` is the nearest buffer */
    uintptr_t address;
    uint32_t pc, other_pc;
    uint32_t group, other_group;               /* linear threadgroup number + 1 */
    uint32_t thread, other_thread;
    uint32_t epoch, other_epoch;
    /* One bit per byte of the buffer bound at i (bit 0: the bound pointer), persistent across
     * dispatches: set once host or kernel wrote it. NULL: every byte counts as written. */
    uint8_t* buffer_init[SM_MAX_BUFFERS];
    uint64_t buffer_init_bit[SM_MAX_BUFFERS];   /* the bound pointer's bit in buffer_init[i] */
} sm_check;
#define SM_PARAM_BUFFER 1
#define SM_PARAM_THREADGROUP 2
#define SM_PARAM_BUILTIN 3
typedef struct sm_param_info {
    int32_t kind;
    int32_t index;
    int64_t elem_size;
    int32_t is_reference;
    const char* type;
    const char* name;
    const char* attribute;
} sm_param_info;
typedef struct sm_kernel_info {
    int32_t abi_version;
    int32_t param_count;
    const sm_param_info* params;
    int32_t max_total_threads;
} sm_kernel_info;
int snprintf(char*, unsigned long, const char*, ...);
void* memset(void*, int, unsigned long);
void* memcpy(void*, const void*, unsigned long);
}

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

// ---- vector types ----
#define SM_VECS(T, name)                                     \
    typedef T name##2 __attribute__((ext_vector_type(2)));   \
    typedef T name##3 __attribute__((ext_vector_type(3)));   \
    typedef T name##4 __attribute__((ext_vector_type(4)));   \
    typedef T name##8 __attribute__((ext_vector_type(8)));   \
    typedef T name##16 __attribute__((ext_vector_type(16)));
SM_VECS(float, float)
SM_VECS(half, half)
SM_VECS(int, int)
SM_VECS(uint, uint)
SM_VECS(short, short)
SM_VECS(ushort, ushort)
SM_VECS(signed char, char)
SM_VECS(uchar, uchar)
SM_VECS(long_t, long)
SM_VECS(ulong, ulong)
SM_VECS(bool, bool)
#undef SM_VECS

// bfloat vectors: plain structs (no swizzles beyond .x .y .z .w), element-wise operators.
template <int N> struct bfloat_vec;
#define SM_BFVEC_COMMON(N)                                                          \
    bfloat_vec() = default;                                                        \
    /* a scalar converts to a vector implicitly, as in MSL (`v = 0`) */            \
    template <class S, class = __sm::enable_if_t<!__sm::same<typename __sm::bf_arith<S>::type, void>::value>> \
    bfloat_vec(S s) { for (int i = 0; i < N; i++) v[i] = bfloat(s); }             \
    bfloat& operator[](int i) { return v[i]; }                                     \
    const bfloat& operator[](int i) const { return v[i]; }
template <> struct bfloat_vec<2> { union { struct { bfloat x, y; }; bfloat v[2]; }; SM_BFVEC_COMMON(2) };
template <> struct bfloat_vec<3> { union { struct { bfloat x, y, z; }; bfloat v[3]; }; SM_BFVEC_COMMON(3) };
template <> struct bfloat_vec<4> { union { struct { bfloat x, y, z, w; }; bfloat v[4]; }; SM_BFVEC_COMMON(4) };
#undef SM_BFVEC_COMMON
typedef bfloat_vec<2> bfloat2;
typedef bfloat_vec<3> bfloat3;
typedef bfloat_vec<4> bfloat4;
#define SM_BFV_OP(op)                                                                          \
    template <int N> inline bfloat_vec<N> operator op(bfloat_vec<N> a, bfloat_vec<N> b) {      \
        bfloat_vec<N> r;                                                                       \
        for (int i = 0; i < N; i++) r.v[i] = a.v[i] op b.v[i];                                 \
        return r;                                                                              \
    }                                                                                          \
    template <int N> inline bfloat_vec<N> operator op(bfloat_vec<N> a, bfloat b) {             \
        bfloat_vec<N> r;                                                                       \
        for (int i = 0; i < N; i++) r.v[i] = a.v[i] op b;                                      \
        return r;                                                                              \
    }                                                                                          \
    template <int N> inline bfloat_vec<N>& operator op##=(bfloat_vec<N>& a, bfloat_vec<N> b) { return a = a op b; }
SM_BFV_OP(+)
SM_BFV_OP(-)
SM_BFV_OP(*)
SM_BFV_OP(/)
#undef SM_BFV_OP

// packed vectors (no padding): structs with conversions to the aligned vector type.
#define SM_PACKED(T, name, N, ...)                                                           \
    struct packed_##name##N {                                                                \
        typedef name##N vector_t;                                                            \
        T v[N];                                                                              \
        packed_##name##N() = default;                                                        \
        packed_##name##N(name##N a) { for (int i = 0; i < N; i++) v[i] = a[i]; }            \
        operator name##N() const { name##N r; for (int i = 0; i < N; i++) r[i] = v[i]; return r; } \
        T& operator[](int i) { return v[i]; }                                                \
        const T& operator[](int i) const { return v[i]; }                                    \
    };
SM_PACKED(float, float, 2)
SM_PACKED(float, float, 3)
SM_PACKED(float, float, 4)
SM_PACKED(half, half, 2)
SM_PACKED(half, half, 3)
SM_PACKED(half, half, 4)
SM_PACKED(int, int, 2)
SM_PACKED(int, int, 3)
SM_PACKED(int, int, 4)
SM_PACKED(uint, uint, 2)
SM_PACKED(uint, uint, 3)
SM_PACKED(uint, uint, 4)
SM_PACKED(short, short, 2)
SM_PACKED(short, short, 3)
SM_PACKED(short, short, 4)
SM_PACKED(ushort, ushort, 2)
SM_PACKED(ushort, ushort, 3)
SM_PACKED(ushort, ushort, 4)
SM_PACKED(signed char, char, 2)
SM_PACKED(signed char, char, 3)
SM_PACKED(signed char, char, 4)
SM_PACKED(uchar, uchar, 2)
SM_PACKED(uchar, uchar, 3)
SM_PACKED(uchar, uchar, 4)
#undef SM_PACKED

}  // namespace metal
// As in MSL, the scalar and vector type names are usable without `using namespace metal`.
using metal::uint;
using metal::ushort;
using metal::uchar;
using metal::half;
using metal::bfloat;
#define SM_GLOBAL_VECS(name) using metal::name##2; using metal::name##3; using metal::name##4; using metal::name##8; using metal::name##16;
SM_GLOBAL_VECS(float)
SM_GLOBAL_VECS(half)
SM_GLOBAL_VECS(int)
SM_GLOBAL_VECS(uint)
SM_GLOBAL_VECS(short)
SM_GLOBAL_VECS(ushort)
SM_GLOBAL_VECS(char)
SM_GLOBAL_VECS(uchar)
SM_GLOBAL_VECS(long)
SM_GLOBAL_VECS(ulong)
SM_GLOBAL_VECS(bool)
#undef SM_GLOBAL_VECS
using metal::bfloat2;
using metal::bfloat3;
using metal::bfloat4;
using metal::packed_float2;
using metal::packed_float3;
using metal::packed_float4;
using metal::packed_half2;
using metal::packed_half3;
using metal::packed_half4;
using metal::packed_int2;
using metal::packed_int3;
using metal::packed_int4;
using metal::packed_uint2;
using metal::packed_uint3;
using metal::packed_uint4;
using metal::packed_short2;
using metal::packed_short3;
using metal::packed_short4;
using metal::packed_ushort2;
using metal::packed_ushort3;
using metal::packed_ushort4;
using metal::packed_char2;
using metal::packed_char3;
using metal::packed_char4;
using metal::packed_uchar2;
using metal::packed_uchar3;
using metal::packed_uchar4;
namespace metal {

namespace __sm {
// vtraits<T>: element type and count of scalars (N = 1) and vectors.
template <class T> struct vtraits { typedef T E; static constexpr int N = 1; static constexpr bool vec = false; };
#define SM_VT(T, name)                                                                                      \
    template <> struct vtraits<name##2> { typedef T E; static constexpr int N = 2; static constexpr bool vec = true; }; \
    template <> struct vtraits<name##3> { typedef T E; static constexpr int N = 3; static constexpr bool vec = true; }; \
    template <> struct vtraits<name##4> { typedef T E; static constexpr int N = 4; static constexpr bool vec = true; }; \
    template <> struct vtraits<name##8> { typedef T E; static constexpr int N = 8; static constexpr bool vec = true; }; \
    template <> struct vtraits<name##16> { typedef T E; static constexpr int N = 16; static constexpr bool vec = true; };
SM_VT(float, float)
SM_VT(half, half)
SM_VT(int, int)
SM_VT(uint, uint)
SM_VT(short, short)
SM_VT(ushort, ushort)
SM_VT(signed char, char)
SM_VT(uchar, uchar)
SM_VT(long_t, long)
SM_VT(ulong, ulong)
SM_VT(bool, bool)
#undef SM_VT
template <int M> struct vtraits<bfloat_vec<M>> { typedef bfloat E; static constexpr int N = M; static constexpr bool vec = true; };
template <class T> struct vcount { static constexpr int value = vtraits<rcv<T>>::N; };
template <class T> struct is_vec { static constexpr bool value = vtraits<rcv<T>>::vec; };
template <class V> struct velem { typedef typename vtraits<V>::E type; };

template <class T, class = void> struct packed_vector { typedef void type; };
template <class T> struct packed_vector<T, void_t<typename T::vector_t>> { typedef typename T::vector_t type; };
template <class E, class A> inline void vpush(E* out, int& k, const A& a) {
    if constexpr (!same<typename packed_vector<A>::type, void>::value) {  // packed_float4...
        vpush<E>(out, k, (typename packed_vector<A>::type)a);
    } else if constexpr (is_vec<A>::value) {
        for (int i = 0; i < vcount<A>::value; i++) out[k++] = (E)a[i];
    } else {
        out[k++] = (E)a;
    }
}
template <class... A> struct argcount { static constexpr int value = 0; };
template <class A, class... R> struct argcount<A, R...> { static constexpr int value = vcount<rcv<A>>::value + argcount<R...>::value; };
template <class V> struct vsize { static constexpr int value = vtraits<V>::N; };

// MSL vector constructors: float4(x) splats, float4(int4) converts element-wise,
// float4(a.xy, b, c) concatenates.
template <class V, class... A> inline V vmake(const A&... a) {
    typedef typename velem<V>::type E;
    constexpr int N = vsize<V>::value;
    V r;
    if constexpr (sizeof...(A) == 0) {
        for (int i = 0; i < N; i++) r[i] = E(0);
    } else if constexpr (sizeof...(A) == 1 && argcount<A...>::value == 1) {
        E buf[1];
        int k = 0;
        (vpush<E>(buf, k, a), ...);
        for (int i = 0; i < N; i++) r[i] = buf[0];
    } else {
        static_assert(argcount<A...>::value == N, "vector constructor: wrong number of components");
        E buf[N];
        int k = 0;
        (vpush<E>(buf, k, a), ...);
        for (int i = 0; i < N; i++) r[i] = buf[i];
    }
    return r;
}
// `(half4) x` (the translator's rewrite of a C-style cast to a vector type): element-wise
// conversion as MSL does, or a splat of a scalar.
template <class T, class... A> constexpr inline T construct(const A&... a) {  // constexpr: `static constexpr U init = U(0);`
    if constexpr (is_vec<T>::value) return vmake<T>(a...);
    else return T(a...);
}
template <class V> struct vcast {};
template <class V, class A> constexpr inline V operator->*(vcast<V>, const A& a) {
    if constexpr (is_vec<V>::value) return vmake<V>(a);
    else return (V)a;  // a cast to a template parameter that is not a vector
}
}  // namespace __sm

template <class T, int N> struct __vec_type { typedef T type __attribute__((ext_vector_type(N))); };
template <int N> struct __vec_type<bfloat, N> { typedef bfloat_vec<N> type; };
template <class T, int N> using vec = typename __vec_type<T, N>::type;

// Matrices (MSL `matrix<T, Cols, Rows>`, `float4x4`...): Cols columns of vec<T, Rows>,
// column-major and laid out as the columns one after another (as in device memory on a
// GPU); `m[c]` is column c. Conversion between element types is explicit, as in MSL.
template <class T, int C, int R> struct matrix {
    typedef vec<T, R> column_t;
    column_t columns[C];
    matrix() = default;
    explicit matrix(T d) {  // d on the diagonal, zero elsewhere
        for (int c = 0; c < C; c++)
            for (int r = 0; r < R; r++) columns[c][r] = c == r ? d : T(0);
    }
    template <class... V, class = typename __sm::enable_if<sizeof...(V) == C && (C > 1)>::type>
    matrix(V... cs) : columns{column_t(cs)...} {}
    template <class U> explicit matrix(const matrix<U, C, R>& m) {
        for (int c = 0; c < C; c++)
            for (int r = 0; r < R; r++) columns[c][r] = T(m.columns[c][r]);
    }
    column_t& operator[](int c) { return columns[c]; }
    const column_t& operator[](int c) const { return columns[c]; }
};
template <class T, int C, int R> inline matrix<T, C, R> operator+(matrix<T, C, R> a, const matrix<T, C, R>& b) {
    for (int c = 0; c < C; c++) a.columns[c] += b.columns[c];
    return a;
}
template <class T, int C, int R> inline matrix<T, C, R> operator-(matrix<T, C, R> a, const matrix<T, C, R>& b) {
    for (int c = 0; c < C; c++) a.columns[c] -= b.columns[c];
    return a;
}
template <class T, int C, int R> inline matrix<T, C, R> operator*(matrix<T, C, R> a, T s) {
    for (int c = 0; c < C; c++) a.columns[c] *= s;
    return a;
}
template <class T, int C, int R> inline matrix<T, C, R> operator*(T s, matrix<T, C, R> a) { return a * s; }
// matrix * column vector (Rows), row vector * matrix (Cols), matrix * matrix.
template <class T, int C, int R> inline vec<T, R> operator*(const matrix<T, C, R>& m, vec<T, C> v) {
    vec<T, R> r = m.columns[0] * v[0];
    for (int c = 1; c < C; c++) r += m.columns[c] * v[c];
    return r;
}
template <class T, int C, int R> inline vec<T, C> operator*(vec<T, R> v, const matrix<T, C, R>& m) {
    vec<T, C> r;
    for (int c = 0; c < C; c++) {
        T s = m.columns[c][0] * v[0];
        for (int k = 1; k < R; k++) s += m.columns[c][k] * v[k];
        r[c] = s;
    }
    return r;
}
template <class T, int K, int C, int R> inline matrix<T, C, R> operator*(const matrix<T, K, R>& a, const matrix<T, C, K>& b) {
    matrix<T, C, R> r;
    for (int c = 0; c < C; c++) r.columns[c] = a * b.columns[c];
    return r;
}
#define SM_MATRICES(T)                                                              \
    typedef matrix<T, 2, 2> T##2x2; typedef matrix<T, 2, 3> T##2x3; typedef matrix<T, 2, 4> T##2x4; \
    typedef matrix<T, 3, 2> T##3x2; typedef matrix<T, 3, 3> T##3x3; typedef matrix<T, 3, 4> T##3x4; \
    typedef matrix<T, 4, 2> T##4x2; typedef matrix<T, 4, 3> T##4x3; typedef matrix<T, 4, 4> T##4x4;
SM_MATRICES(float)
SM_MATRICES(half)
#undef SM_MATRICES
}  // namespace metal
#define SM_GLOBAL_MATRICES(T)                                                                 \
    using metal::T##2x2; using metal::T##2x3; using metal::T##2x4; using metal::T##3x2;         \
    using metal::T##3x3; using metal::T##3x4; using metal::T##4x2; using metal::T##4x3; using metal::T##4x4;
SM_GLOBAL_MATRICES(float)
SM_GLOBAL_MATRICES(half)
#undef SM_GLOBAL_MATRICES
namespace metal {

template <class To, class From> inline To as_type(const From& f) {
    static_assert(sizeof(To) == sizeof(From), "as_type: sizes differ");
    To t;
    __builtin_memcpy(&t, &f, sizeof(To));
    return t;
}

// ---- math ----
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
SM_BF_ONLY inline bfloat abs(B x) { bfloat r = x; r.__bits &= 0x7fff; return r; }
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

// ---- memory flags, atomics ----
enum class mem_flags : uint { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4, mem_threadgroup_imageblock = 8, mem_object_data = 16 };
inline constexpr mem_flags operator|(mem_flags a, mem_flags b) { return (mem_flags)((uint)a | (uint)b); }
enum memory_order { memory_order_relaxed = __ATOMIC_RELAXED, memory_order_acquire = __ATOMIC_ACQUIRE,
                    memory_order_release = __ATOMIC_RELEASE, memory_order_acq_rel = __ATOMIC_ACQ_REL,
                    memory_order_seq_cst = __ATOMIC_SEQ_CST };
enum class thread_scope { thread_scope_thread, thread_scope_simdgroup, thread_scope_threadgroup, thread_scope_device };
template <class T> struct _atomic { T __v; };
template <class T> using atomic = _atomic<T>;
typedef _atomic<int> atomic_int;
typedef _atomic<uint> atomic_uint;
typedef _atomic<bool> atomic_bool;
typedef _atomic<float> atomic_float;
typedef _atomic<ulong> atomic_ulong;
typedef _atomic<long_t> atomic_long;
// Under the memory check an atomic is bounds-checked and marks its bytes written, but
// its own loads are not traced (atomics never race).
#ifdef SM_CHECK_MEMORY
#define SM_ATOMIC_FN __attribute__((noinline, no_sanitize("coverage")))
namespace __sm { static void check_atomic(const void* p, uint32_t size); }
#define SM_ATOMIC_CHECK(a) ::metal::__sm::check_atomic((const void*)(a), sizeof(T))
#else
#define SM_ATOMIC_FN inline
#define SM_ATOMIC_CHECK(a) ((void)0)
#endif
namespace __sm {
template <class T> inline T* ap(volatile _atomic<T>* a) { return const_cast<T*>(&a->__v); }
template <class T, class F> SM_ATOMIC_FN T cas_loop(volatile _atomic<T>* a, F f) {
    SM_ATOMIC_CHECK(a);
    T* p = ap(a);
    T old;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    T want;
    do { want = f(old); } while (!__atomic_compare_exchange(p, &old, &want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
}  // namespace __sm
template <class T> SM_ATOMIC_FN void atomic_store_explicit(volatile _atomic<T>* a, typename __sm::identity<T>::type v, memory_order o) {
    SM_ATOMIC_CHECK(a);
    __atomic_store(__sm::ap(a), &v, o == memory_order_relaxed ? __ATOMIC_RELAXED : __ATOMIC_SEQ_CST);
}
template <class T> SM_ATOMIC_FN T atomic_load_explicit(volatile _atomic<T>* a, memory_order o) {
    SM_ATOMIC_CHECK(a);
    T v;
    __atomic_load(__sm::ap(a), &v, o == memory_order_relaxed ? __ATOMIC_RELAXED : __ATOMIC_SEQ_CST);
    return v;
}
template <class T> SM_ATOMIC_FN T atomic_exchange_explicit(volatile _atomic<T>* a, typename __sm::identity<T>::type v, memory_order) {
    SM_ATOMIC_CHECK(a);
    T old;
    __atomic_exchange(__sm::ap(a), &v, &old, __ATOMIC_SEQ_CST);
    return old;
}
template <class T> SM_ATOMIC_FN bool atomic_compare_exchange_weak_explicit(volatile _atomic<T>* a, T* expected,
        typename __sm::identity<T>::type desired, memory_order, memory_order) {
    SM_ATOMIC_CHECK(a);
    return __atomic_compare_exchange(__sm::ap(a), expected, &desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
template <class T> inline bool atomic_compare_exchange_strong_explicit(volatile _atomic<T>* a, T* expected,
        typename __sm::identity<T>::type desired, memory_order s, memory_order f) {
    return atomic_compare_exchange_weak_explicit(a, expected, desired, s, f);
}
#define SM_ATOMIC_RMW(name, expr)                                                                              \
    template <class T> inline T atomic_##name##_explicit(volatile _atomic<T>* a, typename __sm::identity<T>::type v, memory_order) { \
        return __sm::cas_loop(a, [v](T x) { return (T)(expr); });                                                \
    }
SM_ATOMIC_RMW(fetch_add, x + v)
SM_ATOMIC_RMW(fetch_sub, x - v)
SM_ATOMIC_RMW(fetch_and, x & v)
SM_ATOMIC_RMW(fetch_or, x | v)
SM_ATOMIC_RMW(fetch_xor, x ^ v)
SM_ATOMIC_RMW(fetch_min, v < x ? v : x)
SM_ATOMIC_RMW(fetch_max, x < v ? v : x)
#undef SM_ATOMIC_RMW
// atomic_thread_fence: the fibers of a threadgroup share one OS thread.
inline void atomic_thread_fence(mem_flags, memory_order, thread_scope = thread_scope::thread_scope_device) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ======================================================================================
// The fiber runtime
// ======================================================================================
namespace __sm {
enum : uint32_t { RUNNABLE = 0, AT_BARRIER = 1, AT_SIMD = 2, DONE = 3 };
constexpr uint32_t MAX_LANES = 1024;
constexpr uint32_t TG_SLOTS = 128;
constexpr uint64_t APPLE_TG_MEMORY = 32768;
struct Group;
typedef void (*complete_fn)(Group*, uint32_t);
struct Lane {
    void* sp;            // saved stack pointer while switched out
    Group* g;
    uint32_t tid, sg, lane, state;
    uint32_t pos[3];     // thread_position_in_threadgroup
    uint32_t line;       // where it waits (MSL line)
    uint32_t next, prev; // the ring of unfinished lanes, in run order
    uint32_t rank;       // run-ahead: position in its simdgroup's block of Group::order
    const char* op;      // what it waits in
    complete_fn fn;      // which collective (with line: the place)
};
constexpr uintptr_t LANE_RESERVE = 128;
static_assert(sizeof(Lane) <= LANE_RESERVE, "Lane too large");
struct SimdState {
    uint32_t arrived, mask;
    complete_fn complete;
    alignas(64) unsigned char in[32][64];
    alignas(64) unsigned char out[32][64];
    uint32_t arg[32];
    const void* ptr[32][4];
};
struct Group {
    sm_dispatch* d;
    void (*body)(Lane*);
    void* main_sp;
    uint32_t n, live, nsg, bar_arrived, error;
    // Run-ahead schedule: on, simdgroups in reverse order, and the position (in that
    // order) of the simdgroup running now; those before it wait at the barrier or are done.
    uint32_t run_ahead, reverse_sg, ra_pos;
    uint32_t size[3], gpos[3];
    uint32_t sg_live[32];
    uint64_t arena_used, dynamic_tg;
    // For the memory check: which threadgroup (linear number + 1), the barriers it passed,
    // the simd operations each simdgroup completed, the threadgroup variables' extents and
    // their size without the check's red zones (for Apple's 32 KiB).
    uint32_t id, epoch;
    uint16_t sg_epoch[32];
    uint64_t slot_size[TG_SLOTS];
    uint64_t arena_apple;
    Lane* lanes[MAX_LANES];
    uint32_t order[MAX_LANES];
    void* slot_ptr[TG_SLOTS];
    SimdState simd[32];
};
static uintptr_t stack_size_;

__attribute__((always_inline)) static inline Lane* cur() {
    uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
    return (Lane*)((sp & ~(stack_size_ - 1)) + stack_size_ - LANE_RESERVE);
}
}  // namespace __sm
}  // namespace metal

// The context switch: saves the callee-saved registers on the current stack, stores the
// stack pointer in *save, loads `to` and restores the registers saved there. The signal
// mask and the floating-point control registers are not switched (kernels don't change
// them), which is what makes it cheap: a few instructions, no system call.
extern "C" void __sm_switch(void** save, void* to) __attribute__((visibility("hidden")));
extern "C" void __sm_fiber_start() __attribute__((visibility("hidden")));
#if defined(__x86_64__)
__asm__(R"(
    .text
    .p2align 4
    .globl __sm_switch
    .hidden __sm_switch
    .type __sm_switch,@function
__sm_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size __sm_switch, .-__sm_switch
    .p2align 4
    .globl __sm_fiber_start
    .hidden __sm_fiber_start
    .type __sm_fiber_start,@function
__sm_fiber_start:
    callq *%r12
    ud2
    .size __sm_fiber_start, .-__sm_fiber_start
)");
namespace metal { namespace __sm {
// A new fiber's first switch "returns" into __sm_fiber_start with r12 = entry.
static inline void* initial_frame(void* top, void (*entry)()) {
    uintptr_t* sp = (uintptr_t*)top;  // 16-byte aligned
    *--sp = (uintptr_t)&__sm_fiber_start;
    *--sp = 0;                  // rbp
    *--sp = 0;                  // rbx
    *--sp = (uintptr_t)entry;   // r12
    *--sp = 0;                  // r13
    *--sp = 0;                  // r14
    *--sp = 0;                  // r15
    return sp;
}
}}
#elif defined(__aarch64__)
// aarch64 Linux: written to the AAPCS64 but NOT TESTED on hardware.
__asm__(R"(
    .text
    .p2align 4
    .globl __sm_switch
    .hidden __sm_switch
    .type __sm_switch,%function
__sm_switch:
    sub sp, sp, #176
    stp x19, x20, [sp, #0]
    stp x21, x22, [sp, #16]
    stp x23, x24, [sp, #32]
    stp x25, x26, [sp, #48]
    stp x27, x28, [sp, #64]
    stp x29, x30, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mov x2, sp
    str x2, [x0]
    mov sp, x1
    ldp x19, x20, [sp, #0]
    ldp x21, x22, [sp, #16]
    ldp x23, x24, [sp, #32]
    ldp x25, x26, [sp, #48]
    ldp x27, x28, [sp, #64]
    ldp x29, x30, [sp, #80]
    ldp d8, d9, [sp, #96]
    ldp d10, d11, [sp, #112]
    ldp d12, d13, [sp, #128]
    ldp d14, d15, [sp, #144]
    add sp, sp, #176
    ret
    .size __sm_switch, .-__sm_switch
    .p2align 4
    .globl __sm_fiber_start
    .hidden __sm_fiber_start
    .type __sm_fiber_start,%function
__sm_fiber_start:
    blr x19
    brk #0
    .size __sm_fiber_start, .-__sm_fiber_start
)");
namespace metal { namespace __sm {
static inline void* initial_frame(void* top, void (*entry)()) {
    uintptr_t* sp = (uintptr_t*)top - 22;  // 176 bytes
    for (int i = 0; i < 22; i++) sp[i] = 0;
    sp[0] = (uintptr_t)entry;              // x19
    sp[11] = (uintptr_t)&__sm_fiber_start; // x30
    return sp;
}
}}
#else
#error "SoftMetal fibers: only x86_64 and aarch64"
#endif

namespace metal {
namespace __sm {

// ---- messages ----
static inline void appendf(Group* g, const char* text) {
    sm_dispatch* d = g->d;
    if (!d->error || !d->error_capacity) return;
    size_t len = 0;
    while (len < d->error_capacity && d->error[len]) len++;
    if (len + 1 >= d->error_capacity) return;
    snprintf(d->error + len, d->error_capacity - len, "%s", text);
}
static inline void append_num(Group* g, const char* fmt, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
    char tmp[160];
    snprintf(tmp, sizeof tmp, fmt, (unsigned long long)a, (unsigned long long)b, (unsigned long long)c);
    appendf(g, tmp);
}
static inline void begin_message(Group* g, const char* what) {
    g->d->error[0] = 0;
    appendf(g, "kernel ");
    appendf(g, g->d->kernel_name ? g->d->kernel_name : "?");
    appendf(g, ": ");
    appendf(g, what);
    append_num(g, " in threadgroup (%llu, %llu, %llu)", g->gpos[0], g->gpos[1], g->gpos[2]);
}
// Appends "lanes 0-15, 17" for the lanes whose predicate holds.
template <class P> static inline void append_lanes(Group* g, P pred) {
    bool any = false;
    uint32_t t = 0;
    int printed = 0;
    while (t < g->n) {
        if (!pred(g->lanes[t])) { t++; continue; }
        uint32_t e = t;
        while (e + 1 < g->n && pred(g->lanes[e + 1])) e++;
        if (printed++ == 8) { appendf(g, ", ..."); break; }
        appendf(g, any ? ", " : "threads ");
        if (e == t) append_num(g, "%llu", t);
        else append_num(g, "%llu-%llu", t, e);
        any = true;
        t = e + 1;
    }
}
// Leaves the threadgroup: back to the dispatch loop, which returns `kind`.
[[noreturn]] static inline void fail(Group* g, uint32_t kind) {
    g->error = kind;
    Lane* L = cur();
    __sm_switch(&L->sp, g->main_sp);
    __builtin_trap();
}
[[noreturn]] static inline void runtime_error(const char* what) {
    Group* g = cur()->g;
    begin_message(g, what);
    fail(g, SM_ERROR_RUNTIME);
}

// ---- the memory check (libraries compiled with SM_CHECK_MEMORY) ----
// clang's -fsanitize-coverage=trace-loads,trace-stores makes every load and store of the
// kernel call __sanitizer_cov_load<N>/store<N> (below) with its address. An access from a
// GPU thread must fall in a bound buffer, threadgroup memory (a declared threadgroup
// variable, not the red zone before it), the thread's own stack, or the library's
// constants; anything else is an out-of-bounds access, however far it lands. Buffer and
// threadgroup bytes have shadow cells (sm_shadow: last writer, last reader) that find
// races by what orders two accesses, not by their outcome: threads of one threadgroup
// are ordered by a threadgroup barrier between them (or, in one simdgroup, by a simd
// operation), threads of different threadgroups never (atomics aside).
#ifdef SM_CHECK_MEMORY
constexpr uint64_t ARENA_RED_ZONE = 64;
// The checker's own code is not traced (it would call itself).
#define SM_UNTRACED __attribute__((no_sanitize("coverage")))
extern "C" char __ehdr_start __attribute__((visibility("hidden")));
extern "C" char _end __attribute__((visibility("hidden")));
// The dispatch being checked: the host runs checked dispatches one at a time.
static sm_dispatch* checked_;

SM_UNTRACED static inline bool check_begin(sm_dispatch* d) {
    sm_check* c = d->check;
    if (!c) {
        if (d->error) snprintf(d->error, d->error_capacity, "kernel %s: a checked library launched without a check", d->kernel_name);
        d->error_kind = SM_ERROR_RUNTIME;
        return false;
    }
    c->image_start = (uintptr_t)&__ehdr_start;
    c->image_end = (uintptr_t)&_end;
    c->kind = SM_CHECK_NONE;
    checked_ = d;
    return true;
}
SM_UNTRACED static inline void check_threadgroup_begin(sm_dispatch* d) {
    for (int i = 0; i < SM_MAX_THREADGROUP_MEMORY; i++)
        if (d->check->tg_shadow[i]) memset(d->check->tg_shadow[i], 0, d->tg_mem_lengths[i] * sizeof(sm_shadow));
}
SM_UNTRACED static inline void check_arena_allocated(Group* g, uint64_t off, uint64_t size) {
    if (g->d->check->arena_shadow) memset(g->d->check->arena_shadow + off, 0, size * sizeof(sm_shadow));
}

[[noreturn]] SM_UNTRACED static inline void check_report(Group* g, Lane* L, uint32_t kind, int32_t region, uint64_t offset,
                                             uintptr_t a, uint32_t size, bool write, uintptr_t pc) {
    sm_check* c = g->d->check;
    c->kind = kind;
    c->region = region;
    c->offset = offset;
    const sm_dispatch* d = g->d;
    if (region >= 0) c->region_length = d->buffer_lengths[region];
    else if (region != SM_REGION_ARENA && region != SM_REGION_NONE) c->region_length = d->tg_mem_lengths[-region - 1];
    c->address = a;
    c->size = size;
    c->is_write = write;
    c->pc = (uint32_t)(pc - c->image_start);
    c->group = g->id;
    c->thread = L->tid;
    c->epoch = g->epoch;
    fail(g, SM_ERROR_CHECK);
}

// Whether an earlier access (group, thread, epoch, sg_epoch) is unordered with the
// running thread's access now.
SM_UNTRACED static inline bool unordered(Group* g, Lane* L, bool device, uint32_t group, uint32_t thread, uint32_t epoch, uint16_t sg_epoch) {
    if (thread == SM_SHADOW_ATOMIC) return false;
    if (group != g->id) return device;
    if (thread == L->tid || epoch != g->epoch) return false;
    if (thread / 32 == L->sg && sg_epoch != g->sg_epoch[L->sg]) return false;
    return true;
}

// A device byte written by this dispatch (or an atomic) sets its bit in the buffer's
// persistent initialisation bitmap, which later dispatches read.
SM_UNTRACED static inline void mark_initialized(sm_check* c, int32_t region, uint64_t offset, uint32_t size) {
    uint8_t* bits = c->buffer_init[region];
    if (!bits) return;
    for (uint64_t k = c->buffer_init_bit[region] + offset, e = k + size; k < e; k++) bits[k >> 3] |= (uint8_t)(1u << (k & 7));
}
SM_UNTRACED static inline bool initialized(const sm_check* c, int32_t region, uint64_t offset) {
    const uint8_t* bits = c->buffer_init[region];
    if (!bits) return true;
    const uint64_t k = c->buffer_init_bit[region] + offset;
    return (bits[k >> 3] >> (k & 7)) & 1u;
}

// An atomic marks its bytes written (so later reads are initialised) and never races.
SM_UNTRACED static inline void track(Group* g, Lane* L, sm_shadow* cells, bool device, int32_t region, uint64_t offset,
                         uintptr_t a, uint32_t size, bool write, uintptr_t pc, bool atomic) {
    sm_check* c = g->d->check;
    if (device && write) mark_initialized(c, region, offset, size);
    if (atomic) {
        for (uint32_t b = 0; b < size; b++) {
            cells[b].w_group = g->id;
            cells[b].w_thread = SM_SHADOW_ATOMIC;
        }
        return;
    }
    const uint16_t sge = g->sg_epoch[L->sg];
    for (uint32_t b = 0; b < size; b++) {
        sm_shadow* x = cells + b;
        if (x->w_group == 0) {
            if (!write && c->uninitialized && (!device || !initialized(c, region, offset + b)))
                check_report(g, L, SM_CHECK_UNINITIALIZED, region, offset + b, a + b, size, write, pc);
        } else if (c->races && unordered(g, L, device, x->w_group, x->w_thread, x->w_epoch, x->w_sg_epoch)) {
            c->other_is_write = 1;
            c->other_pc = x->w_pc;
            c->other_group = x->w_group;
            c->other_thread = x->w_thread;
            c->other_epoch = x->w_epoch;
            check_report(g, L, SM_CHECK_RACE, region, offset + b, a + b, size, write, pc);
        }
        const uint32_t pc32 = (uint32_t)(pc - c->image_start);
        if (write) {
            if (c->races && x->r_group) {
                const uint32_t reader = x->r_thread & 0x3FFFu;
                bool race;
                if (!(x->r_thread & SM_SHADOW_MANY)) race = unordered(g, L, device, x->r_group, reader, x->r_epoch, x->r_sg_epoch);
                else if (x->r_group != g->id) race = device;
                else if (x->r_epoch != g->epoch) race = false;
                else if (x->r_thread & SM_SHADOW_MIXED) race = true;  // readers in several simdgroups: one is not this one
                else race = !(reader / 32 == L->sg && x->r_sg_epoch != sge);
                if (race) {
                    c->other_is_write = 0;
                    c->other_pc = x->r_pc;
                    c->other_group = x->r_group;
                    c->other_thread = reader;
                    c->other_epoch = x->r_epoch;
                    check_report(g, L, SM_CHECK_RACE, region, offset + b, a + b, size, write, pc);
                }
            }
            x->w_group = g->id;
            x->w_thread = (uint16_t)L->tid;
            x->w_epoch = g->epoch;
            x->w_sg_epoch = sge;
            x->w_pc = pc32;
            x->r_group = 0;
        } else if (x->r_group == g->id && x->r_epoch == g->epoch && (x->r_thread & 0x3FFFu) != L->tid) {
            uint16_t flags = (uint16_t)(x->r_thread & (SM_SHADOW_MANY | SM_SHADOW_MIXED)) | SM_SHADOW_MANY;
            if ((x->r_thread & 0x3FFFu) / 32 != L->sg || x->r_sg_epoch != sge) flags |= SM_SHADOW_MIXED;
            x->r_thread = (uint16_t)(L->tid | flags);
            x->r_sg_epoch = sge;
            x->r_pc = pc32;
        } else {
            x->r_group = g->id;
            x->r_thread = (uint16_t)L->tid;
            x->r_epoch = g->epoch;
            x->r_sg_epoch = sge;
            x->r_pc = pc32;
        }
    }
}

SM_UNTRACED static inline void check_access(uintptr_t a, uint32_t size, bool write, uintptr_t pc, bool atomic = false) {
    sm_dispatch* d = checked_;
    if (!d) return;
    const uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
    const uintptr_t stacks = (uintptr_t)d->stacks;
    if (sp < stacks || sp >= stacks + d->stack_size * d->stack_count) return;  // the runtime, not a GPU thread
    sm_check* c = d->check;
    if (c->kind) return;  // reporting already
    Lane* L = cur();
    Group* g = L->g;
    const uintptr_t end = a + size;
    // Thread memory: this thread's stack, and other threads' (the runtime's lane states and
    // simd collectives' operands live there; an overflow of a thread array hits a guard page).
    if (a >= stacks && end <= stacks + d->stack_size * d->stack_count) return;
    if (a >= (uintptr_t)d->scratch && end <= (uintptr_t)d->scratch + d->scratch_size) return;
    if (a >= c->image_start && end <= c->image_end) return;
    if (a >= (uintptr_t)d && end <= (uintptr_t)(d + 1)) return;
    if (a >= (uintptr_t)c && end <= (uintptr_t)(c + 1)) return;
    if (d->error && a >= (uintptr_t)d->error && end <= (uintptr_t)d->error + d->error_capacity) return;
    if (atomic) write = true;
    for (int i = 0; i < SM_MAX_THREADGROUP_MEMORY; i++) {
        const uintptr_t base = (uintptr_t)d->tg_mem[i];
        if (!base || a < base || a >= base + d->tg_mem_lengths[i]) continue;
        if (end > base + d->tg_mem_lengths[i]) check_report(g, L, SM_CHECK_BOUNDS, -(i + 1), a - base, a, size, write, pc);
        if (c->tg_shadow[i]) track(g, L, c->tg_shadow[i] + (a - base), false, -(i + 1), a - base, a, size, write, pc, atomic);
        return;
    }
    const uintptr_t arena = (uintptr_t)d->tg_static;
    if (arena && a >= arena - ARENA_RED_ZONE && a < arena + d->tg_static_capacity) {
        for (uint32_t s = 0; s < TG_SLOTS; s++) {
            const uintptr_t p = (uintptr_t)g->slot_ptr[s];
            if (!p || a < p || end > p + g->slot_size[s]) continue;
            if (c->arena_shadow) {
                c->region_length = g->slot_size[s];
                track(g, L, c->arena_shadow + (a - arena), false, SM_REGION_ARENA, a - p, a, size, write, pc, atomic);
            }
            return;
        }
        // Named by the variable before it (the usual overflow), else the first one.
        uintptr_t before = 0, first = ~(uintptr_t)0;
        uint64_t before_size = 0, first_size = 0;
        for (uint32_t s = 0; s < TG_SLOTS; s++) {
            const uintptr_t p = (uintptr_t)g->slot_ptr[s];
            if (!p) continue;
            if (p <= a && p > before) { before = p; before_size = g->slot_size[s]; }
            if (p < first) { first = p; first_size = g->slot_size[s]; }
        }
        if (!before) { before = first == ~(uintptr_t)0 ? arena : first; before_size = first_size; }
        c->region_length = before_size;
        check_report(g, L, SM_CHECK_BOUNDS, SM_REGION_ARENA, a - before, a, size, write, pc);
    }
    int32_t partly = -1;
    for (int i = 0; i < SM_MAX_BUFFERS; i++) {
        const uintptr_t base = (uintptr_t)d->buffers[i];
        if (!base || a < base || a >= base + d->buffer_lengths[i]) continue;
        if (end > base + d->buffer_lengths[i]) { partly = i; continue; }
        if (c->buffer_shadow[i]) track(g, L, c->buffer_shadow[i] + (a - base), true, i, a - base, a, size, write, pc, atomic);
        return;
    }
    if (partly >= 0) check_report(g, L, SM_CHECK_BOUNDS, partly, a - (uintptr_t)d->buffers[partly], a, size, write, pc);
    // Nowhere: named by the nearest bound buffer.
    int32_t nearest = SM_REGION_NONE;
    uint64_t best = ~0ull;
    for (int i = 0; i < SM_MAX_BUFFERS; i++) {
        const uintptr_t base = (uintptr_t)d->buffers[i];
        if (!base) continue;
        const uint64_t dist = a < base ? base - a : a - base;
        if (dist < best) { best = dist; nearest = i; }
    }
    c->outside = 1;
    check_report(g, L, SM_CHECK_BOUNDS, nearest, nearest >= 0 ? a - (uintptr_t)d->buffers[nearest] : 0, a, size, write, pc);
}
SM_UNTRACED static void check_atomic(const void* p, uint32_t size) {
    check_access((uintptr_t)p, size, true, (uintptr_t)__builtin_return_address(0), true);
}
#endif

// ---- scheduling ----
// Run-ahead: the first runnable lane from simdgroup position g->ra_pos on, in run order
// within each simdgroup (after `self` in its own), or null. Each simdgroup's lanes are
// the block order[32 * sg ...] (launch keeps lane permutations inside simdgroups).
static inline Lane* run_ahead_next(Group* g, Lane* self) {
    for (uint32_t k = g->ra_pos; k < g->nsg; k++) {
        const uint32_t sg = g->reverse_sg ? g->nsg - 1 - k : k;
        const uint32_t base = sg * 32, count = g->n - base < 32 ? g->n - base : 32;
        const uint32_t start = self && self->sg == sg ? self->rank + 1 : 0;
        for (uint32_t j = 0; j < count; j++) {
            Lane* L = g->lanes[g->order[base + (start + j) % count]];
            if (L->state == RUNNABLE) {
                g->ra_pos = k;
                return L;
            }
        }
    }
    return nullptr;
}

// Switches from `self` (blocked or finished) to the next runnable lane in run order, or
// back to the dispatch loop when none is runnable (all finished, or a deadlock).
static inline void switch_from(Lane* self) {
    Group* g = self->g;
    if (g->run_ahead) {
        Lane* L = g->live ? run_ahead_next(g, self) : nullptr;
        if (L != self) __sm_switch(&self->sp, L ? L->sp : g->main_sp);
        return;
    }
    if (g->live) {
        uint32_t i = self->next;
        for (uint32_t c = 0; c <= g->n; c++) {
            Lane* L = g->lanes[i];
            if (L->state == RUNNABLE) {
                if (L != self) __sm_switch(&self->sp, L->sp);
                return;
            }
            i = L->next;
        }
    }
    __sm_switch(&self->sp, g->main_sp);
}

static inline void describe_waiting(Group* g, uint32_t first_state, uint32_t sg_only) {
    // Groups the waiting lanes by (operation, line).
    bool seen[MAX_LANES];
    for (uint32_t t = 0; t < g->n; t++) seen[t] = false;
    int groups = 0;
    for (uint32_t t = 0; t < g->n; t++) {
        Lane* L = g->lanes[t];
        if (seen[t] || L->state == DONE || L->state == RUNNABLE) continue;
        if (sg_only != ~0u && L->sg != sg_only) continue;
        (void)first_state;
        uint32_t line = L->line;
        const char* op = L->op;
        complete_fn fn = L->fn;
        uint32_t state = L->state;
        auto same = [&](Lane* M) {
            return M->state == state && M->line == line && M->fn == fn && M->op == op &&
                   (sg_only == ~0u || M->sg == sg_only);
        };
        for (uint32_t u = t; u < g->n; u++) if (same(g->lanes[u])) seen[u] = true;
        appendf(g, groups++ ? "; " : ": ");
        append_lanes(g, same);
        appendf(g, " wait in ");
        appendf(g, op);
        append_num(g, " at line %llu", line);
    }
}

// All live lanes wait at the barrier (the caller is one of them, or just finished).
static inline void barrier_release(Group* g) {
    uint32_t line = 0;
    bool first = true, diverged = false;
    for (uint32_t t = 0; t < g->n; t++) {
        Lane* L = g->lanes[t];
        if (L->state != AT_BARRIER) continue;
        if (first) { line = L->line; first = false; }
        else if (L->line != line) diverged = true;
    }
    if (diverged) {
        begin_message(g, "barrier divergence");
        describe_waiting(g, AT_BARRIER, ~0u);
        appendf(g, " (every thread still running must reach the same threadgroup_barrier)");
        fail(g, SM_ERROR_DIVERGENCE);
    }
    for (uint32_t t = 0; t < g->n; t++)
        if (g->lanes[t]->state == AT_BARRIER) g->lanes[t]->state = RUNNABLE;
    g->bar_arrived = 0;
    g->epoch++;
    g->ra_pos = 0;
}

static inline void barrier(uint32_t line, const char* op) {
    Lane* L = cur();
    Group* g = L->g;
    L->line = line;
    L->op = op;
    L->fn = nullptr;
    L->state = AT_BARRIER;
    if (++g->bar_arrived == g->live) {
        barrier_release(g);
        // Run-ahead: after the barrier the first simdgroup in the order goes first again,
        // not the one whose lane happened to arrive last.
        if (g->run_ahead) {
            Lane* first = run_ahead_next(g, nullptr);
            if (first != L) __sm_switch(&L->sp, first->sp);
        }
        return;
    }
    switch_from(L);
}

static inline void simd_complete(Group* g, uint32_t sg) {
    SimdState& s = g->simd[sg];
    Lane* first = nullptr;
    bool diverged = false;
    for (uint32_t l = 0; l < 32; l++) {
        if (!(s.mask & (1u << l))) continue;
        Lane* L = g->lanes[sg * 32 + l];
        if (!first) first = L;
        else if (L->line != first->line || L->fn != first->fn) diverged = true;
    }
    if (diverged) {
        begin_message(g, "simd divergence");
        append_num(g, ", simdgroup %llu", sg);
        describe_waiting(g, AT_SIMD, sg);
        appendf(g, " (a simd operation must be reached by all active threads of the simdgroup at the same place)");
        fail(g, SM_ERROR_DIVERGENCE);
    }
    s.complete(g, sg);
    g->sg_epoch[sg]++;
    for (uint32_t l = 0; l < 32; l++)
        if (s.mask & (1u << l)) g->lanes[sg * 32 + l]->state = RUNNABLE;
    s.arrived = 0;
    s.mask = 0;
}

// A lane arrives at a simd collective: `fill` stores its operands; the last active lane of
// the simdgroup to arrive completes it for all of them.
template <class Fill>
static inline void simd_arrive(uint32_t line, const char* op, complete_fn complete, Fill fill) {
    Lane* L = cur();
    Group* g = L->g;
    SimdState& s = g->simd[L->sg];
    fill(s, L->lane);
    L->line = line;
    L->op = op;
    L->fn = complete;
    L->state = AT_SIMD;
    if (s.arrived == 0) s.complete = complete;
    s.arrived++;
    s.mask |= 1u << L->lane;
    if (s.arrived == g->sg_live[L->sg]) {
        simd_complete(g, L->sg);
        return;
    }
    switch_from(L);
}

extern "C" __attribute__((visibility("hidden"), used)) inline void __sm_lane_main() {
    Lane* L = cur();
    Group* g = L->g;
    g->body(L);
    L->state = DONE;
    g->live--;
    g->lanes[L->prev]->next = L->next;
    g->lanes[L->next]->prev = L->prev;
    g->sg_live[L->sg]--;
    SimdState& s = g->simd[L->sg];
    if (s.arrived && s.arrived == g->sg_live[L->sg]) simd_complete(g, L->sg);
    if (g->bar_arrived && g->bar_arrived == g->live) barrier_release(g);
    switch_from(L);
    __builtin_trap();
}

static inline uint64_t splitmix(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Runs the threadgroups of d->first_group ..< d->end_group on this OS thread.
static inline int32_t launch(sm_dispatch* d, void (*body)(Lane*)) {
    if (d->abi_version != SM_ABI_VERSION) {
        if (d->error) snprintf(d->error, d->error_capacity, "runtime ABI version %d, host %u", SM_ABI_VERSION, d->abi_version);
        return d->error_kind = SM_ERROR_RUNTIME;
    }
    if (d->scratch_size < sizeof(Group)) {
        if (d->error) snprintf(d->error, d->error_capacity, "scratch too small");
        return d->error_kind = SM_ERROR_RUNTIME;
    }
    stack_size_ = (uintptr_t)d->stack_size;
    Group* g = (Group*)d->scratch;
#ifdef SM_CHECK_MEMORY
    if (!check_begin(d)) return d->error_kind;
#endif
    g->d = d;
    g->body = body;
    const uint32_t tx = d->threadgroups[0], ty = d->threadgroups[1], tz = d->threadgroups[2];
    const uint64_t total = (uint64_t)tx * ty * tz;
    uint64_t dyn = 0;
    for (int i = 0; i < SM_MAX_THREADGROUP_MEMORY; i++) dyn += d->tg_mem_lengths[i];
    g->dynamic_tg = dyn;
    for (uint32_t p = d->first_group; p < d->end_group; p++) {
        uint64_t linear = ((uint64_t)p * d->order_mul + d->order_add) % total;
        g->gpos[0] = (uint32_t)(linear % tx);
        g->gpos[1] = (uint32_t)((linear / tx) % ty);
        g->gpos[2] = (uint32_t)(linear / ((uint64_t)tx * ty));
        uint32_t n = 1;
        for (int k = 0; k < 3; k++) {
            uint32_t start = g->gpos[k] * d->tptg[k];
            uint32_t left = d->grid[k] > start ? d->grid[k] - start : 0;
            g->size[k] = left < d->tptg[k] ? left : d->tptg[k];
            n *= g->size[k];
        }
        if (n == 0) continue;
        if (n > MAX_LANES || n > d->stack_count) {
            if (d->error) snprintf(d->error, d->error_capacity, "kernel %s: %u threads per threadgroup, at most %u", d->kernel_name, n, MAX_LANES);
            return d->error_kind = SM_ERROR_RUNTIME;
        }
        g->n = n;
        g->live = n;
        g->nsg = (n + 31) / 32;
        g->bar_arrived = 0;
        g->error = 0;
        g->run_ahead = (d->flags & SM_FLAG_RUN_AHEAD) ? 1 : 0;
        g->reverse_sg = (d->flags & SM_FLAG_REVERSE_SIMDGROUPS) ? 1 : 0;
        g->ra_pos = 0;
        g->arena_used = 0;
        g->arena_apple = 0;
        g->id = (uint32_t)linear + 1;
        g->epoch = 0;
        for (uint32_t s = 0; s < g->nsg; s++) {
            g->sg_live[s] = (s + 1) * 32 <= n ? 32 : n - s * 32;
            g->simd[s].arrived = 0;
            g->simd[s].mask = 0;
            g->sg_epoch[s] = 0;
        }
        for (uint32_t i = 0; i < TG_SLOTS; i++) g->slot_ptr[i] = nullptr;
        // Threadgroup memory starts poisoned (0xFF: NaN as float, -1 as int), or zeroed
        // when poisoning is off, never with what the previous threadgroup left.
        for (int i = 0; i < SM_MAX_THREADGROUP_MEMORY; i++)
            if (d->tg_mem[i]) memset(d->tg_mem[i], (d->flags & SM_FLAG_POISON) ? 0xff : 0, d->tg_mem_lengths[i]);
#ifdef SM_CHECK_MEMORY
        check_threadgroup_begin(d);
#endif
        for (uint32_t t = 0; t < n; t++) {
            char* block = (char*)d->stacks + (uint64_t)t * d->stack_size;
            char* top = block + d->stack_size - LANE_RESERVE;
            Lane* L = (Lane*)top;
            L->g = g;
            L->tid = t;
            L->sg = t / 32;
            L->lane = t % 32;
            L->state = RUNNABLE;
            L->pos[0] = t % g->size[0];
            L->pos[1] = (t / g->size[0]) % g->size[1];
            L->pos[2] = t / (g->size[0] * g->size[1]);
            L->line = 0;
            L->op = "";
            L->fn = nullptr;
            L->sp = initial_frame(top, &__sm_lane_main);
            g->lanes[t] = L;
            g->order[t] = t;
        }
        if (d->seed) {
            uint64_t x = d->seed ^ (linear * 0x9e3779b97f4a7c15ull);
            // Run-ahead orders whole simdgroups itself: lanes are shuffled within theirs.
            const uint32_t block = g->run_ahead ? 32 : n;
            for (uint32_t base = 0; base < n; base += block) {
                const uint32_t end = base + block < n ? base + block : n;
                for (uint32_t t = end - 1; t > base; t--) {
                    uint32_t j = base + (uint32_t)(splitmix(x) % (t - base + 1));
                    uint32_t tmp = g->order[t];
                    g->order[t] = g->order[j];
                    g->order[j] = tmp;
                }
            }
        }
        for (uint32_t i = 0; i < n; i++) {
            g->lanes[g->order[i]]->next = g->order[(i + 1) % n];
            g->lanes[g->order[i]]->prev = g->order[(i + n - 1) % n];
            g->lanes[g->order[i]]->rank = i % 32;
        }
        __sm_switch(&g->main_sp, (g->run_ahead ? run_ahead_next(g, nullptr) : g->lanes[g->order[0]])->sp);
        if (g->error) return d->error_kind = g->error;
        if (g->live) {
            begin_message(g, "barrier divergence (deadlock)");
            describe_waiting(g, 0, ~0u);
            appendf(g, "; threads that are still running never reach the same barrier or simd operation");
            return d->error_kind = SM_ERROR_DIVERGENCE;
        }
    }
    return d->error_kind = SM_OK;
}

// `threadgroup T x[N];` in a kernel body: one allocation per threadgroup from the arena,
// shared by its threads, poisoned (0xFF) or zeroed when first reached.
static inline void* tg_var(uint32_t slot, uint64_t size, uint64_t align) {
    Lane* L = cur();
    Group* g = L->g;
    if (slot >= TG_SLOTS) runtime_error("too many threadgroup variables");
    if (!g->slot_ptr[slot]) {
        if (align < 16) align = 16;
        const uint64_t apple = (g->arena_apple + align - 1) / align * align + size;
        if (apple + g->dynamic_tg > APPLE_TG_MEMORY) {
            begin_message(g, "threadgroup memory");
            append_num(g, ": %llu bytes of threadgroup variables plus %llu bytes set by setThreadgroupMemoryLength exceed the 32768 bytes of Apple GPUs",
                       apple, g->dynamic_tg);
            fail(g, SM_ERROR_RUNTIME);
        }
        g->arena_apple = apple;
        uint64_t off = (g->arena_used + align - 1) / align * align;
#ifdef SM_CHECK_MEMORY
        off = (g->arena_used + ARENA_RED_ZONE + align - 1) / align * align;  // a red zone before each
#endif
        if (off + size > g->d->tg_static_capacity) runtime_error("threadgroup variables larger than the arena");
        g->arena_used = off + size;
        char* p = (char*)g->d->tg_static + off;
        memset(p, (g->d->flags & SM_FLAG_POISON) ? 0xff : 0, size);
        g->slot_ptr[slot] = p;
        g->slot_size[slot] = size;
#ifdef SM_CHECK_MEMORY
        check_arena_allocated(g, off, size);
#endif
    }
    return g->slot_ptr[slot];
}

// ---- kernel arguments ----
template <class T> struct is_ref { static constexpr bool value = false; };
template <class T> struct is_ref<T&> { static constexpr bool value = true; };
template <class T> struct unref { typedef T type; };
template <class T> struct unref<T&> { typedef T type; };
template <class T> struct pointee { typedef T type; };
template <class T> struct pointee<T*> { typedef T type; };
template <class T> struct pointee<T* const> { typedef T type; };
template <class T> constexpr int64_t elem_size() {
    typedef typename pointee<typename unref<T>::type>::type P;
    if constexpr (same<rcv<P>, void>::value) return 1;
    else return (int64_t)sizeof(P);
}
// The I-th parameter type of a kernel function pointer type: the launcher of a template
// instance binds arguments by the instantiated types (the template's text says `T*`).
template <int I, class... A> struct nth_type;
template <class H, class... A> struct nth_type<0, H, A...> { typedef H type; };
template <int I, class H, class... A> struct nth_type<I, H, A...> { typedef typename nth_type<I - 1, A...>::type type; };
template <int I, class F> struct param_type;
template <int I, class R, class... A> struct param_type<I, R (*)(A...)> { typedef typename nth_type<I, A...>::type type; };
template <int I, class F> using param_t = typename param_type<I, F>::type;
template <class T> inline T buf_arg(void* p) {
    if constexpr (is_ref<T>::value) return *static_cast<typename unref<T>::type*>(p);
    else return (T)p;
}
template <class T> inline T bi(uint32_t x, uint32_t y, uint32_t z) {
    typedef rcv<T> U;
    if constexpr (!is_vec<U>::value) {
        (void)y; (void)z;
        return (U)x;
    } else {
        typedef typename vtraits<U>::E E;
        U r;
        r[0] = (E)x;
        r[1] = (E)y;
        if constexpr (vtraits<U>::N > 2) r[2] = (E)z;
        return r;
    }
}
}  // namespace __sm

#ifdef SM_CHECK_MEMORY
// The instrumentation's entry points (see "the memory check" above).
#define SM_TRACE(N, T)                                                                                 \
    extern "C" __attribute__((visibility("hidden"), no_sanitize("coverage"))) void __sanitizer_cov_load##N(T* p) {  \
        ::metal::__sm::check_access((uintptr_t)p, N, false, (uintptr_t)__builtin_return_address(0));    \
    }                                                                                                   \
    extern "C" __attribute__((visibility("hidden"), no_sanitize("coverage"))) void __sanitizer_cov_store##N(T* p) { \
        ::metal::__sm::check_access((uintptr_t)p, N, true, (uintptr_t)__builtin_return_address(0));     \
    }
SM_TRACE(1, uint8_t)
SM_TRACE(2, uint16_t)
SM_TRACE(4, uint32_t)
SM_TRACE(8, uint64_t)
SM_TRACE(16, __int128)
#undef SM_TRACE
#endif

// ---- barriers and simd operations ----
inline void threadgroup_barrier(mem_flags, uint __line = __builtin_LINE()) { __sm::barrier(__line, "threadgroup_barrier"); }
namespace __sm {
static void complete_none(Group*, uint32_t) {}
template <class T, class Op> static void complete_reduce(Group* g, uint32_t sg) {
    SimdState& s = g->simd[sg];
    T r;
    bool first = true;
    for (uint32_t l = 0; l < 32; l++) {
        if (!(s.mask & (1u << l))) continue;
        T v;
        memcpy(&v, s.in[l], sizeof(T));
        r = first ? v : Op::apply(r, v);
        first = false;
    }
    for (uint32_t l = 0; l < 32; l++)
        if (s.mask & (1u << l)) memcpy(s.out[l], &r, sizeof(T));
}
template <class T, bool Inclusive, bool Product = false> static void complete_prefix(Group* g, uint32_t sg) {
    SimdState& s = g->simd[sg];
    T acc = T(Product ? 1 : 0);
    for (uint32_t l = 0; l < 32; l++) {
        if (!(s.mask & (1u << l))) continue;
        T v;
        memcpy(&v, s.in[l], sizeof(T));
        if (Inclusive) { acc = Product ? T(acc * v) : T(acc + v); memcpy(s.out[l], &acc, sizeof(T)); }
        else { memcpy(s.out[l], &acc, sizeof(T)); acc = Product ? T(acc * v) : T(acc + v); }
    }
}
enum { SH_INDEX, SH_UP, SH_DOWN, SH_XOR, SH_ROT_UP, SH_ROT_DOWN, SH_FIRST };
// Lanes read the value of another active lane; a source lane that is not active (past
// the end of a partial simdgroup, or returned) gives the reading lane its own value.
template <class T, int Kind> static void complete_shuffle(Group* g, uint32_t sg) {
    SimdState& s = g->simd[sg];
    uint32_t lowest = (uint32_t)__builtin_ctz(s.mask);
    for (uint32_t l = 0; l < 32; l++) {
        if (!(s.mask & (1u << l))) continue;
        uint32_t a = s.arg[l], src;
        switch (Kind) {
            case SH_INDEX: src = a; break;
            case SH_UP: src = a <= l ? l - a : l; break;
            case SH_DOWN: src = l + a < 32 ? l + a : l; break;
            case SH_XOR: src = (l ^ a) & 31; break;
            case SH_ROT_UP: src = (l + 32 - (a & 31)) & 31; break;
            case SH_ROT_DOWN: src = (l + a) & 31; break;
            default: src = lowest; break;
        }
        if (src >= 32 || !(s.mask & (1u << src))) src = l;
        memcpy(s.out[l], s.in[src], sizeof(T));
    }
}
static void complete_ballot(Group* g, uint32_t sg) {
    SimdState& s = g->simd[sg];
    uint64_t m = 0;
    for (uint32_t l = 0; l < 32; l++)
        if ((s.mask & (1u << l)) && s.in[l][0]) m |= 1ull << l;
    for (uint32_t l = 0; l < 32; l++)
        if (s.mask & (1u << l)) memcpy(s.out[l], &m, 8);
}
static void complete_mask(Group* g, uint32_t sg) {
    SimdState& s = g->simd[sg];
    uint64_t m = s.mask;
    for (uint32_t l = 0; l < 32; l++)
        if (s.mask & (1u << l)) memcpy(s.out[l], &m, 8);
}
struct OpSum { template <class T> static T apply(T a, T b) { return a + b; } };
struct OpProduct { template <class T> static T apply(T a, T b) { return a * b; } };
struct OpMin { template <class T> static T apply(T a, T b) { return metal::min(a, b); } };
struct OpMax { template <class T> static T apply(T a, T b) { return metal::max(a, b); } };
// Bitwise reductions of a floating-point value (MLX's bf16_math.h instantiates simd_xor on
// float through `__metal_simd_xor`) combine its bits.
template <class T, class F> static T bitwise(T a, T b, F f) {
    if constexpr (std::is_integral<T>::value || std::is_same<T, bool>::value) return f(a, b);
    else {
        unsigned char x[sizeof(T)], y[sizeof(T)];
        memcpy(x, &a, sizeof(T));
        memcpy(y, &b, sizeof(T));
        for (size_t i = 0; i < sizeof(T); i++) x[i] = (unsigned char)f(x[i], y[i]);
        T r;
        memcpy(&r, x, sizeof(T));
        return r;
    }
}
struct OpAnd { template <class T> static T apply(T a, T b) { return bitwise(a, b, [](auto u, auto v) { return u & v; }); } };
struct OpOr { template <class T> static T apply(T a, T b) { return bitwise(a, b, [](auto u, auto v) { return u | v; }); } };
struct OpXor { template <class T> static T apply(T a, T b) { return bitwise(a, b, [](auto u, auto v) { return u ^ v; }); } };
struct OpAll { template <class T> static T apply(T a, T b) { return a && b; } };
struct OpAny { template <class T> static T apply(T a, T b) { return a || b; } };

template <class T> inline T simd_result() {
    Lane* L = cur();
    T r;
    memcpy(&r, L->g->simd[L->sg].out[L->lane], sizeof(T));
    return r;
}
template <class T> inline T simd_collective(T v, uint32_t arg, uint32_t line, const char* op, complete_fn fn) {
    static_assert(sizeof(T) <= 64, "simd operation on a value larger than 64 bytes");
    simd_arrive(line, op, fn, [&](SimdState& s, uint32_t l) {
        memcpy(s.in[l], &v, sizeof(T));
        s.arg[l] = arg;
    });
    return simd_result<T>();
}
}  // namespace __sm

inline void simdgroup_barrier(mem_flags, uint __line = __builtin_LINE()) {
    __sm::simd_arrive(__line, "simdgroup_barrier", &__sm::complete_none, [](__sm::SimdState&, uint32_t) {});
}
#define SM_SIMD_REDUCE(name, Op)                                                              \
    template <class T> inline T name(T v, uint __line = __builtin_LINE()) {                   \
        return __sm::simd_collective<T>(v, 0, __line, #name, &__sm::complete_reduce<T, __sm::Op>); \
    }
SM_SIMD_REDUCE(simd_sum, OpSum)
SM_SIMD_REDUCE(simd_product, OpProduct)
SM_SIMD_REDUCE(simd_min, OpMin)
SM_SIMD_REDUCE(simd_max, OpMax)
SM_SIMD_REDUCE(simd_and, OpAnd)
SM_SIMD_REDUCE(simd_or, OpOr)
SM_SIMD_REDUCE(simd_xor, OpXor)
#undef SM_SIMD_REDUCE
inline bool simd_all(bool v, uint __line = __builtin_LINE()) {
    return __sm::simd_collective<bool>(v, 0, __line, "simd_all", &__sm::complete_reduce<bool, __sm::OpAll>);
}
inline bool simd_any(bool v, uint __line = __builtin_LINE()) {
    return __sm::simd_collective<bool>(v, 0, __line, "simd_any", &__sm::complete_reduce<bool, __sm::OpAny>);
}
template <class T> inline T simd_prefix_inclusive_sum(T v, uint __line = __builtin_LINE()) {
    return __sm::simd_collective<T>(v, 0, __line, "simd_prefix_inclusive_sum", &__sm::complete_prefix<T, true>);
}
template <class T> inline T simd_prefix_exclusive_sum(T v, uint __line = __builtin_LINE()) {
    return __sm::simd_collective<T>(v, 0, __line, "simd_prefix_exclusive_sum", &__sm::complete_prefix<T, false>);
}
template <class T> inline T simd_prefix_inclusive_product(T v, uint __line = __builtin_LINE()) {
    return __sm::simd_collective<T>(v, 0, __line, "simd_prefix_inclusive_product", &__sm::complete_prefix<T, true, true>);
}
template <class T> inline T simd_prefix_exclusive_product(T v, uint __line = __builtin_LINE()) {
    return __sm::simd_collective<T>(v, 0, __line, "simd_prefix_exclusive_product", &__sm::complete_prefix<T, false, true>);
}
#define SM_SIMD_SHUFFLE(name, Kind)                                                            \
    template <class T> inline T name(T v, ushort a, uint __line = __builtin_LINE()) {          \
        return __sm::simd_collective<T>(v, a, __line, #name, &__sm::complete_shuffle<T, __sm::Kind>); \
    }
SM_SIMD_SHUFFLE(simd_shuffle, SH_INDEX)
SM_SIMD_SHUFFLE(simd_broadcast, SH_INDEX)
SM_SIMD_SHUFFLE(simd_shuffle_up, SH_UP)
SM_SIMD_SHUFFLE(simd_shuffle_down, SH_DOWN)
SM_SIMD_SHUFFLE(simd_shuffle_xor, SH_XOR)
SM_SIMD_SHUFFLE(simd_shuffle_rotate_up, SH_ROT_UP)
SM_SIMD_SHUFFLE(simd_shuffle_rotate_down, SH_ROT_DOWN)
#undef SM_SIMD_SHUFFLE
// simd_shuffle_and_fill_up/down(data, filling, delta[, modulo]): within each segment of
// `modulo` lanes (default 32), lane i takes data from lane i - delta (up) / i + delta (down)
// of its segment; past the segment's edge it takes filling_data from the other end
// (up: lane i + modulo - delta, down: lane i + delta - modulo). Inactive source: own value.
namespace __sm {
template <class T, bool Up> static void complete_fill(Group* g, uint32_t sg) {
    SimdState& s = g->simd[sg];
    for (uint32_t l = 0; l < 32; l++) {
        if (!(s.mask & (1u << l))) continue;
        uint32_t delta = s.arg[l] & 0xffffu, m = s.arg[l] >> 16;
        if (m == 0 || m > 32) m = 32;
        uint32_t base = l - l % m, i = l % m, src, part;
        if (Up) { if (i >= delta) { src = base + i - delta; part = 0; } else { src = base + i + m - delta; part = 1; } }
        else { if (i + delta < m) { src = base + i + delta; part = 0; } else { src = base + i + delta - m; part = 1; } }
        if (src >= 32 || !(s.mask & (1u << src))) { src = l; part = 0; }
        memcpy(s.out[l], s.in[src] + part * sizeof(T), sizeof(T));
    }
}
template <class T, bool Up> inline T shuffle_fill(T v, T f, uint32_t delta, uint32_t modulo, uint32_t line, const char* op) {
    struct Pair { T v, f; } p{v, f};
    Pair r = simd_collective<Pair>(p, (delta & 0xffffu) | (modulo << 16), line, op, &complete_fill<T, Up>);
    return r.v;
}
}  // namespace __sm
template <class T> inline T simd_shuffle_and_fill_up(T v, T f, ushort d, uint __line = __builtin_LINE()) {
    return __sm::shuffle_fill<T, true>(v, f, d, 32, __line, "simd_shuffle_and_fill_up");
}
template <class T> inline T simd_shuffle_and_fill_up(T v, T f, ushort d, ushort m, uint __line = __builtin_LINE()) {
    return __sm::shuffle_fill<T, true>(v, f, d, m, __line, "simd_shuffle_and_fill_up");
}
template <class T> inline T simd_shuffle_and_fill_down(T v, T f, ushort d, uint __line = __builtin_LINE()) {
    return __sm::shuffle_fill<T, false>(v, f, d, 32, __line, "simd_shuffle_and_fill_down");
}
template <class T> inline T simd_shuffle_and_fill_down(T v, T f, ushort d, ushort m, uint __line = __builtin_LINE()) {
    return __sm::shuffle_fill<T, false>(v, f, d, m, __line, "simd_shuffle_and_fill_down");
}
template <class T> inline T simd_broadcast_first(T v, uint __line = __builtin_LINE()) {
    return __sm::simd_collective<T>(v, 0, __line, "simd_broadcast_first", &__sm::complete_shuffle<T, __sm::SH_FIRST>);
}
struct simd_vote {
    typedef uint64_t vote_t;
    vote_t __v;
    explicit constexpr simd_vote(vote_t v = 0) : __v(v) {}
    explicit operator vote_t() const { return __v; }
    bool all() const { return __v == 0xffffffffull; }
    bool any() const { return __v != 0; }
};
inline simd_vote simd_ballot(bool v, uint __line = __builtin_LINE()) {
    return simd_vote(__sm::simd_collective<uint64_t>((uint64_t)v, 0, __line, "simd_ballot", &__sm::complete_ballot));
}
inline simd_vote simd_active_threads_mask(uint __line = __builtin_LINE()) {
    return simd_vote(__sm::simd_collective<uint64_t>(0, 0, __line, "simd_active_threads_mask", &__sm::complete_mask));
}
inline bool simd_is_first(uint __line = __builtin_LINE()) {
    uint64_t m = __sm::simd_collective<uint64_t>(0, 0, __line, "simd_is_first", &__sm::complete_mask);
    return (uint32_t)__builtin_ctzll(m) == __sm::cur()->lane;
}

// Quad operations (groups of 4 lanes). Like simd operations they are collectives of the
// whole simdgroup here: every active lane of the simdgroup must reach them.
namespace __sm {
template <class T, class Op> static void complete_quad_reduce(Group* g, uint32_t sg) {
    SimdState& s = g->simd[sg];
    for (uint32_t q = 0; q < 32; q += 4) {
        T r;
        bool first = true;
        for (uint32_t l = q; l < q + 4; l++) {
            if (!(s.mask & (1u << l))) continue;
            T v;
            memcpy(&v, s.in[l], sizeof(T));
            r = first ? v : Op::apply(r, v);
            first = false;
        }
        for (uint32_t l = q; l < q + 4; l++)
            if (s.mask & (1u << l)) memcpy(s.out[l], &r, sizeof(T));
    }
}
template <class T, bool Xor> static void complete_quad_shuffle(Group* g, uint32_t sg) {
    SimdState& s = g->simd[sg];
    for (uint32_t l = 0; l < 32; l++) {
        if (!(s.mask & (1u << l))) continue;
        uint32_t src = (l & ~3u) | ((Xor ? (l ^ s.arg[l]) : s.arg[l]) & 3u);
        if (!(s.mask & (1u << src))) src = l;
        memcpy(s.out[l], s.in[src], sizeof(T));
    }
}
}  // namespace __sm
#define SM_QUAD_REDUCE(name, Op)                                                              \
    template <class T> inline T name(T v, uint __line = __builtin_LINE()) {                   \
        return __sm::simd_collective<T>(v, 0, __line, #name, &__sm::complete_quad_reduce<T, __sm::Op>); \
    }
SM_QUAD_REDUCE(quad_sum, OpSum)
SM_QUAD_REDUCE(quad_product, OpProduct)
SM_QUAD_REDUCE(quad_min, OpMin)
SM_QUAD_REDUCE(quad_max, OpMax)
#undef SM_QUAD_REDUCE
template <class T> inline T quad_shuffle(T v, ushort i, uint __line = __builtin_LINE()) {
    return __sm::simd_collective<T>(v, i, __line, "quad_shuffle", &__sm::complete_quad_shuffle<T, false>);
}
template <class T> inline T quad_broadcast(T v, ushort i, uint __line = __builtin_LINE()) {
    return __sm::simd_collective<T>(v, i, __line, "quad_broadcast", &__sm::complete_quad_shuffle<T, false>);
}
template <class T> inline T quad_shuffle_xor(T v, ushort m, uint __line = __builtin_LINE()) {
    return __sm::simd_collective<T>(v, m, __line, "quad_shuffle_xor", &__sm::complete_quad_shuffle<T, true>);
}

// ---- simdgroup matrices (8x8) ----
// Each thread holds two elements, as on Apple GPUs: thread l (q = l / 4) holds row
// (q & 4) + (l / 2) % 4, columns (q & 2) * 2 + (l % 2) * 2 + {0, 1}. Loads and stores move
// the thread's own elements; multiply-accumulate is a simdgroup collective that gathers
// the operands from every thread, computes in float (one rounding to the destination type
// per element) and hands each thread its elements of the result.
namespace __sm {
static inline void elem_pos(uint32_t l, uint32_t& row, uint32_t& col) {
    uint32_t q = l / 4;
    row = (q & 4) + (l / 2) % 4;
    col = (q & 2) * 2 + (l % 2) * 2;
}
}  // namespace __sm
template <class T, int Cols, int Rows> struct simdgroup_matrix {
    static_assert(Cols == 8 && Rows == 8, "SoftMetal supports 8x8 simdgroup matrices only");
    vec<T, 2> __e;
    simdgroup_matrix() = default;
    // A diagonal matrix with `d` on the diagonal.
    explicit simdgroup_matrix(T d) {
        uint32_t row, col;
        __sm::elem_pos(__sm::cur()->lane, row, col);
        __e[0] = row == col ? d : T(0);
        __e[1] = row == col + 1 ? d : T(0);
    }
    vec<T, 2>& thread_elements() { return __e; }
    const vec<T, 2>& thread_elements() const { return __e; }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;
template <class T, int C, int R = C> inline simdgroup_matrix<T, C, R> make_filled_simdgroup_matrix(T v) {
    simdgroup_matrix<T, C, R> m;
    m.__e[0] = v;
    m.__e[1] = v;
    return m;
}
// matrix_origin is (column, row) of the tile's first element in the source; with
// transpose_matrix the tile is read as the transpose of the source block.
template <class T, class U>
inline void simdgroup_load(simdgroup_matrix<T, 8, 8>& d, const U* src, ulong elements_per_row = 8,
                           ulong2 matrix_origin = 0, bool transpose_matrix = false) {
    uint32_t row, col;
    __sm::elem_pos(__sm::cur()->lane, row, col);
    for (uint32_t j = 0; j < 2; j++) {
        ulong r = transpose_matrix ? col + j : row, c = transpose_matrix ? row : col + j;
        d.__e[j] = T(src[(matrix_origin.y + r) * elements_per_row + matrix_origin.x + c]);
    }
}
template <class T, class U>
inline void simdgroup_store(const simdgroup_matrix<T, 8, 8>& a, U* dst, ulong elements_per_row = 8,
                            ulong2 matrix_origin = 0, bool transpose_matrix = false) {
    uint32_t row, col;
    __sm::elem_pos(__sm::cur()->lane, row, col);
    for (uint32_t j = 0; j < 2; j++) {
        ulong r = transpose_matrix ? col + j : row, c = transpose_matrix ? row : col + j;
        dst[(matrix_origin.y + r) * elements_per_row + matrix_origin.x + c] = U(a.__e[j]);
    }
}
namespace __sm {
template <class M> static inline void gather(const SimdState& s, int which, float out[8][8]) {
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 8; c++) out[r][c] = 0.0f;
    for (uint32_t l = 0; l < 32; l++) {
        if (!(s.mask & (1u << l)) || !s.ptr[l][which]) continue;
        const M* m = (const M*)s.ptr[l][which];
        uint32_t row, col;
        elem_pos(l, row, col);
        out[row][col] = (float)m->__e[0];
        out[row][col + 1] = (float)m->__e[1];
    }
}
template <class D, class A, class B, class C> static void complete_mma(Group* g, uint32_t sg) {
    SimdState& s = g->simd[sg];
    float a[8][8], b[8][8], c[8][8];
    gather<A>(s, 1, a);
    gather<B>(s, 2, b);
    gather<C>(s, 3, c);
    float d[8][8];
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) {
            float acc = c[i][j];
            for (int k = 0; k < 8; k++) acc += a[i][k] * b[k][j];
            d[i][j] = acc;
        }
    for (uint32_t l = 0; l < 32; l++) {
        if (!(s.mask & (1u << l))) continue;
        D* m = (D*)s.ptr[l][0];
        uint32_t row, col;
        elem_pos(l, row, col);
        typedef rcv<decltype(m->__e[0])> E;
        m->__e[0] = E(d[row][col]);
        m->__e[1] = E(d[row][col + 1]);
    }
}
}  // namespace __sm
template <class TD, class TA, class TB, class TC>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                          const simdgroup_matrix<TB, 8, 8>& b, const simdgroup_matrix<TC, 8, 8>& c,
                                          uint __line = __builtin_LINE()) {
    typedef simdgroup_matrix<TD, 8, 8> D;
    typedef simdgroup_matrix<TA, 8, 8> A;
    typedef simdgroup_matrix<TB, 8, 8> B;
    typedef simdgroup_matrix<TC, 8, 8> C;
    __sm::simd_arrive(__line, "simdgroup_multiply_accumulate", &__sm::complete_mma<D, A, B, C>,
                      [&](__sm::SimdState& s, uint32_t l) {
                          s.ptr[l][0] = &d;
                          s.ptr[l][1] = &a;
                          s.ptr[l][2] = &b;
                          s.ptr[l][3] = &c;
                      });
}
template <class TD, class TA, class TB>
inline void simdgroup_multiply(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                               const simdgroup_matrix<TB, 8, 8>& b, uint __line = __builtin_LINE()) {
    typedef simdgroup_matrix<TD, 8, 8> D;
    typedef simdgroup_matrix<TA, 8, 8> A;
    typedef simdgroup_matrix<TB, 8, 8> B;
    __sm::simd_arrive(__line, "simdgroup_multiply", &__sm::complete_mma<D, A, B, D>,
                      [&](__sm::SimdState& s, uint32_t l) {
                          s.ptr[l][0] = &d;
                          s.ptr[l][1] = &a;
                          s.ptr[l][2] = &b;
                          s.ptr[l][3] = nullptr;
                      });
}
}  // namespace metal

// ---- Apple's compiler builtins that headers call directly (MLX's bf16_math.h, utils.h) ----
// Apple's <metal_math> implements its functions with `__metal_<name>(x..., fast)` builtins;
// the last argument says fast or precise math. Here both are the float result, as for
// metal::fast. Provided for the scalar types SoftMetal's metal:: functions take.
#define __METAL_FAST_MATH__ true
#define __METAL_PRECISE_MATH__ false
#define __METAL_MAYBE_FAST_MATH__ __METAL_PRECISE_MATH__  /* fastMathEnabled is ignored */
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
