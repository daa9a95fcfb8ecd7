// Products and dequantization for the weight formats of moe_cpu_formats.h.
//
// Every format is read 32 elements at a time ("a chunk": one group boundary never falls
// inside it, since group sizes are multiples of 32). Each instruction set has one
// unpacker per format that turns a chunk into float vectors; the drivers are written once
// and specialised per format by inlining with constant arguments, so no format branch is
// left in an inner loop. Formats without a vector unpacker (affine 2, 3, 5, 6 bits) go
// through the portable unpacker, still one chunk at a time.
#include "moe_cpu_formats.h"
#include "moe_cpu_kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
enum { CHUNK = 32 };

// Format codes of the specialised drivers: affine 4 and 8 bits have vector unpackers,
// other widths use AFFINE_ANY.
enum { K_F32, K_F16, K_BF16, K_Q4, K_Q8, K_AFFINE_ANY, K_MXFP4 };

static int kernel_kind(const moe_cpu_matrix* w) {
    switch (w->format) {
    case MOE_CPU_F16: return K_F16;
    case MOE_CPU_BF16: return K_BF16;
    case MOE_CPU_MXFP4: return w->split_nibbles ? K_MXFP4 : K_AFFINE_ANY;
    case MOE_CPU_AFFINE:
        if (w->bits == 8) return K_Q8;
        return w->bits == 4 && w->split_nibbles ? K_Q4 : K_AFFINE_ANY;
    default: return K_F32;
    }
}

// ---- scalar conversions (portable) ------------------------------------------------

INLINE float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

INLINE float bf16_to_float(uint16_t b) { return from_bits((uint32_t)b << 16); }

INLINE float f16_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
        const float v = (float)mantissa * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exponent == 31) return from_bits(sign | 0x7f800000u | (mantissa << 13));
    return from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

INLINE float scalar_at(const void* p, int type, int64_t i) {
    switch (type) {
    case MOE_CPU_SCALAR_F16: return f16_to_float(((const uint16_t*)p)[i]);
    case MOE_CPU_SCALAR_BF16: return bf16_to_float(((const uint16_t*)p)[i]);
    default: return ((const float*)p)[i];
    }
}

// E8M0: 2^(s - 127); 0 is 2^-127 (a float32 subnormal), 255 is NaN.
INLINE float e8m0_to_float(uint8_t s) {
    if (s == 255) return NAN;
    if (s == 0) return from_bits(0x00400000u);
    return from_bits((uint32_t)s << 23);
}

