// What the files of this folder share: the weight-format kernels of moe_cpu_formats.h,
// one file per instruction set, as ggml-cpu splits its kernels.
//
//   dispatch.c      moe_cpu_matmul_formatted / moe_cpu_dequantize_rows: picks a file's
//                   kernels by moe_cpu_isa_level()
//   portable.c      any CPU (its chunk unpacker, unpack_chunk_portable, is below: the
//                   vector files use it for the formats without a vector unpacker)
//   avx2.c          AVX2 + FMA + F16C
//   avx512.c        AVX-512 (F, BW, VL), float arithmetic
//   ggml.c          ggml's block formats: block decoders (ggml's dequantization) and the
//                   portable products
//   ggml_avx2.c     ggml's common block types' decode products and tiles with AVX2 (on
//                   AVX-512 machines too)
//   avx512_fixed.c  AVX-512 affine 4- and 8-bit codes against fixed-point activations,
//                   with VNNI and GFNI where the CPU has them (called by avx512.c)
//   avx2_fixed.c    the same for 4-bit codes with AVX2 (called by avx2.c)
//   fixed_scratch.c the per-thread scratch both prepare their activations in
//   q8.c            8-bit activations: the quantizer, and moe_cpu_matmul_q8's choice
//   q8_avx2.c       integer products of weight codes and 8-bit activations (AVX2)
//   ggml_avx2_blocks.h  ggml's block types unpacked with AVX2 (ggml_avx2.c, q8_avx2.c)
//   drivers.h       the loops over rows and activation rows of avx2.c and avx512.c,
//                   written once over each file's row kernels
//
// Every format is read 32 elements at a time ("a chunk": one group boundary never falls
// inside it, since group sizes are multiples of 32). Each instruction set has one
// unpacker per format that turns a chunk into float vectors; the drivers are written once
// and specialised per format by inlining with constant arguments, so no format branch is
// left in an inner loop. Formats without a vector unpacker (affine 2, 3, 5, 6 bits) go
// through the portable unpacker, still one chunk at a time.
//
// Internal to CMoECPU (not in include/, not part of any module).
#ifndef MOE_CPU_FORMATS_INTERNAL_H
#define MOE_CPU_FORMATS_INTERNAL_H

#include "moe_cpu_formats.h"
#include "moe_cpu_kernels.h"

#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define HIDDEN __attribute__((visibility("hidden")))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
enum { CHUNK = 32 };

// The kernels' kinds: the rows of MOE_SPECIALISATION_ROWS (moe_options.h), by short names.
// Affine 4 and 8 bits and mxfp4 have vector unpackers; every other affine width runs as
// K_AFFINE_ANY.
enum {
    K_F32 = MOE_SPECIALISATION_f32,
    K_F16 = MOE_SPECIALISATION_f16,
    K_BF16 = MOE_SPECIALISATION_bf16,
    K_Q4 = MOE_SPECIALISATION_q4,
    K_Q8 = MOE_SPECIALISATION_q8,
    K_MXFP4 = MOE_SPECIALISATION_mxfp4,
    K_AFFINE_ANY = MOE_SPECIALISATION_any
};

