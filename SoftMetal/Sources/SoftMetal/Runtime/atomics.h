// ---- memory flags, atomics ----
namespace metal {
enum class mem_flags : uint { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4, mem_threadgroup_imageblock = 8, mem_object_data = 16 };
inline constexpr mem_flags operator|(mem_flags a, mem_flags b) { return (mem_flags)((uint)a | (uint)b); }
// Before MSL 3.2 the only memory order is relaxed and there is no thread scope or fence:
// the other names are undeclared there, as in Apple's <metal_atomic>. From 3.2 on, the
// orders, `thread_scope` (a plain enum: `thread_scope_device` unqualified) and
// atomic_thread_fence.
enum memory_order { memory_order_relaxed = __ATOMIC_RELAXED,
#if __METAL_VERSION__ >= 320
                    memory_order_acquire = __ATOMIC_ACQUIRE, memory_order_release = __ATOMIC_RELEASE,
                    memory_order_acq_rel = __ATOMIC_ACQ_REL, memory_order_seq_cst = __ATOMIC_SEQ_CST,
#endif
};
#if __METAL_VERSION__ >= 320
enum thread_scope { thread_scope_thread, thread_scope_simdgroup, thread_scope_threadgroup, thread_scope_device };
#endif
template <class T> struct _atomic { T __v; };
template <class T> using atomic = _atomic<T>;
typedef _atomic<int> atomic_int;
typedef _atomic<uint> atomic_uint;
typedef _atomic<bool> atomic_bool;
typedef _atomic<float> atomic_float;
typedef _atomic<ulong> atomic_ulong;
typedef _atomic<long_t> atomic_long;
// Under the memory check an atomic is bounds-checked, marks its bytes written and takes
// part in the memory model across threadgroups (memory_check.h), but its own loads are not
// traced (atomics never race with each other). Not inlined, so that its return address is
// the kernel's MSL line.
#ifdef SM_CHECK_MEMORY
#define SM_ATOMIC_FN __attribute__((noinline, no_sanitize("coverage")))
namespace __sm {
static void check_atomic(const void* p, uint32_t size, uintptr_t pc, uint32_t kind);
static void check_fence(bool device_memory, bool device_scope, bool acquire, bool release);
}
#define SM_ATOMIC_CHECK_KIND(a, kind) ::metal::__sm::check_atomic((const void*)(a), sizeof(T), (uintptr_t)__builtin_return_address(0), kind)
#else
#define SM_ATOMIC_FN inline
#define SM_ATOMIC_CHECK_KIND(a, kind) ((void)0)
#endif
#define SM_ATOMIC_CHECK(a) SM_ATOMIC_CHECK_KIND(a, 3)
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
    SM_ATOMIC_CHECK_KIND(a, 2);
    __atomic_store(__sm::ap(a), &v, o == memory_order_relaxed ? __ATOMIC_RELAXED : __ATOMIC_SEQ_CST);
}
template <class T> SM_ATOMIC_FN T atomic_load_explicit(volatile _atomic<T>* a, memory_order o) {
    SM_ATOMIC_CHECK_KIND(a, 1);
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
#if __METAL_VERSION__ >= 320
// atomic_thread_fence: the fibers of a threadgroup share one OS thread.
inline void atomic_thread_fence(mem_flags f, memory_order o, thread_scope s = thread_scope_device) {
#ifdef SM_CHECK_MEMORY
    __sm::check_fence(((uint)f & (uint)mem_flags::mem_device) != 0, s == thread_scope_device,
                      o == memory_order_acquire || o == memory_order_acq_rel || o == memory_order_seq_cst,
                      o == memory_order_release || o == memory_order_acq_rel || o == memory_order_seq_cst);
#endif
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
#endif
}  // namespace metal
