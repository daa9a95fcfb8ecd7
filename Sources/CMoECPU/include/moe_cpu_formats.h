/* Matrix products straight from the weight formats that checkpoints ship in: dense
 * float16 / bfloat16 and MLX's quantizations (affine 2-8 bit with per-group scale and
 * bias, mxfp4), never expanded to float32 in memory.
 *
 * Decode (few activation rows) multiplies with the weights dequantized in registers: a
 * weight byte is read from memory once and turned into floats right before its FMAs.
 * Prefill dequantizes a tile of rows into cache (moe_cpu_dequantize_rows) and hands it to
 * a float32 GEMM that reuses it for every activation row.
 *
 * Semantics (docs/formats.md, python/moe_swift/reference.py): element i of a row is
 *   dense:  the stored value;
 *   affine: scale[g] * q_i + bias[g], g = i / group_size, q_i the unsigned `bits`-bit
 *           integer at bits [i * bits, (i + 1) * bits) of the row's little-endian bit
 *           stream (MLX's packing; 3, 5 and 6 bits cross byte boundaries);
 *   mxfp4:  e2m1(code_i) * 2^(scale[g] - 127), g = i / 32, 4-bit codes lowest nibble
 *           first, scales E8M0 bytes (255 is NaN).
 * Dense formats multiply with 256-bit code even where AVX-512 exists: it streams memory
 * faster (formats/dispatch.c, moe_cpu_matmul_formatted).
 * Scale and bias products are single-rounded (fmaf), accumulation is float32. With
 * AVX-512, the decode products of affine 4- and 8-bit codes take the activations in a
 * per-group fixed point as fine as float32 and sum code products exactly in int32
 * (formats/avx512_fixed.c, docs/formats.md).
 */
#ifndef MOE_CPU_FORMATS_H
#define MOE_CPU_FORMATS_H

#include <stdint.h>

#include "moe_options.h"  /* moe_format, moe_dtype, the kernel specialisations */

/* A row-major matrix of `cols` columns in one format. Row r starts at
 * data + r * row_bytes, its scales at scales + r * (cols / group_size) scale elements, its
 * biases likewise. Quantized formats need cols % group_size == 0 and group_size % 32 == 0. */
typedef struct moe_cpu_matrix {
    int32_t format;        /* moe_format */
    int32_t bits;          /* affine: one of MOE_AFFINE_BITS_ROWS */
    int32_t group_size;    /* affine: one of MOE_AFFINE_GROUP_SIZE_ROWS; mxfp4: 32 */
    int32_t scale_type;    /* affine: moe_dtype of scales and biases */
    int32_t split_nibbles; /* 4-bit codes in the CPU layout (moe_cpu_split_nibbles) */
    int32_t _pad;
    int64_t cols;
    int64_t row_bytes;     /* bytes of one row of data */
    const void* data;
    const void* scales;
    const void* biases;    /* affine only */
} moe_cpu_matrix;

/* The CPU layout of 4-bit codes (affine 4-bit and mxfp4): in each 16-byte block (32
 * elements), byte j holds element j in its low nibble and element j + 16 in its high
 * nibble, so one widening load and one shift yield 32 codes in element order, where MLX's
 * order (elements 2j and 2j + 1 in byte j) would need two more shuffles per block.
 * Rewrites `bytes` (a multiple of 16) bytes of MLX-ordered codes from src into dst. */
__attribute__((visibility("hidden")))
void moe_cpu_split_nibbles(const uint8_t* src, uint8_t* dst, int64_t bytes);

/* out[r * cols + i] = element i of row row0 + r, for r < rows (float32). */
__attribute__((visibility("hidden")))
void moe_cpu_dequantize_rows(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out);

/* c[i * ldc + j] = sum_x a[i * lda + x] * W[row0 + j][x] for i < m, j < n, with the
 * weights dequantized in registers. Meant for small m (decode); each weight row is read
 * from memory once for all m rows. The summation order is fixed by (cols, format, the
 * instruction set), never by m or threads. */
__attribute__((visibility("hidden")))
void moe_cpu_matmul_formatted(int64_t m, int64_t n, const float* a, int64_t lda,
                              const moe_cpu_matrix* w, int64_t row0, float* c, int64_t ldc);

/* 8-bit activations (moe_options.h, MOE_ACTIVATION_QUANTIZATION_ROWS' Q8) of the n floats
 * of x: per block b of MOE_Q8_ACTIVATION_BLOCK elements (the last may be shorter), codes
 * q (int8, |q| <= 127) and the scale d[b], and the grid values d * q; a block with a
 * non-finite element gets d = NaN, codes 0 (grid NaN). Any output may be NULL; grid may
 * be x. */
__attribute__((visibility("hidden")))
void moe_cpu_q8_quantize(const float* x, int64_t n, int8_t* codes, float* scales, float* grid);

#endif