static const float e2m1_values[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// The `bits`-bit code of element i in a little-endian bit stream of `row_bytes` bytes.
INLINE uint32_t bit_stream_code(const uint8_t* row, int bits, int64_t i, int64_t row_bytes) {
    const int64_t bit = i * bits, byte = bit >> 3;
    uint32_t v = row[byte];
    if (byte + 1 < row_bytes) v |= (uint32_t)row[byte + 1] << 8;
    return (v >> (bit & 7)) & ((1u << bits) - 1u);
}

// Code of element i in the CPU layout of 4-bit codes (moe_cpu_split_nibbles).
INLINE uint32_t split_nibble_code(const uint8_t* row, int64_t i) {
    const uint8_t byte = row[(i >> 5) * 16 + (i & 15)];
    return (i & 16) ? byte >> 4 : byte & 0x0f;
}

INLINE uint32_t code_at(const moe_cpu_matrix* w, const uint8_t* row, int bits, int64_t i) {
    return w->split_nibbles ? split_nibble_code(row, i) : bit_stream_code(row, bits, i, w->row_bytes);
}

void moe_cpu_split_nibbles(const uint8_t* src, uint8_t* dst, int64_t bytes) {
    for (int64_t block = 0; block + 16 <= bytes; block += 16) {
        uint8_t out[16];
        for (int j = 0; j < 16; j++) {
            // Elements j and j + 16 of the block, from MLX's order (2 per byte, low first).
            const uint8_t lo = (src[block + j / 2] >> (4 * (j & 1))) & 0x0f;
            const uint8_t hi = (src[block + 8 + j / 2] >> (4 * (j & 1))) & 0x0f;
            out[j] = (uint8_t)(lo | (hi << 4));
        }
        memcpy(dst + block, out, 16);
    }
}

INLINE const uint8_t* row_data(const moe_cpu_matrix* w, int64_t r) {
    return (const uint8_t*)w->data + r * w->row_bytes;
}

// Where row r's scales and biases start, and how to find an element's group: a shift,
// since group sizes are powers of two (a division per chunk would cost more than the
// chunk's arithmetic).
typedef struct {
    const uint8_t* scales;
    const uint8_t* biases;
    int shift;
    int type;
    int mx;
} group_cursor;

INLINE group_cursor group_cursor_for(const moe_cpu_matrix* w, int64_t r) {
    group_cursor c;
    const int64_t groups = w->cols / w->group_size;
    c.shift = __builtin_ctz((unsigned)w->group_size);
    c.mx = w->format == MOE_CPU_MXFP4;
    c.type = w->scale_type;
    const int64_t size = c.mx ? 1 : (c.type == MOE_CPU_SCALAR_F32 ? 4 : 2);
    c.scales = (const uint8_t*)w->scales + r * groups * size;
    c.biases = c.mx ? 0 : (const uint8_t*)w->biases + r * groups * size;
    return c;
}

// Scale and bias of the group that element k0 lies in.
INLINE void group_params(const group_cursor* c, int64_t k0, float* s, float* b) {
    const int64_t g = k0 >> c->shift;
    if (c->mx) {
        *s = e8m0_to_float(c->scales[g]);
        *b = 0.0f;
    } else {
        *s = scalar_at(c->scales, c->type, g);
        *b = scalar_at(c->biases, c->type, g);
    }
}

// Elements [k0, k0 + 32) of row r as floats (any format).
static void unpack_chunk_portable(const moe_cpu_matrix* w, const group_cursor* gc, int64_t r, int64_t k0,
                                  float* out) {
    const uint8_t* row = row_data(w, r);
    switch (w->format) {
    case MOE_CPU_F32:
        memcpy(out, (const float*)row + k0, CHUNK * sizeof(float));
        return;
    case MOE_CPU_F16:
        for (int i = 0; i < CHUNK; i++) out[i] = f16_to_float(((const uint16_t*)row)[k0 + i]);
        return;
    case MOE_CPU_BF16:
        for (int i = 0; i < CHUNK; i++) out[i] = bf16_to_float(((const uint16_t*)row)[k0 + i]);
        return;
    case MOE_CPU_AFFINE: {
        float s, b;
        group_params(gc, k0, &s, &b);
        for (int i = 0; i < CHUNK; i++)
            out[i] = fmaf((float)code_at(w, row, w->bits, k0 + i), s, b);
        return;
    }
    case MOE_CPU_MXFP4: {
        float s, b;
        group_params(gc, k0, &s, &b);
        for (int i = 0; i < CHUNK; i++)
            out[i] = e2m1_values[code_at(w, row, 4, k0 + i)] * s;
        return;
    }
    }
}

// Dense rows may end in fewer than 32 elements.
INLINE float dense_element(const moe_cpu_matrix* w, int64_t r, int64_t i) {
    const uint8_t* row = row_data(w, r);
    switch (w->format) {
    case MOE_CPU_F16: return f16_to_float(((const uint16_t*)row)[i]);
    case MOE_CPU_BF16: return bf16_to_float(((const uint16_t*)row)[i]);
    default: return ((const float*)row)[i];
    }
}

INLINE int64_t chunked_cols(const moe_cpu_matrix* w) { return w->cols / CHUNK * CHUNK; }

static void dequantize_rows_portable(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out) {
    const int64_t cols = w->cols, kv = chunked_cols(w);
    for (int64_t r = 0; r < rows; r++) {
        float* o = out + r * cols;
        const group_cursor gc = w->group_size > 0 ? group_cursor_for(w, row0 + r) : (group_cursor){0};
        for (int64_t k0 = 0; k0 < kv; k0 += CHUNK) unpack_chunk_portable(w, &gc, row0 + r, k0, o + k0);
        for (int64_t i = kv; i < cols; i++) o[i] = dense_element(w, row0 + r, i);
    }
}

static void matmul_portable(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                            int64_t row0, float* c, int64_t ldc) {
    const int64_t cols = w->cols, kv = chunked_cols(w);
    float chunk[CHUNK];
    for (int64_t j = 0; j < n; j++) {
        for (int64_t i = 0; i < m; i++) c[i * ldc + j] = 0.0f;
        const group_cursor gc = w->group_size > 0 ? group_cursor_for(w, row0 + j) : (group_cursor){0};
        for (int64_t k0 = 0; k0 < kv; k0 += CHUNK) {
            unpack_chunk_portable(w, &gc, row0 + j, k0, chunk);
            for (int64_t i = 0; i < m; i++) {
                float s = 0.0f;
                for (int q = 0; q < CHUNK; q++) s += chunk[q] * a[i * lda + k0 + q];
                c[i * ldc + j] += s;
            }
        }
        for (int64_t x = kv; x < cols; x++) {
            const float v = dense_element(w, row0 + j, x);
            for (int64_t i = 0; i < m; i++) c[i * ldc + j] += v * a[i * lda + x];
        }
    }
}

#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
#include <immintrin.h>

// Group parameters with the hardware half conversion: the portable f16_to_float's
// branches cost more than a 4-bit chunk's unpacking.
INLINE __attribute__((target("f16c"))) float scalar_at_f16c(const void* p, int type, int64_t i) {
    switch (type) {
    case MOE_CPU_SCALAR_F16: return _cvtsh_ss(((const uint16_t*)p)[i]);
    case MOE_CPU_SCALAR_BF16: return bf16_to_float(((const uint16_t*)p)[i]);
    default: return ((const float*)p)[i];
    }
}

// A row is processed in segments of up to SEGMENT_GROUPS groups whose scales and biases
// are first converted to float here, so the chunk loop reads a float and broadcasts it.
enum { SEGMENT_GROUPS = 256 };
typedef struct {
    float s[SEGMENT_GROUPS];
    float b[SEGMENT_GROUPS];
} segment_params;

// Elements [k0, k1) of the row: the whole chunked row for dense formats, else up to
// SEGMENT_GROUPS groups from k0, with their parameters in p (indexed from k0's group).
INLINE __attribute__((target("f16c"))) int64_t load_segment(const group_cursor* c, int dense, int64_t k0, int64_t kv,
                                                             segment_params* p) {
    if (dense) return kv;
    const int64_t k1 = MIN(kv, k0 + ((int64_t)SEGMENT_GROUPS << c->shift));
    const int64_t g0 = k0 >> c->shift, n = (k1 - k0) >> c->shift;
    if (c->mx) {
        for (int64_t g = 0; g < n; g++) p->s[g] = e8m0_to_float(c->scales[g0 + g]);
    } else {
        for (int64_t g = 0; g < n; g++) {
            p->s[g] = scalar_at_f16c(c->scales, c->type, g0 + g);
            p->b[g] = scalar_at_f16c(c->biases, c->type, g0 + g);
        }
    }
    return k1;
}

INLINE int is_dense(int kind) { return kind == K_F32 || kind == K_F16 || kind == K_BF16; }

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
// (WeightFormat validates them); GS 0 reads it at run time all the same.
#define AFFINE_ROW(ISA, K, MM, GS) row_affine_##ISA(K, MM, GS, w, row0 + j, ai, lda, xs, ci, ldc)
#define AFFINE_MM(ISA, K, GS)                   \
    switch (mm) {                               \
    case 1: AFFINE_ROW(ISA, K, 1, GS); break;   \
    case 2: AFFINE_ROW(ISA, K, 2, GS); break;   \
    case 3: AFFINE_ROW(ISA, K, 3, GS); break;   \
    default: AFFINE_ROW(ISA, K, 4, GS); break;  \
    }
#define AFFINE_GS(ISA, K)                        \
    switch (w->group_size) {                     \
    case 32: AFFINE_MM(ISA, K, 32) break;        \
    case 64: AFFINE_MM(ISA, K, 64) break;        \
    case 128: AFFINE_MM(ISA, K, 128) break;      \
    default: AFFINE_MM(ISA, K, 0) break;         \
    }

// The drivers of one instruction set, written once over its row kernels (row_ISA(kind,
// MM, ...) and, for affine 4/8-bit codes, row_affine_ISA(kind, MM, GS, ...): one weight
// row against MM <= 4 activation rows) and its chunk store (store_chunk_ISA); `kind`, MM
// and GS become constants in every specialisation. DENSE: whether the products of dense
// kinds are this instruction set's (0 for AVX-512: see moe_cpu_matmul_formatted).
#define DEFINE_DRIVERS(ISA, TARGET, DENSE)                                                            \
    /* The factored product (row_affine_ISA) for K_Q4 / K_Q8; 0 (nothing done) for other      \
       kinds, or rows with more groups than the stack buffer of sums holds (the table path     \
       then serves). Activation rows go in passes of as many as their sums fit. */             \
    TARGET static int matmul_factored_##ISA(int64_t m, int64_t n, const float* a, int64_t lda,        \
                                            const moe_cpu_matrix* w, int64_t row0, float* c,          \
                                            int64_t ldc) {                                            \
        const int kind = kernel_kind(w);                                                              \
        if (kind != K_Q4 && kind != K_Q8) return 0;                                                   \
        const int64_t groups = w->cols / w->group_size;                                               \
        const int64_t block = MIN(m, FACTORED_SUMS / groups / 4 * 4);                                 \
        if (block < 1) return 0;                                                                      \
        float xsum[FACTORED_SUMS];                                                                    \
        for (int64_t i0 = 0; i0 < m; i0 += block) {                                                   \
            const int64_t mb = MIN(block, m - i0);                                                    \
            group_sums(a + i0 * lda, lda, mb, w->cols, w->group_size, xsum);                          \
            for (int64_t j = 0; j < n; j++)                                                           \
                for (int64_t i1 = 0; i1 < mb; i1 += 4) {                                              \
                    const float* ai = a + (i0 + i1) * lda;                                            \
                    const float* xs = xsum + i1 * groups;                                             \
                    float* ci = c + (i0 + i1) * ldc + j;                                              \
                    const int mm = (int)MIN(4, mb - i1);                                              \
                    if (kind == K_Q4) { AFFINE_GS(ISA, K_Q4) } else { AFFINE_GS(ISA, K_Q8) }          \
                }                                                                                     \
        }                                                                                             \
        return 1;                                                                                     \
    }                                                                                                 \
    INLINE TARGET void matmul_##ISA##_kind(const int kind, int64_t m, int64_t n, const float* a,      \
                                           int64_t lda, const moe_cpu_matrix* w, int64_t row0,        \
                                           float* c, int64_t ldc) {                                   \
        for (int64_t j = 0; j < n; j++) {                                                             \
            for (int64_t i0 = 0; i0 < m; i0 += 4) {                                                   \
                const float* ai = a + i0 * lda;                                                       \
                float* ci = c + i0 * ldc + j;                                                         \
                switch (MIN(4, m - i0)) {                                                             \
                case 1: row_##ISA(kind, 1, w, row0 + j, ai, lda, ci, ldc); break;                     \
                case 2: row_##ISA(kind, 2, w, row0 + j, ai, lda, ci, ldc); break;                     \
                case 3: row_##ISA(kind, 3, w, row0 + j, ai, lda, ci, ldc); break;                     \
                default: row_##ISA(kind, 4, w, row0 + j, ai, lda, ci, ldc); break;                    \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
    }                                                                                                 \
    TARGET static void matmul_##ISA(int64_t m, int64_t n, const float* a, int64_t lda,                \
                                    const moe_cpu_matrix* w, int64_t row0, float* c, int64_t ldc) {   \
        if (matmul_fixed_##ISA(m, n, a, lda, w, row0, c, ldc)) return;                                \
        if (matmul_factored_##ISA(m, n, a, lda, w, row0, c, ldc)) return;                             \
        switch (kernel_kind(w)) {                                                                     \
        case K_F32: if (DENSE) matmul_##ISA##_kind(K_F32, m, n, a, lda, w, row0, c, ldc); break;      \
        case K_F16: if (DENSE) matmul_##ISA##_kind(K_F16, m, n, a, lda, w, row0, c, ldc); break;      \
        case K_BF16: if (DENSE) matmul_##ISA##_kind(K_BF16, m, n, a, lda, w, row0, c, ldc); break;    \
        case K_Q4: matmul_##ISA##_kind(K_Q4, m, n, a, lda, w, row0, c, ldc); break;                   \
        case K_Q8: matmul_##ISA##_kind(K_Q8, m, n, a, lda, w, row0, c, ldc); break;                   \
        case K_MXFP4: matmul_##ISA##_kind(K_MXFP4, m, n, a, lda, w, row0, c, ldc); break;             \
        default: matmul_##ISA##_kind(K_AFFINE_ANY, m, n, a, lda, w, row0, c, ldc); break;             \
        }                                                                                             \
    }                                                                                                 \
    INLINE TARGET void dequantize_##ISA##_kind(const int kind, const moe_cpu_matrix* w, int64_t row0, \
                                               int64_t rows, float* out) {                            \
        const int64_t cols = w->cols, kv = chunked_cols(w);                                           \
        for (int64_t r = 0; r < rows; r++) {                                                          \
            float* o = out + r * cols;                                                                \
            const group_cursor gc = w->group_size > 0 ? group_cursor_for(w, row0 + r) : (group_cursor){0}; \
            segment_params p;                                                                         \
            for (int64_t seg = 0; seg < kv;) {                                                        \
                const int64_t end = load_segment(&gc, is_dense(kind), seg, kv, &p);                   \
                for (int64_t k0 = seg; k0 < end; k0 += CHUNK)                                         \
                    store_chunk_##ISA(kind, w, &gc, row0 + r, &p, seg, k0, o + k0);                   \
                seg = end;                                                                            \
            }                                                                                         \
            for (int64_t i = kv; i < cols; i++) o[i] = dense_element(w, row0 + r, i);                 \
        }                                                                                             \
    }                                                                                                 \
    TARGET static void dequantize_##ISA(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out) { \
        switch (kernel_kind(w)) {                                                                     \
        case K_F16: dequantize_##ISA##_kind(K_F16, w, row0, rows, out); break;                        \
        case K_BF16: dequantize_##ISA##_kind(K_BF16, w, row0, rows, out); break;                      \
        case K_Q4: dequantize_##ISA##_kind(K_Q4, w, row0, rows, out); break;                          \
        case K_Q8: dequantize_##ISA##_kind(K_Q8, w, row0, rows, out); break;                          \
        case K_MXFP4: dequantize_##ISA##_kind(K_MXFP4, w, row0, rows, out); break;                    \
        default: dequantize_rows_portable(w, row0, rows, out); break;                                 \
        }                                                                                             \
    }

// ---- AVX-512 ------------------------------------------------------------------------
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
// Bytes ahead of the 4-bit codes being read that a product prefetches (8-bit codes stream
// faster without it).
enum { CODE_PREFETCH = 1024 };
// Floats of activation group sums a factored product keeps on the stack; a row may have
// at most FACTORED_SUMS / 4 groups.
enum { FACTORED_SUMS = 4096 };

// Chunk -> v[0] (elements 0-15), v[1] (16-31), scale and bias applied.
// p, seg: the parameters of the segment starting at element seg (quantized kinds).
INLINE T512 void unpack_avx512(const int kind, const moe_cpu_matrix* w, const group_cursor* gc, int64_t r,
                               const segment_params* p, int64_t seg, int64_t k0, __m512* v) {
    const uint8_t* row = row_data(w, r);
    if (kind == K_F32) {
        v[0] = _mm512_loadu_ps((const float*)row + k0);
        v[1] = _mm512_loadu_ps((const float*)row + k0 + 16);
        return;
    }
    if (kind == K_F16) {
        const __m256i* p = (const __m256i*)(row + 2 * k0);
        v[0] = _mm512_cvtph_ps(_mm256_loadu_si256(p));
        v[1] = _mm512_cvtph_ps(_mm256_loadu_si256(p + 1));
        return;
    }
    if (kind == K_BF16) {
        const __m256i* p = (const __m256i*)(row + 2 * k0);
        v[0] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p)), 16));
        v[1] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p + 1)), 16));
        return;
    }
    if (kind == K_AFFINE_ANY) {
        float tmp[CHUNK];
        unpack_chunk_portable(w, gc, r, k0, tmp);
        v[0] = _mm512_loadu_ps(tmp);
        v[1] = _mm512_loadu_ps(tmp + 16);
        return;
    }
    const int64_t g = (k0 - seg) >> gc->shift;
    const __m512 scale = _mm512_set1_ps(p->s[g]);
    if (kind == K_Q8) {
        const __m512 bias = _mm512_set1_ps(p->b[g]);
        const __m512i i0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + k0)));
        const __m512i i1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + k0 + 16)));
        v[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), scale, bias);
        v[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), scale, bias);
        return;
    }
    // 4-bit codes in the split layout: the 16 values a code can stand for in this group
    // form a table, and vpermps picks by the low 4 bits of each 32-bit lane, so the
    // codes need no mask: bytes widened to lanes index elements 0-15, shifted by 4 16-31.
    __m512 table;
    if (kind == K_MXFP4) {
        table = _mm512_mul_ps(_mm512_loadu_ps(e2m1_values), scale);
    } else {
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        table = _mm512_fmadd_ps(iota, scale, _mm512_set1_ps(p->b[g]));
    }
    const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + (k0 >> 1))));
    v[0] = _mm512_permutexvar_ps(codes, table);
    v[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table);
}

