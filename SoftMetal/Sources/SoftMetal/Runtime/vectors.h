// ---- vector types ----
namespace metal {
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
    bfloat_vec(S s) { for (int i = 0; i < N; i++) v[i] = __sm::scalar_cast<bfloat>(s); }             \
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
// A packed vector counts its components (`float4(packed_char4)` converts each, not a splat).
template <class T, class = void> struct unpacked { typedef T type; };
template <class T> struct unpacked<T, void_t<typename T::vector_t>> { typedef typename T::vector_t type; };
template <class T> struct vcount { static constexpr int value = vtraits<typename unpacked<rcv<T>>::type>::N; };
template <class T> struct is_vec { static constexpr bool value = vtraits<rcv<T>>::vec; };
template <class V> struct velem { typedef typename vtraits<V>::E type; };

template <class T, class = void> struct packed_vector { typedef void type; };
template <class T> struct packed_vector<T, void_t<typename T::vector_t>> { typedef typename T::vector_t type; };
template <class E, class A> inline void vpush(E* out, int& k, const A& a) {
    if constexpr (!same<typename packed_vector<A>::type, void>::value) {  // packed_float4...
        vpush<E>(out, k, (typename packed_vector<A>::type)a);
    } else if constexpr (is_vec<A>::value) {
        for (int i = 0; i < vcount<A>::value; i++) out[k++] = scalar_cast<E>(a[i]);
    } else {
        out[k++] = scalar_cast<E>(a);
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
// By value: a class's conversion operator need not be const (MLX's fp8_e8m0 has
// `operator float() thread`, which `T(*(thread fp8_e8m0*)&s)` calls), and a vector element
// (`T(idx.x)`) binds to no non-const reference.
template <class T, class... A> constexpr inline T construct(A... a) {  // constexpr: `static constexpr U init = U(0);`
    if constexpr (is_vec<T>::value) return vmake<T>(a...);
    else if constexpr (sizeof...(A) == 1) return scalar_cast<T>(a...);
    else return T(a...);
}
template <class V> struct vcast {};
template <class V, class A> constexpr inline V operator->*(vcast<V>, A a) {
    if constexpr (is_vec<V>::value) return vmake<V>(a);
    else return scalar_cast<V>(a);  // a cast to a scalar type or a template parameter that is not a vector
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
}  // namespace metal
