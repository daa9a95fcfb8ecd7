// The drivers of one vector instruction set: the loops over weight rows and activation
// rows, and the choice of specialisation, written once for avx2.c and avx512.c. Each of
// them includes this file at its end, after defining
//
//   DRIVER_TARGET   its target attribute (the drivers inline its kernels, so they need it)
//   DRIVER_DENSE    1 if the products of dense kinds are its own, 0 if not (AVX-512:
//                   dispatch.c sends dense rows to AVX2)
//   row_kernel(kind, MM, w, r, a, lda, c, ldc)
//                   one weight row r against MM <= 4 activation rows: c[i * ldc] for i < MM
//   row_affine_kernel(kind, MM, GS, w, r, a, lda, xsum, c, ldc)
//                   the same for affine 4/8-bit codes in factored form, given the
//                   activations' group sums; GS the group size, 0 to read it from w
//   store_chunk(kind, w, gc, r, p, seg, k0, o)
//                   one chunk of row r as floats at o
//   matmul_fixed(m, n, a, lda, w, row0, c, ldc)
//                   a fixed-point product that returns 1 if it did the whole product,
//                   0 if it does not apply
//
// and gets `matmul` and `dequantize` (internal.h's moe_cpu_matmul_fn and
// moe_cpu_dequantize_fn) for its moe_cpu_format_kernels. The kernels are always-inline
// functions whose `kind`, MM and GS are constant at every call below, so each call
// becomes a kernel specialised for one format and one number of activation rows.

// xsum[i * groups + g] = the sum of elements [g * gs, (g + 1) * gs) of activation row i,
// in element order (a few thousand additions per call: no vector code needed).
static void group_sums(const float* a, int64_t lda, int64_t rows, int64_t cols, int64_t gs, float* xsum) {
    const int64_t groups = cols / gs;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t g = 0; g < groups; g++) {
            const float* x = a + i * lda + g * gs;
            float s = 0.0f;
            for (int64_t q = 0; q < gs; q++) s += x[q];
            xsum[i * groups + g] = s;
        }
}

// The factored row of kind K for mm activation rows, specialised on the group size too:
// a group loop of constant length unrolls. Other group sizes cannot reach here
// (WeightFormat validates them); GS 0 reads it at run time all the same. Macros, not always-inline functions: the same calls through
// functions compile to other code (the same instructions, differently laid out).
#define AFFINE_ROW(K, MM, GS) row_affine_kernel(K, MM, GS, w, row0 + j, ai, lda, xs, ci, ldc)
#define AFFINE_MM(K, GS)                   \
    switch (mm) {                          \
    case 1: AFFINE_ROW(K, 1, GS); break;   \
    case 2: AFFINE_ROW(K, 2, GS); break;   \
    case 3: AFFINE_ROW(K, 3, GS); break;   \
    default: AFFINE_ROW(K, 4, GS); break;  \
    }
#define AFFINE_GS(K)                       \
    switch (w->group_size) {               \
    case 32: AFFINE_MM(K, 32) break;       \
    case 64: AFFINE_MM(K, 64) break;       \
    case 128: AFFINE_MM(K, 128) break;     \
    default: AFFINE_MM(K, 0) break;        \
    }

// The factored product (row_affine_kernel) for K_Q4 / K_Q8; 0 (nothing done) for other
// kinds, or rows with more groups than the stack buffer of sums holds (the table path
// then serves). Activation rows go in passes of as many as their sums fit.
DRIVER_TARGET static int matmul_factored(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                                         int64_t row0, float* c, int64_t ldc) {
    const int kind = kernel_kind(w);
    if (kind != K_Q4 && kind != K_Q8) return 0;
    const int64_t groups = w->cols / w->group_size;
    const int64_t block = MIN(m, FACTORED_SUMS / groups / 4 * 4);
    if (block < 1) return 0;
    float xsum[FACTORED_SUMS];
    for (int64_t i0 = 0; i0 < m; i0 += block) {
        const int64_t mb = MIN(block, m - i0);
        group_sums(a + i0 * lda, lda, mb, w->cols, w->group_size, xsum);
        for (int64_t j = 0; j < n; j++)
            for (int64_t i1 = 0; i1 < mb; i1 += 4) {
                const float* ai = a + (i0 + i1) * lda;
                const float* xs = xsum + i1 * groups;
                float* ci = c + (i0 + i1) * ldc + j;
                const int mm = (int)MIN(4, mb - i1);
                if (kind == K_Q4) { AFFINE_GS(K_Q4) } else { AFFINE_GS(K_Q8) }
            }
    }
    return 1;
}

