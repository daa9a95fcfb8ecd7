// ggml's block quantizations (MOE_FORMAT_GGML_*): each block decoded as ggml's own
// dequantization does it, in float32 and in ggml's order of operations, so every element
// is bit for bit ggml's value (python/moe_swift/ggml_blocks.py is the same in NumPy).
// Portable C: every ggml row runs here; the vector files take over the common types'
// decode products where they have them.
#include "internal.h"

enum { QK_K = 256 };

static const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// E2M1 doubled: ggml halves the E8M0 scale instead (ggml_e8m0_to_fp32_half).
static const int8_t mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

INLINE float half_at(const uint8_t* b) { return f16_to_float(load_u16(b, 0)); }

// 2^(e - 128); e < 2 are float32 subnormals, and 255 is 2^127 (ggml has no NaN scale).
INLINE float e8m0_half(uint8_t e) { return from_bits(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23); }

// Q3_K's sixteen 6-bit scales (before the - 32): low nibbles of bytes 0-7 then their high
// nibbles, each with a bit pair of bytes 8-11 on top.
INLINE void q3k_scales(const uint8_t* s, int out[16]) {
    for (int j = 0; j < 16; j++) {
        const int low = j < 8 ? s[j] & 0x0f : s[j - 8] >> 4;
        out[j] = (low | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
    }
}

// Elements of the 32-element types whose nibbles are split: low nibble of byte j is
// element j, high nibble element j + 16.
INLINE void decode_32(int format, const uint8_t* b, float* y) {
    switch (format) {
    case MOE_FORMAT_GGML_Q4_0: {
        const float d = half_at(b);
        for (int j = 0; j < 16; j++) {
            y[j] = ((b[2 + j] & 0x0f) - 8) * d;
            y[j + 16] = ((b[2 + j] >> 4) - 8) * d;
        }
        return;
    }
    case MOE_FORMAT_GGML_Q4_1: {
        const float d = half_at(b), m = half_at(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = (b[4 + j] & 0x0f) * d + m;
            y[j + 16] = (b[4 + j] >> 4) * d + m;
        }
        return;
    }
    case MOE_FORMAT_GGML_Q5_0: {
        const float d = half_at(b);
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        for (int j = 0; j < 16; j++) {
            const int x0 = ((b[6 + j] & 0x0f) | (((qh >> j) << 4) & 0x10)) - 16;
            const int x1 = ((b[6 + j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
            y[j] = x0 * d;
            y[j + 16] = x1 * d;
        }
        return;
    }
    case MOE_FORMAT_GGML_Q5_1: {
        const float d = half_at(b), m = half_at(b + 2);
        uint32_t qh;
        memcpy(&qh, b + 4, 4);
        for (int j = 0; j < 16; j++) {
            const int x0 = (b[8 + j] & 0x0f) | (((qh >> j) << 4) & 0x10);
            const int x1 = (b[8 + j] >> 4) | ((qh >> (j + 12)) & 0x10);
            y[j] = x0 * d + m;
            y[j + 16] = x1 * d + m;
        }
        return;
    }
    case MOE_FORMAT_GGML_Q8_0: {
        const float d = half_at(b);
        for (int j = 0; j < 32; j++) y[j] = (int8_t)b[2 + j] * d;
        return;
    }
    case MOE_FORMAT_GGML_IQ4_NL: {
        const float d = half_at(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * iq4nl_values[b[2 + j] & 0x0f];
            y[j + 16] = d * iq4nl_values[b[2 + j] >> 4];
        }
        return;
    }
    case MOE_FORMAT_GGML_MXFP4: {
        const float d = e8m0_half(b[0]);
        for (int j = 0; j < 16; j++) {
            y[j] = mxfp4_values[b[1 + j] & 0x0f] * d;
            y[j + 16] = mxfp4_values[b[1 + j] >> 4] * d;
        }
        return;
    }
    }
}

INLINE void decode_q2_k(const uint8_t* b, float* y) {
    const uint8_t *sc = b, *q = b + 16;
    const float d = half_at(b + 80), dmin = half_at(b + 82);
    int is = 0;
    for (int n = 0; n < QK_K; n += 128, q += 32)
        for (int shift = 0; shift < 8; shift += 2)
            for (int half = 0; half < 2; half++, is++) {
                const float dl = d * (sc[is] & 0x0f), ml = dmin * (sc[is] >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * ((q[l + 16 * half] >> shift) & 3) - ml;
            }
}

INLINE void decode_q3_k(const uint8_t* b, float* y) {
    const uint8_t *hm = b, *q = b + 32;
    int scales[16];
    q3k_scales(b + 96, scales);
    const float d = half_at(b + 108);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < QK_K; n += 128, q += 32)
        for (int shift = 0; shift < 8; shift += 2, m <<= 1)
            for (int half = 0; half < 2; half++, is++) {
                const float dl = d * scales[is];
                for (int l = 16 * half; l < 16 * half + 16; l++)
                    *y++ = dl * (((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
            }
}

// Q4_K and Q5_K (qh NULL for Q4_K): 64 elements per 32 code bytes, low nibbles first.
INLINE void decode_q45_k(const uint8_t* b, const uint8_t* qh, const uint8_t* q, float* y) {
    const float d = half_at(b), dmin = half_at(b + 2);
    for (int j = 0; j < 4; j++, q += 32) {
        int sc, m;
        k_scale_min(2 * j, b + 4, &sc, &m);
        const float d1 = d * sc, m1 = dmin * m;
        k_scale_min(2 * j + 1, b + 4, &sc, &m);
        const float d2 = d * sc, m2 = dmin * m;
        for (int l = 0; l < 32; l++) {
            const int high = qh ? ((qh[l] >> (2 * j)) & 1) << 4 : 0;
            *y++ = d1 * ((q[l] & 0x0f) + high) - m1;
        }
        for (int l = 0; l < 32; l++) {
            const int high = qh ? ((qh[l] >> (2 * j + 1)) & 1) << 4 : 0;
            *y++ = d2 * ((q[l] >> 4) + high) - m2;
        }
    }
}

INLINE void decode_q6_k(const uint8_t* b, float* y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t* sc = (const int8_t*)(b + 192);
    const float d = half_at(b + 208);
    for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[is + 0] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
}

INLINE void decode_iq4_xs(const uint8_t* b, float* y) {
    const float d = half_at(b);
    const uint16_t high = load_u16(b + 2, 0);
    const uint8_t* q = b + 8;
    for (int ib = 0; ib < 8; ib++, q += 16, y += 32) {
        const int ls = iq4_xs_scale(b, high, ib);
        const float dl = d * (ls - 32);
        for (int j = 0; j < 16; j++) {
            y[j] = dl * iq4nl_values[q[j] & 0x0f];
            y[j + 16] = dl * iq4nl_values[q[j] >> 4];
        }
    }
}

void moe_cpu_ggml_decode_block(int format, const uint8_t* b, float* y) {
    switch (format) {
    case MOE_FORMAT_GGML_Q2_K: decode_q2_k(b, y); return;
    case MOE_FORMAT_GGML_Q3_K: decode_q3_k(b, y); return;
    case MOE_FORMAT_GGML_Q4_K: decode_q45_k(b, 0, b + 16, y); return;
    case MOE_FORMAT_GGML_Q5_K: decode_q45_k(b, b + 16, b + 48, y); return;
    case MOE_FORMAT_GGML_Q6_K: decode_q6_k(b, y); return;
    case MOE_FORMAT_GGML_IQ4_XS: decode_iq4_xs(b, y); return;
    default: decode_32(format, b, y); return;
    }
}

void moe_cpu_ggml_dequantize_rows(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out) {
    const ggml_block_shape s = ggml_block_shape_of(w->format);
    const int64_t blocks = w->cols / s.elems;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t* row = row_data(w, row0 + r);
        for (int64_t k = 0; k < blocks; k++)
            moe_cpu_ggml_decode_block(w->format, row + k * s.bytes, out + r * w->cols + k * s.elems);
    }
}

// Each block decoded once into floats, then multiplied with every activation row: the
// block's sum is formed on its own and added to the row's, so the order is fixed by the
// format and cols only.
void moe_cpu_ggml_matmul_portable(int64_t m, int64_t n, const float* a, int64_t lda, const moe_cpu_matrix* w,
                                  int64_t row0, float* c, int64_t ldc) {
    const ggml_block_shape s = ggml_block_shape_of(w->format);
    const int64_t blocks = w->cols / s.elems;
    float y[QK_K];
    for (int64_t j = 0; j < n; j++) {
        const uint8_t* row = row_data(w, row0 + j);
        for (int64_t i = 0; i < m; i++) c[i * ldc + j] = 0.0f;
        for (int64_t k = 0; k < blocks; k++) {
            moe_cpu_ggml_decode_block(w->format, row + k * s.bytes, y);
            for (int64_t i = 0; i < m; i++) {
                const float* x = a + i * lda + k * s.elems;
                float sum = 0.0f;
                for (int q = 0; q < s.elems; q++) sum += y[q] * x[q];
                c[i * ldc + j] += sum;
            }
        }
    }
}
