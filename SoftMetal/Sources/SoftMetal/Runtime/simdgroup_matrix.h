// ---- simdgroup matrices (8x8) ----
// Each thread holds two elements, as on Apple GPUs: thread l (q = l / 4) holds row
// (q & 4) + (l / 2) % 4, columns (q & 2) * 2 + (l % 2) * 2 + {0, 1}. Loads and stores move
// the thread's own elements; multiply-accumulate is a simdgroup collective that gathers
// the operands from every thread, computes in float (one rounding to the destination type
// per element) and hands each thread its elements of the result.
namespace metal {
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