INLINE DRIVER_TARGET void matmul_kind(const int kind, int64_t m, int64_t n, const float* a, int64_t lda,
                                      const moe_cpu_matrix* w, int64_t row0, float* c, int64_t ldc) {
    for (int64_t j = 0; j < n; j++) {
        for (int64_t i0 = 0; i0 < m; i0 += 4) {
            const float* ai = a + i0 * lda;
            float* ci = c + i0 * ldc + j;
            switch (MIN(4, m - i0)) {
            case 1: row_kernel(kind, 1, w, row0 + j, ai, lda, ci, ldc); break;
            case 2: row_kernel(kind, 2, w, row0 + j, ai, lda, ci, ldc); break;
            case 3: row_kernel(kind, 3, w, row0 + j, ai, lda, ci, ldc); break;
            default: row_kernel(kind, 4, w, row0 + j, ai, lda, ci, ldc); break;
            }
        }
    }
}

DRIVER_TARGET static void matmul(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                                 int64_t row0, float* c, int64_t ldc) {
    if (matmul_fixed(m, n, a, lda, w, row0, c, ldc)) return;
    if (matmul_factored(m, n, a, lda, w, row0, c, ldc)) return;
    switch (kernel_kind(w)) {
    case K_F32: if (DRIVER_DENSE) matmul_kind(K_F32, m, n, a, lda, w, row0, c, ldc); break;
    case K_F16: if (DRIVER_DENSE) matmul_kind(K_F16, m, n, a, lda, w, row0, c, ldc); break;
    case K_BF16: if (DRIVER_DENSE) matmul_kind(K_BF16, m, n, a, lda, w, row0, c, ldc); break;
    case K_Q4: matmul_kind(K_Q4, m, n, a, lda, w, row0, c, ldc); break;
    case K_Q8: matmul_kind(K_Q8, m, n, a, lda, w, row0, c, ldc); break;
    case K_MXFP4: matmul_kind(K_MXFP4, m, n, a, lda, w, row0, c, ldc); break;
    default: matmul_kind(K_AFFINE_ANY, m, n, a, lda, w, row0, c, ldc); break;
    }
}

INLINE DRIVER_TARGET void dequantize_kind(const int kind, const moe_cpu_matrix* w, int64_t row0, int64_t rows,
                                          float* out) {
    const int64_t cols = w->cols, kv = chunked_cols(w);
    for (int64_t r = 0; r < rows; r++) {
        float* o = out + r * cols;
        const group_cursor gc = w->group_size > 0 ? group_cursor_for(w, row0 + r) : (group_cursor){0};
        segment_params p;
        for (int64_t seg = 0; seg < kv;) {
            const int64_t end = load_segment(&gc, is_dense(kind), seg, kv, &p);
            for (int64_t k0 = seg; k0 < end; k0 += CHUNK) store_chunk(kind, w, &gc, row0 + r, &p, seg, k0, o + k0);
            seg = end;
        }
        for (int64_t i = kv; i < cols; i++) o[i] = dense_element(w, row0 + r, i);
    }
}

DRIVER_TARGET static void dequantize(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out) {
    switch (kernel_kind(w)) {
    case K_F16: dequantize_kind(K_F16, w, row0, rows, out); break;
    case K_BF16: dequantize_kind(K_BF16, w, row0, rows, out); break;
    case K_Q4: dequantize_kind(K_Q4, w, row0, rows, out); break;
    case K_Q8: dequantize_kind(K_Q8, w, row0, rows, out); break;
    case K_MXFP4: dequantize_kind(K_MXFP4, w, row0, rows, out); break;
    default: moe_cpu_dequantize_rows_portable(w, row0, rows, out); break;
    }
}