// The first row that takes w's format and bits. 4-bit codes need the CPU's nibble order
// (moe_cpu_split_nibbles) for their own kernels; in MLX's order they run as K_AFFINE_ANY.
static inline int kernel_kind(const moe_cpu_matrix* w) {
    int kind = K_AFFINE_ANY;
#define KIND_IF_(suffix, FORMAT, row_bits)                                                    \
    if (kind == K_AFFINE_ANY && w->format == MOE_FORMAT_##FORMAT && ((row_bits) == 0 || w->bits == (row_bits))) \
        kind = MOE_SPECIALISATION_##suffix;
    MOE_SPECIALISATION_ROWS(KIND_IF_)
#undef KIND_IF_
    if ((kind == K_Q4 || kind == K_MXFP4) && !w->split_nibbles) return K_AFFINE_ANY;
    return kind;
}

// ---- scalar conversions (portable) ------------------------------------------------

// Element i of a row or of scales that may sit at any byte offset: a checkpoint's tensors
// start wherever their file puts them (safetensors does not align them), and a misaligned
// typed load is undefined behaviour in C. memcpy compiles to the same single load.
INLINE uint16_t load_u16(const void* p, int64_t i) {
    uint16_t v;
    memcpy(&v, (const uint8_t*)p + 2 * i, 2);
    return v;
}

// IQ4_XS: the 6-bit scale (before ggml subtracts 32) of 32-element sub-block `sub` of the
// 256-element block at b, given `high`, the block's little-endian uint16 at byte 2: its
// low 4 bits are a nibble of bytes 4-7, its high 2 bits a bit pair of `high`.
INLINE int iq4_xs_scale(const uint8_t* b, uint16_t high, int sub) {
    return ((b[4 + sub / 2] >> (4 * (sub % 2))) & 0x0f) | (((high >> (2 * sub)) & 3) << 4);
}

INLINE float load_f32(const void* p, int64_t i) {
    float v;
    memcpy(&v, (const uint8_t*)p + 4 * i, 4);
    return v;
}

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
    case MOE_DTYPE_F16: return f16_to_float(load_u16(p, i));
    case MOE_DTYPE_BF16: return bf16_to_float(load_u16(p, i));
    default: return load_f32(p, i);
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
    c.mx = w->format == MOE_FORMAT_MXFP4;
    c.type = w->scale_type;
    const int64_t size = c.mx ? 1 : (c.type == MOE_DTYPE_F32 ? 4 : 2);
    c.scales = (const uint8_t*)w->scales + r * groups * size;
    c.biases = c.mx ? 0 : (const uint8_t*)w->biases + r * groups * size;
    return c;
}

// Dense rows may end in fewer than 32 elements.
INLINE float dense_element(const moe_cpu_matrix* w, int64_t r, int64_t i) {
    const uint8_t* row = row_data(w, r);
    switch (w->format) {
    case MOE_FORMAT_F16: return f16_to_float(load_u16(row, i));
    case MOE_FORMAT_BF16: return bf16_to_float(load_u16(row, i));
    default: return load_f32(row, i);
    }
}

INLINE int64_t chunked_cols(const moe_cpu_matrix* w) { return w->cols / CHUNK * CHUNK; }

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

// Elements [k0, k0 + 32) of row r as floats (any format): the portable kernels' unpacker,
// and the vector ones' for the formats without a vector unpacker. Static in every file
// that uses it, as when these files were one: an extern function would change the code
// compiled around its calls.
static __attribute__((unused)) void unpack_chunk_portable(const moe_cpu_matrix* w, const group_cursor* gc, int64_t r,
                                                          int64_t k0, float* out) {
    const uint8_t* row = row_data(w, r);
    switch (w->format) {
    case MOE_FORMAT_F32:
        memcpy(out, (const float*)row + k0, CHUNK * sizeof(float));
        return;
    case MOE_FORMAT_F16:
        for (int i = 0; i < CHUNK; i++) out[i] = f16_to_float(load_u16(row, k0 + i));
        return;
    case MOE_FORMAT_BF16:
        for (int i = 0; i < CHUNK; i++) out[i] = bf16_to_float(load_u16(row, k0 + i));
        return;
    case MOE_FORMAT_AFFINE: {
        float s, b;
        group_params(gc, k0, &s, &b);
        for (int i = 0; i < CHUNK; i++)
            out[i] = fmaf((float)code_at(w, row, w->bits, k0 + i), s, b);
        return;
    }
    case MOE_FORMAT_MXFP4: {
        float s, b;
        group_params(gc, k0, &s, &b);
        for (int i = 0; i < CHUNK; i++)
            out[i] = e2m1_values[code_at(w, row, 4, k0 + i)] * s;
        return;
    }
    }
}