// One weight row against MM activation rows. Two chunks per step with separate
// accumulators keep four FMA chains in flight even for one activation row.
INLINE T512 void row_avx512(const int kind, const int MM, const moe_cpu_matrix* w, int64_t r,
                            const float* a, int64_t lda, float* c, int64_t ldc) {
    const int64_t cols = w->cols, kv = chunked_cols(w);
    const group_cursor gc = w->group_size > 0 ? group_cursor_for(w, r) : (group_cursor){0};
    __m512 acc[4][4];
    for (int i = 0; i < MM; i++)
        for (int q = 0; q < 4; q++) acc[i][q] = _mm512_setzero_ps();
    segment_params p;
    for (int64_t seg = 0; seg < kv;) {
        const int64_t end = load_segment(&gc, is_dense(kind), seg, kv, &p);
        int64_t k0 = seg;
        for (; k0 + 2 * CHUNK <= end; k0 += 2 * CHUNK) {
            __m512 v[4];
            // Packed codes are consumed slower than the prefetcher ramps up on a new row:
            // fetching 1 KiB ahead (the next row, near a row's end) covers the ramp, for
            // mxfp4 here as for affine 4-bit in row_affine_avx512.
            if (kind == K_MXFP4) _mm_prefetch((const char*)row_data(w, r) + (k0 >> 1) + CODE_PREFETCH, _MM_HINT_T0);
            unpack_avx512(kind, w, &gc, r, &p, seg, k0, v);
            unpack_avx512(kind, w, &gc, r, &p, seg, k0 + CHUNK, v + 2);
            for (int i = 0; i < MM; i++) {
                const float* x = a + i * lda + k0;
                for (int q = 0; q < 4; q++) acc[i][q] = _mm512_fmadd_ps(v[q], _mm512_loadu_ps(x + 16 * q), acc[i][q]);
            }
        }
        if (k0 < end) {
            __m512 v[2];
            unpack_avx512(kind, w, &gc, r, &p, seg, k0, v);
            for (int i = 0; i < MM; i++) {
                const float* x = a + i * lda + k0;
                for (int q = 0; q < 2; q++) acc[i][q] = _mm512_fmadd_ps(v[q], _mm512_loadu_ps(x + 16 * q), acc[i][q]);
            }
        }
        seg = end;
    }
    for (int i = 0; i < MM; i++) {
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][2]), _mm512_add_ps(acc[i][1], acc[i][3]));
        float s = _mm512_reduce_add_ps(sum);
        for (int64_t x = kv; x < cols; x++) s += dense_element(w, r, x) * a[i * lda + x];
        c[i * ldc] = s;
    }
}

