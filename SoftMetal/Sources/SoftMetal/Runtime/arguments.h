// ---- kernel arguments ----
namespace metal {
namespace __sm {
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
}  // namespace metal