INLINE int is_dense(int kind) { return kind == K_F32 || kind == K_F16 || kind == K_BF16; }
INLINE int64_t dense_bytes(int kind) { return kind == K_F32 ? 4 : 2; }

// ---- ggml's blocks (ggml.c) -----------------------------------------------------------

// Elements and bytes of one block of a ggml format (MOE_GGML_TYPE_ROWS); {0, 0} for the
// other formats (ggml's dense types are our dense formats, which have no blocks).
typedef struct {
    int elems;
    int bytes;
} ggml_block_shape;

INLINE ggml_block_shape ggml_block_shape_of(int format) {
#define GGML_SHAPE_IF_(FORMAT, type, elems, bytes) \
    if (format == MOE_FORMAT_##FORMAT && (elems) > 1) return (ggml_block_shape){(elems), (bytes)};
    MOE_GGML_TYPE_ROWS(GGML_SHAPE_IF_)
#undef GGML_SHAPE_IF_
    return (ggml_block_shape){0, 0};
}

INLINE int is_ggml(int format) { return ggml_block_shape_of(format).elems > 0; }

// The (scale, min) pair j of a Q4_K / Q5_K block's 12 scale bytes q: pairs 0-3 are 6-bit
// fields of bytes 0-7; pairs 4-7 take 4 low bits from bytes 8-11 and 2 high bits from the
// tops of bytes 0-7.
INLINE void k_scale_min(int j, const uint8_t* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// One block of `format` at b as its block_elems floats, ggml's values bit for bit.
HIDDEN void moe_cpu_ggml_decode_block(int format, const uint8_t* b, float* y);
HIDDEN void moe_cpu_ggml_dequantize_rows(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out);
HIDDEN void moe_cpu_ggml_matmul_portable(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                                         int64_t row0, float* c, int64_t ldc);
// ggml_avx2.c: rows of the types it has tiles for as floats (ggml's values); 0 for the others.
HIDDEN int moe_cpu_ggml_dequantize_avx2(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out);

// ---- what each instruction set's file provides --------------------------------------

// c[i * ldc + j] = row row0 + j of w . row i of a (moe_cpu_matmul_formatted).
typedef void moe_cpu_matmul_fn(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                               int64_t row0, float* c, int64_t ldc);
// Rows [row0, row0 + rows) of w as floats (moe_cpu_dequantize_rows).
typedef void moe_cpu_dequantize_fn(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out);

typedef struct {
    moe_cpu_matmul_fn* matmul;
    moe_cpu_dequantize_fn* dequantize;
} moe_cpu_format_kernels;

HIDDEN extern const moe_cpu_format_kernels moe_cpu_formats_portable;

HIDDEN void moe_cpu_dequantize_rows_portable(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out);

#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
#define MOE_CPU_FORMATS_X86 1
#include <immintrin.h>

HIDDEN extern const moe_cpu_format_kernels moe_cpu_formats_avx2;

// ggml_avx2.c: the decode product of ggml's common block types; 0 (nothing done) for the
// others, which ggml.c's portable product then serves.
HIDDEN int moe_cpu_ggml_matmul_avx2(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                                    int64_t row0, float* c, int64_t ldc);
HIDDEN extern const moe_cpu_format_kernels moe_cpu_formats_avx512;
// q8_avx2.c: moe_cpu_matmul_q8's integer products; 0 (nothing done) for other formats.
HIDDEN int moe_cpu_q8_matmul_avx2(int64_t m, int64_t n, const moe_cpu_q8_rows* a, const moe_cpu_matrix* w,
                                  int64_t row0, float* c, int64_t ldc);

#ifndef MOE_CPU_AVX512_EMULATED  // tests/c/avx512_emulated.h: SIMDe's intrinsics, no target
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
// The instruction set level MOE_CPU_ISA_AVX512_GFNI: VNNI and VBMI too.
#define T512Q8 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni,fma,f16c")))
#endif

// q8_avx512.c: moe_cpu_matmul_q8's products of the 4-bit formats decode reads most, at
// MOE_CPU_ISA_AVX512_GFNI; 0 (nothing done) for other formats.
HIDDEN T512Q8 int moe_cpu_q8_matmul_avx512(int64_t m, int64_t n, const moe_cpu_q8_rows* a, const moe_cpu_matrix* w,
                                           int64_t row0, float* c, int64_t ldc);

// avx512_fixed.c: the fixed-point product for K_Q4 and K_Q8; 0 (nothing done) where it
// does not apply, and the float product then serves.
HIDDEN T512 int moe_cpu_matmul_fixed_avx512(int64_t m, int64_t n, const float* a, int64_t lda,
                                            const moe_cpu_matrix* w, int64_t row0, float* c, int64_t ldc);
// avx512.c: the float row of any kind, for the rare rows the fixed-point product leaves.
HIDDEN T512 void moe_cpu_row_float_avx512(int kind, int mm, const moe_cpu_matrix* w, int64_t r, const float* a,
                                          int64_t lda, float* c, int64_t ldc);

// The 16 bits at p in lane 0 of a register, the others zero. Where only lane 0 is used,
// clang would load them with a vpinsrw into whatever register it picks, which ties the
// value to that register's last writer: in a block loop, a chain through the previous
// block's arithmetic. The empty asm keeps the vmovd, which writes a fresh register.
INLINE __m128i u16_in_fresh_register(const void* p) {
    __m128i h = _mm_cvtsi32_si128(load_u16(p, 0));
    __asm__("" : "+x"(h));
    return h;
}

// Group parameters with the hardware half conversion: the portable f16_to_float's
// branches cost more than a 4-bit chunk's unpacking.
INLINE __attribute__((target("f16c"))) float scalar_at_f16c(const void* p, int type, int64_t i) {
    switch (type) {
    case MOE_DTYPE_F16: return _mm_cvtss_f32(_mm_cvtph_ps(u16_in_fresh_register((const uint16_t*)p + i)));
    case MOE_DTYPE_BF16: return bf16_to_float(load_u16(p, i));
    default: return load_f32(p, i);
    }
}

// The fixed-point products of affine codes (avx512_fixed.c, avx2_fixed.c; the first
// explains the scheme): the activations' fixed-point scales, and the largest groups count a
// row may have.
enum { FIXED_ONE = 32767, FIXED_TOP = 8323072, FIXED_MAX_GROUPS = 1024 };

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

// Group g of activation row i, from its largest magnitude `top` and its sum: the scale
// d = top / top_code (one step of the fixed point), its reciprocal (0 for a zero group) and
// the sum; 0 if the group holds an infinity or a NaN (the row is then left to the float
// product). Max instructions drop a NaN operand (they return the second one), so a NaN
// shows in the sum, not always in `top`.
INLINE int fixed_group(const fixed_rows* out, float* inv, int64_t groups, int64_t i, int64_t g, float top,
                       float total, float top_code) {
    if (!(top <= 3.4028235e38f) || !(fabsf(total) <= 3.4028235e38f)) return 0;
    out->scale[i * groups + g] = top / top_code;
    inv[g] = top > 0 ? top_code / top : 0.0f;
    out->xsum[i * groups + g] = total;
    return 1;
}

// Element of the prepared order -> element of the row, per 16 elements.
INLINE int64_t fixed_source(const int kind, int64_t k, int64_t cols) {
    if (kind != K_Q4 || (k | 63) >= cols) return k;
    static const int8_t block16[4] = {0, 32, 16, 48};
    return (k & ~(int64_t)63) + block16[(k >> 4) & 3] + (k & 15);
}

// avx2_fixed.c: the fixed-point product for K_Q4; 0 (nothing done) where it does not
// apply, and the float product then serves. avx2.c: the float row of any kind, for the
// rare rows the fixed-point product leaves.
HIDDEN int moe_cpu_matmul_fixed_avx2(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                                     int64_t row0, float* c, int64_t ldc);
HIDDEN void moe_cpu_row_float_avx2(int kind, int mm, const moe_cpu_matrix* w, int64_t r, const float* a, int64_t lda,
                                   float* c, int64_t ldc);
// fixed_scratch.c: `bytes` of 64-byte-aligned scratch for this thread, kept between calls
// (a decode step makes a few hundred), or NULL if it cannot be allocated.
HIDDEN void* moe_cpu_fixed_scratch(size_t bytes);
// Activation rows prepared in the scratch: `rows` rows of `cols` floats in one product's
// layout (its FIXED_LAYOUT_*) for one group size, in a scratch laid out for `slots` rows
// (where each array starts). Compared as memory: no padding.
enum { FIXED_LAYOUT_AVX2_Q4 = 1, FIXED_LAYOUT_AVX512_Q4, FIXED_LAYOUT_AVX512_Q8 };
typedef struct {
    int64_t layout, group_size, slots, rows, cols;
} fixed_key;
// 1 if this thread's scratch holds the key's rows prepared from a's floats (rows lda
// apart), as the last preparation on this thread left them; the caller then skips it.
HIDDEN int moe_cpu_fixed_scratch_holds(const fixed_key* key, const float* a, int64_t lda);
// After preparing into the scratch: the key and a's floats that it now holds, or (key
// NULL) nothing, after a preparation that stopped part way.
HIDDEN void moe_cpu_fixed_scratch_prepared(const fixed_key* key, const float* a, int64_t lda);

#define T256 __attribute__((target("avx2,fma,f16c")))

// The sum of v's 8 lanes, in one fixed order (every AVX2 file's, so their results agree).
INLINE T256 float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// A row's n group scales or biases as floats, eight at a time (one conversion per group
// with a branch on the type cost a third of a 4-bit row's time); the AVX2 form of
// load_scalars below, reading exactly the n elements.
INLINE T256 void group_floats(const void* p, int type, int64_t n, float* out) {
    int64_t g = 0;
    for (; g + 8 <= n; g += 8) {
        __m256 v;
        switch (type) {
        case MOE_DTYPE_F16: v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)p + g))); break;
        case MOE_DTYPE_BF16:
            v = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)((const uint16_t*)p + g))), 16));
            break;
        default: v = _mm256_loadu_ps((const float*)p + g); break;
        }
        _mm256_storeu_ps(out + g, v);
    }
    for (; g < n; g++) out[g] = scalar_at_f16c(p, type, g);
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