// Affine 4- and 8-bit codes multiply in factored form, as MLX's qmv does: per group,
//   sum_i (s q_i + b) x_i = s * sum_i q_i x_i + b * sum_i x_i,
// so the inner loop only widens codes to floats and does one FMA per element (no per-group
// table, no bias), the scale is applied once per group, and sum_i x_i is computed once per
// activation row (group_sums) and dotted with the row's biases at the end, where the
// table path is shuffle-bound. The rounding differs from the table path but stays float32
// with float32 accumulation, well inside the spec's tolerance.

// Scale or bias elements [g, g + n) as floats in the first n lanes (n <= 16), zeros in the
// others: masked loads, so short rows (a down projection's 12 groups) convert theirs in
// one step and nothing past the row is read.
INLINE __mmask16 first_lanes(int64_t n) { return (__mmask16)((1u << n) - 1u); }

INLINE T512 __m512 load_scalars(const void* p, int type, int64_t g, int64_t n) {
    const __mmask16 m = first_lanes(n);
    switch (type) {
    case MOE_CPU_SCALAR_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t*)p + g));
    case MOE_CPU_SCALAR_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t*)p + g)), 16));
    default: return _mm512_maskz_loadu_ps(m, (const float*)p + g);
    }
}

// One affine weight row (kind K_Q4 or K_Q8) against MM <= 4 activation rows whose group
// sums are xsum[i * groups + g].
INLINE T512 void row_affine_avx512(const int kind, const int MM, const int GS, const moe_cpu_matrix* w, int64_t r,
                                   const float* a, int64_t lda, const float* xsum, float* c, int64_t ldc) {
    const int64_t cols = w->cols, gs = GS ? GS : w->group_size, groups = cols / gs;
    const group_cursor gc = group_cursor_for(w, r);
    const uint8_t* row = row_data(w, r);
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    float scales[FACTORED_SUMS / 4 + 16];  // whole vectors are stored
    // The row's scales as floats first: converting one per group inside the loop costs
    // more than the group's FMAs.
    for (int64_t g = 0; g < groups; g += 16) _mm512_storeu_ps(scales + g, load_scalars(gc.scales, gc.type, g, MIN(16, groups - g)));
    __m512 total[4][2];
    for (int i = 0; i < MM; i++) total[i][0] = total[i][1] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const int64_t k0 = g * gs;
        if (kind == K_Q4) _mm_prefetch((const char*)row + (k0 >> 1) + CODE_PREFETCH, _MM_HINT_T0);
        __m512 acc[4][2];
        for (int i = 0; i < MM; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        for (int64_t k = k0; k < k0 + gs; k += CHUNK) {
            __m512 q0, q1;
            if (kind == K_Q4) {  // split layout: low nibbles are elements 0-15, high 16-31
                const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + (k >> 1))));
                q0 = _mm512_permutexvar_ps(codes, iota);  // reads only the low nibble
                q1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(codes, 4));
            } else {
                q0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + k))));
                q1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + k + 16))));
            }
            for (int i = 0; i < MM; i++) {
                const float* x = a + i * lda + k;
                acc[i][0] = _mm512_fmadd_ps(q0, _mm512_loadu_ps(x), acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(q1, _mm512_loadu_ps(x + 16), acc[i][1]);
            }
        }
        const __m512 scale = _mm512_set1_ps(scales[g]);
        for (int i = 0; i < MM; i++) {
            total[i][0] = _mm512_fmadd_ps(acc[i][0], scale, total[i][0]);
            total[i][1] = _mm512_fmadd_ps(acc[i][1], scale, total[i][1]);
        }
    }
    for (int i = 0; i < MM; i++) {
        const float* xs = xsum + i * groups;
        __m512 biased = _mm512_setzero_ps();
        for (int64_t g = 0; g < groups; g += 16) {
            const int64_t n = MIN(16, groups - g);
            biased = _mm512_fmadd_ps(load_scalars(gc.biases, gc.type, g, n),
                                     _mm512_maskz_loadu_ps(first_lanes(n), xs + g), biased);
        }
        c[i * ldc] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(total[i][0], total[i][1]), biased));
    }
}

// ---- Affine codes against fixed-point activations (AVX-512) -------------------------
// The factored product above is bound by its float work: one conversion and one FMA per
// weight. Integer multiply-adds do 32 (int16) or 64 (int8) products per instruction, so
// here each activation group is first written in fixed point, finely enough that nothing
// is lost against float32 arithmetic, and the codes multiply it exactly in int32:
//   8-bit codes: x_k = d (h_k + l_k / 2^15) + e_k, d = max|x| / 32767, h and l int16,
//                |e_k| <= 2^-31 max|x|; sums H = sum q h, L = sum q l (vpdpwssd);
//   4-bit codes: x_k = D t_k + e_k, D = max|x| / FIXED_TOP, t_k = 65536 t2 + 256 t1 + t0
//                with signed 8-bit digits, |e_k| <= 2^-24 max|x|; sums of q times each
//                digit (vpdpbusd), combined in int32 as ((T2 << 8) + T1 << 8) + T0, which
//                cannot overflow with 4-bit codes and groups of at most 128.
// max is over the activation group; float32 itself rounds each product to 2^-24 of its
// size, and a dot product's error is dominated by its largest terms. Then per group
//   sum_k (s q_k + b) x_k = s d (H + L / 2^15) + b sum_k x_k   (or s D T + b sum_k x_k),
// with sum_k x_k summed from the float activations. Without AVX512-VNNI the same integers
// come from vpmaddwd / vpmaddubsw + vpmaddwd and adds. An integer multiply-add does 64
// (4-bit) or 32 (8-bit) products an instruction, where the float factored row does 16.
// A row of activations with a non-finite value keeps the float path (IEEE propagation).

enum { FIXED_ONE = 32767, FIXED_TOP = 8323072, FIXED_MAX_GROUPS = 1024 };
// Instruction levels of the fixed-point rows (as table indices): AVX-512 alone, with
// VNNI, with VNNI and GFNI.
enum { FIXED_PLAIN, FIXED_VNNI, FIXED_GFNI };

// Scratch for one call's prepared activations: per thread, kept between calls (a decode
// step makes a few hundred calls), freed when the thread exits.
static pthread_key_t fixed_scratch_key;
static pthread_once_t fixed_scratch_once = PTHREAD_ONCE_INIT;
typedef struct {
    size_t capacity;
    void* data;
} fixed_scratch;

static void fixed_scratch_free(void* p) {
    fixed_scratch* s = p;
    free(s->data);
    free(s);
}
static void fixed_scratch_key_create(void) { (void)pthread_key_create(&fixed_scratch_key, fixed_scratch_free); }

