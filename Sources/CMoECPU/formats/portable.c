// The format kernels for any CPU (moe_cpu_formats.h): what runs without AVX2. Plain C,
// one chunk of 32 elements at a time through internal.h's unpack_chunk_portable.
#include "internal.h"

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

void moe_cpu_dequantize_rows_portable(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out) {
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

const moe_cpu_format_kernels moe_cpu_formats_portable = {matmul_portable, moe_cpu_dequantize_rows_portable};
