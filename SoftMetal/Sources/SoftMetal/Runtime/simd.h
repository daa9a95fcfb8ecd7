// ---- barriers and simd operations ----
namespace metal {
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
}  // namespace metal