// `bytes` of 64-byte-aligned scratch for this thread, or NULL if it cannot be allocated.
static void* fixed_scratch_take(size_t bytes) {
    (void)pthread_once(&fixed_scratch_once, fixed_scratch_key_create);
    fixed_scratch* s = pthread_getspecific(fixed_scratch_key);
    if (s == NULL) {
        if ((s = calloc(1, sizeof *s)) == NULL) return NULL;
        if (pthread_setspecific(fixed_scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->capacity < bytes) {
        free(s->data);
        s->capacity = 0;
        const size_t rounded = (bytes + 4095) & ~(size_t)4095;
        if ((s->data = aligned_alloc(64, rounded)) == NULL) return NULL;
        s->capacity = rounded;
    }
    return s->data;
}

// Activation rows in fixed point, in the order the codes of `kind` unpack. 8-bit codes:
// element order, int16 hi and lo. 4-bit codes (split layout): three int8 digit planes
// (t2, t1, t0), per 64 elements in the order 0-15, 32-47, 16-31, 48-63, which is what
// masking / shifting the nibbles of 32 code bytes yields (a last block of 32 stays in
// order). Row i: hi[i * cols + k], lo likewise; digits[(3 i + plane) * cols + k];
// scale[i * groups + g] (d or D), xsum likewise.
typedef struct {
    int16_t* hi;
    int16_t* lo;
    int8_t* digits;
    float* scale;
    float* xsum;
} fixed_rows;

// Element of the prepared order -> element of the row, per 16 elements.
INLINE int64_t fixed_source(const int kind, int64_t k, int64_t cols) {
    if (kind != K_Q4 || (k | 63) >= cols) return k;
    static const int8_t block16[4] = {0, 32, 16, 48};
    return (k & ~(int64_t)63) + block16[(k >> 4) & 3] + (k & 15);
}

// Signed low byte of each int32 lane.
INLINE T512 __m512i low_digit(__m512i t) { return _mm512_srai_epi32(_mm512_slli_epi32(t, 24), 24); }

// 1 if every value is finite (the rows are then prepared), else 0.
INLINE T512 int prepare_fixed_avx512(const int kind, int64_t m, const float* a, int64_t lda, int64_t cols,
                                     int64_t gs, const fixed_rows* out) {
    const int64_t groups = cols / gs;
    const float top_code = kind == K_Q4 ? (float)FIXED_TOP : (float)FIXED_ONE;
    float inv[FIXED_MAX_GROUPS];
    for (int64_t i = 0; i < m; i++) {
        const float* x = a + i * lda;
        float* d = out->scale + i * groups;
        for (int64_t g = 0; g < groups; g++) {
            __m512 big = _mm512_setzero_ps(), sum = _mm512_setzero_ps();
            for (int64_t k = g * gs; k < (g + 1) * gs; k += 16) {
                const __m512 v = _mm512_loadu_ps(x + k);
                big = _mm512_max_ps(big, _mm512_abs_ps(v));
                sum = _mm512_add_ps(sum, v);
            }
            const float top = _mm512_reduce_max_ps(big);
            if (!(top <= 3.4028235e38f)) return 0;  // inf or NaN
            d[g] = top / top_code;
            inv[g] = top > 0 ? top_code / top : 0.0f;
            out->xsum[i * groups + g] = _mm512_reduce_add_ps(sum);
        }
        for (int64_t k = 0; k < cols; k += 16) {
            const int64_t src = fixed_source(kind, k, cols), g = src / gs;
            const __m512 v = _mm512_loadu_ps(x + src), scale = _mm512_set1_ps(inv[g]);
            const __m512 h = _mm512_roundscale_ps(_mm512_mul_ps(v, scale), _MM_FROUND_TO_NEAREST_INT);
            const __m512 rest = _mm512_mul_ps(_mm512_fnmadd_ps(h, _mm512_set1_ps(d[g]), v), scale);  // v - h d exactly, / d
            if (kind == K_Q4) {
                const __m512i t = _mm512_add_epi32(_mm512_cvtps_epi32(h), _mm512_cvtps_epi32(rest));
                const __m512i t0 = low_digit(t), t12 = _mm512_srai_epi32(_mm512_sub_epi32(t, t0), 8);
                const __m512i t1 = low_digit(t12), t2 = _mm512_srai_epi32(_mm512_sub_epi32(t12, t1), 8);
                int8_t* dg = out->digits + 3 * i * cols + k;
                _mm_storeu_si128((__m128i*)dg, _mm512_cvtepi32_epi8(t2));
                _mm_storeu_si128((__m128i*)(dg + cols), _mm512_cvtepi32_epi8(t1));
                _mm_storeu_si128((__m128i*)(dg + 2 * cols), _mm512_cvtepi32_epi8(t0));
            } else {
                const __m512 l = _mm512_mul_ps(rest, _mm512_set1_ps(32768.0f));
                _mm256_storeu_si256((__m256i*)(out->hi + i * cols + k), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(h)));
                _mm256_storeu_si256((__m256i*)(out->lo + i * cols + k), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(l)));
            }
        }
    }
    return 1;
}

// acc + the pairwise products of int16 lanes (dot_words256) or the four-way products of
// unsigned and signed bytes (dot_bytes), in int32 lanes. Inline assembly for VNNI: an
// always-inline function with the intrinsic could not also serve the non-VNNI build of
// the same row kernel. No intermediate saturates: codes are at most 255 against int16,
// and at most 15 against int8 (two products stay far inside int16 in vpmaddubsw).
INLINE T512 __m512i dot_bytes(const int vnni, __m512i acc, __m512i u, __m512i s) {
    if (vnni) {
        __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
        return acc;
    }
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}

INLINE T512 __m256i dot_words256(const int vnni, __m256i acc, __m256i a, __m256i b) {
    if (vnni) {
        __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
        return acc;
    }
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}

INLINE T512 __m256i dot_bytes256(const int vnni, __m256i acc, __m256i u, __m256i s) {
    if (vnni) {
        __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
        return acc;
    }
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

// The per-row part of a fixed-point product: cs[i][g] = scale[g] * (d or D of activation
// row i, group g), and bias . xsum of each activation row as a vector to fold into the total.
// 0 if some cs underflowed below float32's normal range (scales near 2^-126 times small
// activations): the row then takes the float path, which does not form that product.
INLINE T512 int fixed_row_scales(const int MM, const group_cursor* gc, int64_t groups,
                                const fixed_rows* x, float cs[][FIXED_MAX_GROUPS + 16], __m512* biased) {
    __mmask16 lost = 0;
    for (int i = 0; i < MM; i++) biased[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g += 16) {
        const int64_t n = MIN(16, groups - g);
        const __m512 s = load_scalars(gc->scales, gc->type, g, n), b = load_scalars(gc->biases, gc->type, g, n);
        for (int i = 0; i < MM; i++) {
            const __m512 d = _mm512_maskz_loadu_ps(first_lanes(n), x->scale + i * groups + g);
            const __m512 sd = _mm512_mul_ps(s, d);
            _mm512_storeu_ps(cs[i] + g, sd);
            lost |= _mm512_cmp_ps_mask(_mm512_abs_ps(sd), _mm512_set1_ps(0x1p-126f), _CMP_LT_OQ) &
                    _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_NEQ_UQ) & _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_UQ);
            biased[i] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(first_lanes(n), x->xsum + i * groups + g), biased[i]);
        }
    }
    return lost == 0;
}

// Group g of an 8-bit row (32 codes a step), its integer sums converted and scaled into
// totals [u]: with u constant per call site, two totals per activation row keep two FMA
// chains in flight. The integer work runs on 256-bit halves (codes 0-15 and 16-31 of a
// step), joined into the 16 lanes of the 512-bit form only per group: the same integers
// in the same lanes, but 8-bit codes stream from memory and, as with dense rows
// (moe_cpu_matmul_formatted), 256-bit code streams faster from memory, although from L2
// the 512-bit form is faster (docs/cpu-backend.md).
INLINE T512 void group_fixed_q8(const int MM, const int64_t gs, const int vnni, const int u, const uint8_t* row,
                                int64_t g, int64_t cols, const fixed_rows* x, float cs[][FIXED_MAX_GROUPS + 16],
                                __m512 hi_total[][2], __m512 lo_total[][2]) {
    __m256i hs[4][2], ls[4][2];  // [activation row][half]
    for (int i = 0; i < MM; i++) hs[i][0] = hs[i][1] = ls[i][0] = ls[i][1] = _mm256_setzero_si256();
    for (int64_t e = g * gs; e < (g + 1) * gs; e += 32)
        for (int h = 0; h < 2; h++) {
            const __m256i codes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(row + e + 16 * h)));
            for (int i = 0; i < MM; i++) {
                const int64_t at = i * cols + e + 16 * h;
                hs[i][h] = dot_words256(vnni, hs[i][h], codes, _mm256_loadu_si256((const __m256i*)(x->hi + at)));
                ls[i][h] = dot_words256(vnni, ls[i][h], codes, _mm256_loadu_si256((const __m256i*)(x->lo + at)));
            }
        }
    for (int i = 0; i < MM; i++) {
        const __m512 scale = _mm512_set1_ps(cs[i][g]);
        const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(hs[i][0]), hs[i][1], 1);
        const __m512i l = _mm512_inserti64x4(_mm512_castsi256_si512(ls[i][0]), ls[i][1], 1);
        hi_total[i][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h), scale, hi_total[i][u]);
        lo_total[i][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l), scale, lo_total[i][u]);
    }
}