// Bytes ahead of the 4-bit codes being read that a product prefetches.
enum { CODE_PREFETCH = 1024 };
// Bytes ahead of the weights being read that the decode products of wide elements (float32,
// float16 and bfloat16 rows, affine 8-bit codes) prefetch, every cache line: such rows
// stream so many bytes per multiply-add that the hardware prefetchers, which restart at
// each 4 KiB page, leave a core well short of its share of the bandwidth
// (docs/cpu-backend.md).
enum { WIDE_PREFETCH = 4096 };
// Floats of activation group sums a factored product keeps on the stack; a row may have
// at most FACTORED_SUMS / 4 groups.
enum { FACTORED_SUMS = 4096 };

// Scale or bias elements [g, g + n) as floats in the first n lanes (n <= 16), zeros in the
// others: masked loads, so short rows (a down projection's 12 groups) convert theirs in
// one step and nothing past the row is read.
INLINE __mmask16 first_lanes(int64_t n) { return (__mmask16)((1u << n) - 1u); }

INLINE T512 __m512 load_scalars(const void* p, int type, int64_t g, int64_t n) {
    const __mmask16 m = first_lanes(n);
    switch (type) {
    case MOE_DTYPE_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t*)p + g));
    case MOE_DTYPE_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t*)p + g)), 16));
    default: return _mm512_maskz_loadu_ps(m, (const float*)p + g);
    }
}

#endif

#endif