// The 64 codes of 32 bytes in the split layout (low nibbles, then high nibbles) as the
// bytes of one vector. With GFNI, one bit-matrix transform per 64-bit lane of a broadcast
// keeps the low nibbles in the lower half and moves the high nibbles down in the upper
// half: one instruction where mask, shift, mask and insert take four (the same codes).
// Inline assembly for the reason dot_bytes gives.
INLINE T512 __m512i nibble_codes(const int gfni, const uint8_t* p) {
    if (gfni) {
        const __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)p));
        // Byte 7 - i of a lane's matrix selects the source bits of result bit i.
        const __m512i low = _mm512_set1_epi64(0x0102040800000000), high = _mm512_set1_epi64(0x1020408000000000);
        const __m512i m = _mm512_inserti64x4(low, _mm512_castsi512_si256(high), 1);
        __m512i q;
        __asm__("vgf2p8affineqb $0, %2, %1, %0" : "=v"(q) : "v"(b), "v"(m));
        return q;
    }
    const __m256i b = _mm256_loadu_si256((const __m256i*)p), nibble = _mm256_set1_epi8(15);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b, nibble)),
                              _mm256_and_si256(_mm256_srli_epi16(b, 4), nibble), 1);
}

// NS (1 or 2) spans of a 4-bit row from element k, each span's integer sum converted and
// scaled into totals [its index]: the two spans' dependency chains (three multiply-adds,
// two shifts, a conversion, an FMA) interleave, as two FMA chains per activation row do.
INLINE T512 void spans_fixed_q4(const int NS, const int MM, const int64_t gs, const int64_t span, const int level,
                                const uint8_t* row, int64_t k, int64_t cols, const fixed_rows* x,
                                float cs[][FIXED_MAX_GROUPS + 16], __m512 total[][2]) {
    const int steps = span == 128 ? 2 : 1;  // steps of 64 codes per span
    const int vnni = level >= FIXED_VNNI;
    __m512i q[2][2];
    for (int u = 0; u < NS; u++)
        for (int h = 0; h < steps; h++) {
            const uint8_t* p = row + ((k + u * span + 64 * h) >> 1);
            // One prefetch per cache line (k is a multiple of 128 when NS is 2).
            if (NS == 1 || (u * span + 64 * h) % 128 == 0) _mm_prefetch((const char*)p + CODE_PREFETCH, _MM_HINT_T0);
            q[u][h] = nibble_codes(level == FIXED_GFNI, p);
        }
    for (int i = 0; i < MM; i++) {
        __m512i t[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int plane = 0; plane < 3; plane++)
            for (int u = 0; u < NS; u++) {
                const int8_t* dg = x->digits + (3 * i + plane) * cols + k + u * span;
                if (plane) t[u] = _mm512_slli_epi32(t[u], 8);
                for (int h = 0; h < steps; h++) t[u] = dot_bytes(vnni, t[u], q[u][h], _mm512_loadu_si512(dg + 64 * h));
            }
        for (int u = 0; u < NS; u++) {
            const int64_t g = (k + u * span) / gs;
            __m512 scale;
            if (span == gs) {
                scale = _mm512_set1_ps(cs[i][g]);
            } else {  // two groups of 32: lanes 0-3 and 8-11, 4-7 and 12-15
                scale = _mm512_mask_blend_ps(0xf0f0, _mm512_set1_ps(cs[i][g]), _mm512_set1_ps(cs[i][g + 1]));
            }
            total[i][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t[u]), scale, total[i][u]);
        }
    }
}

// One affine weight row of kind K_Q8 or K_Q4 (split layout) against MM <= 4 prepared
// activation rows: out[i] = the row's 16 lanes to sum; 0 (out zero) if its scales
// underflow (fixed_row_scales). 4-bit codes go 32 code bytes (64 codes) a step, their
// nibbles as the 64 bytes of one vector; a step's integer sum covers one group (GS 64),
// half of one (GS 128: two steps), or two (GS 32: lanes 0-3 and 8-11, 4-7 and 12-15); a
// last block of 32 codes (GS 32 only) takes 256-bit vectors.
INLINE T512 int row_fixed_avx512(const int kind, const int MM, const int gs, const int level, const moe_cpu_matrix* w,
                                 int64_t r, const fixed_rows* x, __m512* out) {
    const int vnni = level >= FIXED_VNNI;
    const int64_t cols = w->cols, groups = cols / gs;
    const group_cursor gc = group_cursor_for(w, r);
    const uint8_t* row = row_data(w, r);
    float cs[4][FIXED_MAX_GROUPS + 16];
    __m512 hi_total[4][2], lo_total[4][2], biased[4];  // lo: 8-bit codes only
    if (!fixed_row_scales(MM, &gc, groups, x, cs, biased)) {
        for (int i = 0; i < MM; i++) out[i] = _mm512_setzero_ps();
        return 0;
    }
    for (int i = 0; i < MM; i++) hi_total[i][0] = hi_total[i][1] = lo_total[i][0] = lo_total[i][1] = _mm512_setzero_ps();
    if (kind == K_Q8) {
        int64_t g = 0;
        for (; g + 2 <= groups; g += 2) {
            group_fixed_q8(MM, gs, vnni, 0, row, g, cols, x, cs, hi_total, lo_total);
            group_fixed_q8(MM, gs, vnni, 1, row, g + 1, cols, x, cs, hi_total, lo_total);
        }
        if (g < groups) group_fixed_q8(MM, gs, vnni, 0, row, g, cols, x, cs, hi_total, lo_total);
        for (int i = 0; i < MM; i++) {
            const __m512 lo = _mm512_add_ps(lo_total[i][0], lo_total[i][1]);
            biased[i] = _mm512_fmadd_ps(lo, _mm512_set1_ps(0x1p-15f), biased[i]);
        }
    } else {
        const int64_t span = gs == 32 ? 64 : gs;  // elements per integer sum
        int64_t k = 0;
        for (; k + 2 * span <= cols; k += 2 * span) spans_fixed_q4(2, MM, gs, span, level, row, k, cols, x, cs, hi_total);
        if (k + span <= cols) {
            spans_fixed_q4(1, MM, gs, span, level, row, k, cols, x, cs, hi_total);
            k += span;
        }
        if (k < cols) {  // groups of 32 and a last group of 32 codes
            const __m128i b = _mm_loadu_si128((const __m128i*)(row + (k >> 1)));
            const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(b, _mm_set1_epi8(15))),
                                                      _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15)), 1);
            for (int i = 0; i < MM; i++) {
                __m256i t = _mm256_setzero_si256();
                for (int plane = 0; plane < 3; plane++) {
                    const int8_t* dg = x->digits + (3 * i + plane) * cols + k;
                    if (plane) t = _mm256_slli_epi32(t, 8);
                    t = dot_bytes256(vnni, t, q, _mm256_loadu_si256((const __m256i*)dg));
                }
                hi_total[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(t)),
                                                 _mm512_set1_ps(cs[i][k / gs]), hi_total[i][0]);
            }
        }
    }
    for (int i = 0; i < MM; i++) out[i] = _mm512_add_ps(_mm512_add_ps(hi_total[i][0], hi_total[i][1]), biased[i]);
    return 1;
}

// The sum of v's 16 lanes by a fixed tree (lanes i + i+8, then i + i+4, i + i+2, i + i+1),
// and the same sums of four vectors at once (the driver reduces four weight rows together:
// a quarter of the shuffles, and exactly the same results as one at a time).
INLINE T512 float sum_lanes(__m512 v) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

INLINE T512 __m128 sum_lanes4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
    const __m512 a01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 a23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 c = _mm512_add_ps(b, _mm512_permute_ps(b, _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512 d = _mm512_add_ps(c, _mm512_permute_ps(c, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), d));
}

// The float row of any kind, for the rare rows the fixed-point product leaves (one
// instance: kind and activation rows are run-time values here).
static T512 __attribute__((noinline)) void row_float_avx512(int kind, int mm, const moe_cpu_matrix* w, int64_t r,
                                                            const float* a, int64_t lda, float* c, int64_t ldc) {
    row_avx512(kind, mm, w, r, a, lda, c, ldc);
}

// One function per specialisation (kind, activation rows, group size, level): rows
// [r0, r0 + nb) of a call, v[q][i] = row r0 + q against activation row i, done[q] = 0 for
// a row left to the float path. Separate functions rather than one switch that inlines
// all 60: compilers' per-function passes grow faster than linearly.
typedef void fixed_rows_fn(const moe_cpu_matrix* w, int64_t r0, int64_t nb, const fixed_rows* x, __m512 (*v)[4],
                           int* done);
#define FIXED_ROWS(K, MM, GS, V)                                                                              \
    static T512 void fixed_rows_##K##_##MM##_##GS##_##V(const moe_cpu_matrix* w, int64_t r0, int64_t nb,      \
                                                        const fixed_rows* x, __m512 (*v)[4], int* done) {     \
        for (int64_t q = 0; q < nb; q++) done[q] = row_fixed_avx512(K, MM, GS, V, w, r0 + q, x, v[q]);       \
    }
#define FIXED_ROWS_GS(K, MM, V) FIXED_ROWS(K, MM, 32, V) FIXED_ROWS(K, MM, 64, V) FIXED_ROWS(K, MM, 128, V)
#define FIXED_ROWS_MM(K, V) FIXED_ROWS_GS(K, 1, V) FIXED_ROWS_GS(K, 2, V) FIXED_ROWS_GS(K, 3, V) FIXED_ROWS_GS(K, 4, V)
FIXED_ROWS_MM(K_Q4, FIXED_PLAIN)
FIXED_ROWS_MM(K_Q4, FIXED_VNNI)
FIXED_ROWS_MM(K_Q4, FIXED_GFNI)
FIXED_ROWS_MM(K_Q8, FIXED_PLAIN)
FIXED_ROWS_MM(K_Q8, FIXED_VNNI)
#define FIXED_ENTRY_GS(K, MM, V) {fixed_rows_##K##_##MM##_32_##V, fixed_rows_##K##_##MM##_64_##V, fixed_rows_##K##_##MM##_128_##V}
#define FIXED_ENTRY_MM(K, V) {FIXED_ENTRY_GS(K, 1, V), FIXED_ENTRY_GS(K, 2, V), FIXED_ENTRY_GS(K, 3, V), FIXED_ENTRY_GS(K, 4, V)}
// [4-bit, 8-bit][level][activation rows - 1][group size 32, 64, 128]; 8-bit codes have
// no use for GFNI.
static fixed_rows_fn* const fixed_rows_table[2][3][4][3] = {
    {FIXED_ENTRY_MM(K_Q4, FIXED_PLAIN), FIXED_ENTRY_MM(K_Q4, FIXED_VNNI), FIXED_ENTRY_MM(K_Q4, FIXED_GFNI)},
    {FIXED_ENTRY_MM(K_Q8, FIXED_PLAIN), FIXED_ENTRY_MM(K_Q8, FIXED_VNNI), FIXED_ENTRY_MM(K_Q8, FIXED_VNNI)},
};

// The fixed-point product for K_Q4 and K_Q8, four activation rows at a time; 0
// (nothing done) for other kinds, rows with too many groups, activations that are not all
// finite or scratch that cannot be allocated: the float product then serves. A weight row
// whose scales underflow against these activations takes the float row.
static T512 int matmul_fixed_avx512(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                                    int64_t row0, float* c, int64_t ldc) {
    const int kind = kernel_kind(w);
    const int gsi = w->group_size == 32 ? 0 : w->group_size == 64 ? 1 : w->group_size == 128 ? 2 : -1;
    if ((kind != K_Q4 && kind != K_Q8) || gsi < 0) return 0;
    const int64_t cols = w->cols, groups = cols / w->group_size;
    if (groups > FIXED_MAX_GROUPS) return 0;
    const int isa = moe_cpu_isa_level();
    const int level = isa == MOE_CPU_ISA_AVX512_GFNI ? FIXED_GFNI : isa == MOE_CPU_ISA_AVX512_VNNI ? FIXED_VNNI : FIXED_PLAIN;
    const int64_t rows = MIN(m, 4), code_bytes = kind == K_Q4 ? 3 * cols : 4 * cols;
    uint8_t* scratch = fixed_scratch_take((size_t)rows * (code_bytes + 8 * groups));
    if (scratch == NULL) return 0;
    float* scales = (float*)(scratch + rows * code_bytes);
    const fixed_rows x = {(int16_t*)scratch, (int16_t*)scratch + rows * cols, (int8_t*)scratch, scales,
                          scales + rows * groups};
    for (int64_t i0 = 0; i0 < m; i0 += 4) {
        const int mm = (int)MIN(4, m - i0);
        if (!prepare_fixed_avx512(kind, mm, a + i0 * lda, lda, cols, w->group_size, &x)) return 0;
        fixed_rows_fn* const rows_fn = fixed_rows_table[kind == K_Q8][level][mm - 1][gsi];
        for (int64_t j = 0; j < n; j += 4) {
            const int64_t nb = MIN(4, n - j);
            __m512 v[4][4];  // [weight row][activation row]
            int done[4];
            rows_fn(w, row0 + j, nb, &x, v, done);
            for (int i = 0; i < mm; i++) {
                float* ci = c + (i0 + i) * ldc + j;
                if (nb == 4) {
                    _mm_storeu_ps(ci, sum_lanes4(v[0][i], v[1][i], v[2][i], v[3][i]));
                } else {
                    for (int64_t q = 0; q < nb; q++) ci[q] = sum_lanes(v[q][i]);
                }
            }
            for (int64_t q = 0; q < nb; q++)
                if (!done[q]) row_float_avx512(kind, mm, w, row0 + j + q, a + i0 * lda, lda, c + i0 * ldc + j + q, ldc);
        }
    }
    return 1;
}

// One chunk stored as floats (the tile dequantization of prefill).
INLINE T512 void store_chunk_avx512(const int kind, const moe_cpu_matrix* w, const group_cursor* gc, int64_t r,
                                    const segment_params* p, int64_t seg, int64_t k0, float* o) {
    __m512 v[2];
    unpack_avx512(kind, w, gc, r, p, seg, k0, v);
    _mm512_storeu_ps(o, v[0]);
    _mm512_storeu_ps(o + 16, v[1]);
}

DEFINE_DRIVERS(avx512, T512, 0)

// ---- AVX2 + FMA + F16C --------------------------------------------------------------
#define T256 __attribute__((target("avx2,fma,f16c")))

// Chunk -> v[0..3] (8 elements each), scale and bias applied.
INLINE T256 void unpack_avx2(const int kind, const moe_cpu_matrix* w, const group_cursor* gc, int64_t r,
                             const segment_params* p, int64_t seg, int64_t k0, __m256* v) {
    const uint8_t* row = row_data(w, r);
    if (kind == K_F32) {
        for (int q = 0; q < 4; q++) v[q] = _mm256_loadu_ps((const float*)row + k0 + 8 * q);
        return;
    }
    if (kind == K_F16) {
        const __m128i* p = (const __m128i*)(row + 2 * k0);
        for (int q = 0; q < 4; q++) v[q] = _mm256_cvtph_ps(_mm_loadu_si128(p + q));
        return;
    }
    if (kind == K_BF16) {
        const __m128i* p = (const __m128i*)(row + 2 * k0);
        for (int q = 0; q < 4; q++)
            v[q] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p + q)), 16));
        return;
    }
    if (kind == K_AFFINE_ANY) {
        float tmp[CHUNK];
        unpack_chunk_portable(w, gc, r, k0, tmp);
        for (int q = 0; q < 4; q++) v[q] = _mm256_loadu_ps(tmp + 8 * q);
        return;
    }
    const int64_t g = (k0 - seg) >> gc->shift;
    const float s = p->s[g], b = kind == K_MXFP4 ? 0.0f : p->b[g];
    __m128i e[4];  // 8 codes each, one byte per code, in the low 8 bytes
    if (kind == K_Q8) {
        for (int q = 0; q < 4; q++) e[q] = _mm_loadl_epi64((const __m128i*)(row + k0 + 8 * q));
    } else {  // split layout: low nibbles are elements 0-15, high nibbles 16-31
        const __m128i x = _mm_loadu_si128((const __m128i*)(row + (k0 >> 1)));
        const __m128i mask = _mm_set1_epi8(0x0f);
        const __m128i lo = _mm_and_si128(x, mask), hi = _mm_and_si128(_mm_srli_epi16(x, 4), mask);
        e[0] = lo;
        e[1] = _mm_srli_si128(lo, 8);
        e[2] = hi;
        e[3] = _mm_srli_si128(hi, 8);
    }
    if (kind == K_MXFP4) {
        const __m256 magnitudes = _mm256_loadu_ps(e2m1_values), scale = _mm256_set1_ps(s);
        for (int q = 0; q < 4; q++) {
            const __m256i code = _mm256_cvtepu8_epi32(e[q]);
            const __m256 mag = _mm256_permutevar8x32_ps(magnitudes, _mm256_and_si256(code, _mm256_set1_epi32(7)));
            const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(8)), 28);
            v[q] = _mm256_mul_ps(_mm256_xor_ps(mag, _mm256_castsi256_ps(sign)), scale);
        }
    } else {
        const __m256 scale = _mm256_set1_ps(s), bias = _mm256_set1_ps(b);
        for (int q = 0; q < 4; q++)
            v[q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e[q])), scale, bias);
    }
}

INLINE T256 float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE T256 void row_avx2(const int kind, const int MM, const moe_cpu_matrix* w, int64_t r,
                          const float* a, int64_t lda, float* c, int64_t ldc) {
    const int64_t cols = w->cols, kv = chunked_cols(w);
    const group_cursor gc = w->group_size > 0 ? group_cursor_for(w, r) : (group_cursor){0};
    __m256 acc[4][2];
    for (int i = 0; i < MM; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    segment_params p;
    for (int64_t seg = 0; seg < kv;) {
        const int64_t end = load_segment(&gc, is_dense(kind), seg, kv, &p);
        for (int64_t k0 = seg; k0 < end; k0 += CHUNK) {
            __m256 v[4];
            unpack_avx2(kind, w, &gc, r, &p, seg, k0, v);
            for (int i = 0; i < MM; i++) {
                const float* x = a + i * lda + k0;
                for (int q = 0; q < 4; q++)
                    acc[i][q & 1] = _mm256_fmadd_ps(v[q], _mm256_loadu_ps(x + 8 * q), acc[i][q & 1]);
            }
        }
        seg = end;
    }
    for (int i = 0; i < MM; i++) {
        float s = hsum256(_mm256_add_ps(acc[i][0], acc[i][1]));
        for (int64_t x = kv; x < cols; x++) s += dense_element(w, r, x) * a[i * lda + x];
        c[i * ldc] = s;
    }
}

INLINE T256 void store_chunk_avx2(const int kind, const moe_cpu_matrix* w, const group_cursor* gc, int64_t r,
                                  const segment_params* p, int64_t seg, int64_t k0, float* o) {
    __m256 v[4];
    unpack_avx2(kind, w, gc, r, p, seg, k0, v);
    for (int q = 0; q < 4; q++) _mm256_storeu_ps(o + 8 * q, v[q]);
}

// The factored affine row of row_affine_avx512, 8 lanes wide.
INLINE T256 void row_affine_avx2(const int kind, const int MM, const int GS, const moe_cpu_matrix* w, int64_t r,
                                 const float* a, int64_t lda, const float* xsum, float* c, int64_t ldc) {
    const int64_t cols = w->cols, gs = GS ? GS : w->group_size, groups = cols / gs;
    const group_cursor gc = group_cursor_for(w, r);
    const uint8_t* row = row_data(w, r);
    float scales[FACTORED_SUMS / 4];
    for (int64_t g = 0; g < groups; g++) scales[g] = scalar_at_f16c(gc.scales, gc.type, g);
    __m256 total[4][2];
    for (int i = 0; i < MM; i++) total[i][0] = total[i][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const int64_t k0 = g * gs;
        if (kind == K_Q4) _mm_prefetch((const char*)row + (k0 >> 1) + CODE_PREFETCH, _MM_HINT_T0);
        __m256 acc[4][2];
        for (int i = 0; i < MM; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        for (int64_t k = k0; k < k0 + gs; k += CHUNK) {
            __m256 v[4];
            if (kind == K_Q4) {
                // Split layout: widening 8 bytes gives elements j (low nibbles) and j + 16
                // (high nibbles) of 8 lanes at once, one mask or shift apart.
                for (int h = 0; h < 2; h++) {
                    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(row + (k >> 1) + 8 * h)));
                    v[h] = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
                    v[2 + h] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
                }
            } else {
                for (int q = 0; q < 4; q++)
                    v[q] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(row + k + 8 * q))));
            }
            for (int q = 0; q < 4; q++)
                for (int i = 0; i < MM; i++)
                    acc[i][q & 1] = _mm256_fmadd_ps(v[q], _mm256_loadu_ps(a + i * lda + k + 8 * q), acc[i][q & 1]);
        }
        const __m256 scale = _mm256_set1_ps(scales[g]);
        for (int i = 0; i < MM; i++) {
            total[i][0] = _mm256_fmadd_ps(acc[i][0], scale, total[i][0]);
            total[i][1] = _mm256_fmadd_ps(acc[i][1], scale, total[i][1]);
        }
    }
    for (int i = 0; i < MM; i++) {
        float s = hsum256(_mm256_add_ps(total[i][0], total[i][1]));
        for (int64_t g = 0; g < groups; g++) s += scalar_at_f16c(gc.biases, gc.type, g) * xsum[i * groups + g];
        c[i * ldc] = s;
    }
}

// No fixed-point product on AVX2 yet: the float factored row serves.
INLINE int matmul_fixed_avx2(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w, int64_t row0,
                             float* c, int64_t ldc) {
    (void)m, (void)n, (void)a, (void)lda, (void)w, (void)row0, (void)c, (void)ldc;
    return 0;
}

DEFINE_DRIVERS(avx2, T256, 1)


// Dense rows take the 256-bit kernels on AVX-512 machines too. These products only stream
// memory (from L2 the 512-bit row is several times faster than DRAM delivers), and
// streaming from DRAM is what 512-bit code did worse on the Zen 4 machines this was
// measured on (docs/cpu-backend.md).
void moe_cpu_matmul_formatted(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                              int64_t row0, float* c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    const int level = moe_cpu_isa_level();
    switch (level >= MOE_CPU_ISA_AVX512 && is_dense(kernel_kind(w)) ? MOE_CPU_ISA_AVX2 : level) {
    case MOE_CPU_ISA_AVX512_GFNI:
    case MOE_CPU_ISA_AVX512_VNNI:
    case MOE_CPU_ISA_AVX512: matmul_avx512(m, n, a, lda, w, row0, c, ldc); break;
    case MOE_CPU_ISA_AVX2: matmul_avx2(m, n, a, lda, w, row0, c, ldc); break;
    default: matmul_portable(m, n, a, lda, w, row0, c, ldc); break;
    }
}

void moe_cpu_dequantize_rows(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out) {
    if (rows <= 0) return;
    switch (moe_cpu_isa_level()) {
    case MOE_CPU_ISA_AVX512_GFNI:
    case MOE_CPU_ISA_AVX512_VNNI:
    case MOE_CPU_ISA_AVX512: dequantize_avx512(w, row0, rows, out); break;
    case MOE_CPU_ISA_AVX2: dequantize_avx2(w, row0, rows, out); break;
    default: dequantize_rows_portable(w, row0, rows, out); break;
    }
}

#else

void moe_cpu_matmul_formatted(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                              int64_t row0, float* c, int64_t ldc) {
    if (m > 0 && n > 0) matmul_portable(m, n, a, lda, w, row0, c, ldc);
}

void moe_cpu_dequantize_rows(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out) {
    if (rows > 0) dequantize_rows_portable(w, row0, rows, out);
}

#endif
