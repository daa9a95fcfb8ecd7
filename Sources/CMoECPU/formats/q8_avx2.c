// Decode products against 8-bit activations (moe_cpu_matmul_q8) with AVX2: each weight
// block's codes meet the activation block's codes in integers, as ggml's dot products
// do. Per 32 elements, vpmaddubsw multiplies unsigned by signed bytes into pairs of
// int16 and vpmaddwd sums them into int32; signed weight codes go through the sign trick
// (|w| times x with w's sign), whose int16 pairs stay below 2 * 128 * 127 < 2^15, and the
// unsigned codes here are at most 6 bits (63 * 127 * 2 < 2^15). Affine 8-bit codes
// (0-255, whose pairs could reach 255 * 127 * 2 and saturate) are taken as q - 128 with
// 128 * scale moved into the bias. The block's int32 sum is exact; it is converted to float
// and scaled by d_w * d_x once per 32 elements (each activation block has its own d; the
// K-quants take their d_w once per 256, below).
// Terms of a weight's offset (affine biases, K-quants' minimums) multiply the activation
// block's sum d_x * sum q_x.
#include "ggml_avx2_blocks.h"

#include <stdlib.h>

#ifdef MOE_CPU_FORMATS_X86

enum { Q8_ROWS = 4 };
// Bytes ahead of the weight block being read that a row prefetches.
enum { Q8_PREFETCH = 1024 };
// Bytes ahead of the K-quant block being read that its row prefetches: every line of the
// block there, as a block straddles lines (a Q4_K block spans 2.25 of them, Q6_K 3.3), so
// that one prefetch per block would leave most lines to the demand loads.
enum { K_PREFETCH = 2048 };

INLINE void prefetch_block(const uint8_t* p, const int bytes) {
    for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char*)p + K_PREFETCH + o, _MM_HINT_T0);
    _mm_prefetch((const char*)p + K_PREFETCH + bytes - 1, _MM_HINT_T0);
}

// sum over the block of w_i * x_i, w signed bytes (-128 included: |-128| reads as the
// unsigned 128 in vpmaddubsw), as 8 int32 lanes.
INLINE T256 __m256i dot_signed(__m256i w, __m256i x) {
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// The same for unsigned codes below 64.
INLINE T256 __m256i dot_unsigned(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

INLINE T256 float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

INLINE T256 __m256i load_x(const moe_cpu_q8_rows* a, int i, int64_t k) {
    return _mm256_loadu_si256((const __m256i*)(a->codes + i * a->stride + k));
}
// Element offsets are never negative: shifts, not the signed division's extra instructions.
INLINE float x_scale(const moe_cpu_q8_rows* a, int i, int64_t k) { return a->scales[(uint64_t)(i * a->stride + k) >> 5]; }
INLINE float x_sum(const moe_cpu_q8_rows* a, int i, int64_t k) { return a->sums[(uint64_t)(i * a->stride + k) >> 5]; }

// Our MLX mxfp4 (E8M0 scale per 32, 255 NaN) against doubled E2M1 codes: 2^(s - 128).
INLINE float e8m0_half_scale(uint8_t s) {
    if (s == 255) return NAN;
    return from_bits(s < 2 ? 0x00200000u << s : (uint32_t)(s - 1) << 23);
}

// Block-of-32 formats: the block at element k as signed codes (Q4_0: unsigned, 0-15, see
// eights), its scale d and the bias b that multiplies the activation block's sum (0 for
// all but affine).
INLINE T256 __m256i b32_codes(const int F, const int G64, const moe_cpu_matrix* w, const uint8_t* row,
                              const group_cursor* gc, int64_t k, float* d, float* b) {
    if (!G64) *b = 0.0f;
    switch (F) {
    case MOE_FORMAT_AFFINE: {
        const int64_t g = k >> gc->shift;
        if (!G64) *d = scalar_at_f16c(gc->scales, gc->type, g);
        if (w->bits == 8) {
            _mm_prefetch((const char*)row + k + Q8_PREFETCH, _MM_HINT_T0);
            if (!G64) *b = fmaf(128.0f, *d, scalar_at_f16c(gc->biases, gc->type, g));
            return _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(row + k)), _mm256_set1_epi8((char)0x80));
        }
        _mm_prefetch((const char*)row + ((uint64_t)k >> 1) + Q8_PREFETCH, _MM_HINT_T0);
        if (!G64) *b = scalar_at_f16c(gc->biases, gc->type, g);
        return split_nibbles(row + ((uint64_t)k >> 1));
    }
    case MOE_FORMAT_MXFP4:
        _mm_prefetch((const char*)row + ((uint64_t)k >> 1) + Q8_PREFETCH, _MM_HINT_T0);
        *d = e8m0_half_scale(gc->scales[k >> 5]);
        return lookup(mxfp4_table, split_nibbles(row + ((uint64_t)k >> 1)));
    case MOE_FORMAT_GGML_Q4_0: {
        const uint8_t* blk = row + ((uint64_t)k >> 5) * 18;
        _mm_prefetch((const char*)blk + Q8_PREFETCH, _MM_HINT_T0);
        *d = half_to_float(blk);
        return split_nibbles(blk + 2);
    }
    default: {
        const uint8_t* blk = row + ((uint64_t)k >> 5) * ggml_block_shape_of(F).bytes;
        _mm_prefetch((const char*)blk + Q8_PREFETCH, _MM_HINT_T0);
        return block32(F, blk, d);
    }
    }
}

// Two accumulators per activation row (even and odd blocks), so that consecutive blocks'
// multiply-adds do not wait on each other's latency. G64: affine groups of 64 or more,
// whose scale and bias the two blocks of a step share, converted once per group rather
// than once per block (their conversions cost as much as a block's integer products).
INLINE T256 void row_b32(const int F, const int MM, const int G64, const int EIGHTS, const moe_cpu_matrix* w, int64_t r,
                         const moe_cpu_q8_rows* a, const __m256i* eights, float* c, int64_t ldc) {
    const uint8_t* row = row_data(w, r);
    group_cursor gc = {0};
    if (F == MOE_FORMAT_AFFINE || F == MOE_FORMAT_MXFP4) gc = group_cursor_for(w, r);
    __m256 acc[2][Q8_ROWS];
    float bias[Q8_ROWS];
    for (int i = 0; i < MM; i++) acc[0][i] = acc[1][i] = _mm256_setzero_ps(), bias[i] = 0.0f;
    for (int64_t k0 = 0; k0 < w->cols; k0 += 64) {
        float dg = 0.0f, bg = 0.0f;
        if (G64) {
            const int64_t g = k0 >> gc.shift;
            dg = scalar_at_f16c(gc.scales, gc.type, g);
            const float b = scalar_at_f16c(gc.biases, gc.type, g);
            bg = w->bits == 8 ? fmaf(128.0f, dg, b) : b;
        }
#pragma clang loop unroll(full)
        for (int u = 0; u < 2; u++) {
            const int64_t k = k0 + 32 * u;
            if (u == 1 && k >= w->cols) break;
            float d = dg, b = bg;
            const __m256i codes = b32_codes(F, G64, w, row, &gc, k, &d, &b);
            for (int i = 0; i < MM; i++) {
                const __m256 s = _mm256_set1_ps(d * x_scale(a, i, k));
                const __m256i dot =
                    F != MOE_FORMAT_GGML_Q4_0 ? dot_signed(codes, load_x(a, i, k))
                    : EIGHTS ? _mm256_sub_epi32(dot_unsigned(codes, load_x(a, i, k)), eights[i * (w->cols >> 5) + (k >> 5)])
                             : dot_signed(_mm256_sub_epi8(codes, _mm256_set1_epi8(8)), load_x(a, i, k));
                acc[u][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, acc[u][i]);
                if (F == MOE_FORMAT_AFFINE) bias[i] = fmaf(b, x_sum(a, i, k), bias[i]);
            }
        }
    }
    for (int i = 0; i < MM; i++) c[i * ldc] = hsum8(_mm256_add_ps(acc[0][i], acc[1][i])) + bias[i];
}

// The K-quants' products: the weight's scales per 16 or 32 elements are small integers,
// applied in vpmaddwd (their products with the codes stay exact in the int32 lanes and in
// their conversion to float), picked for each 32 elements by one vpshufb shared by the
// activation rows; what stays per 32 elements in float is the activation block's scale,
// broadcast from memory (a load, not a shuffle), and the weight block's d multiplies the
// block's sum once per 256 elements. A block's eight multiply-adds per activation row go
// to K_CHAINS(MM) chains, enough independent ones in all (four cycles' latency each) that
// they do not wait on each other; more would take the registers the codes need.
// One weight row at a time: rows taken two or four together (sharing the activation's
// loads) were faster from L2 but slower from memory, whose prefetchers then follow as many
// interleaved streams.
#define K_CHAINS(MM) ((MM) >= 3 ? 1 : (MM) == 2 ? 2 : 4)

// The activation rows' block scales and sums, row by row (stride is a multiple of 32):
// block indices per row are then constants plus the loop's, not a multiply-shift each time.
typedef struct {
    const float* scales[Q8_ROWS];
    const float* sums[Q8_ROWS];
} x_blocks;

INLINE x_blocks x_blocks_of(const int MM, const moe_cpu_q8_rows* a) {
    x_blocks x;
    for (int i = 0; i < MM; i++) {
        x.scales[i] = a->scales + (uint64_t)(i * a->stride) / 32;
        x.sums[i] = a->sums + (uint64_t)(i * a->stride) / 32;
    }
    return x;
}

// t += the block's int32 lanes in float times the activation block's scale.
INLINE T256 __m256 add_scaled(__m256i dot, const float* x_scale, __m256 t) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(x_scale), t);
}

// acc[i] += d * (the sum of activation row i's chains).
INLINE T256 void add_chains(const int MM, __m256 t[][Q8_ROWS], __m256 d, __m256* acc) {
    const int CH = K_CHAINS(MM);
    for (int i = 0; i < MM; i++) {
        __m256 s = t[0][i];
        if (CH == 2) s = _mm256_add_ps(s, t[1][i]);
        if (CH == 4) s = _mm256_add_ps(_mm256_add_ps(s, t[1][i]), _mm256_add_ps(t[2][i], t[3][i]));
        acc[i] = _mm256_fmadd_ps(s, d, acc[i]);
    }
}

// The int16 lanes of `scales` that vpshufb picks for the pairs of block p: words p of
// each 128-bit lane.
INLINE T256 __m256i pick_words(__m256i scales, int p) {
    return _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(0x0100 + 0x0202 * p)));
}

// The eight 6-bit scales and minimums of a Q4_K / Q5_K block (k_scale_min's values) from
// its 12 bytes at q, as bytes: the bytes taken as three words, each byte lane of a word
// one sub-block, so that the eight unpackings are a few word operations together rather
// than a scalar loop (which cost as much as a block's integer products).
INLINE void k_scales_mins(const uint8_t* q, uint64_t* sc, uint64_t* m) {
    uint32_t w[3];
    memcpy(w, q, sizeof w);
    const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, top2 = 0x03030303u;
    // Sub-blocks 0-3: the low 6 bits of bytes 0-3 (scales) and 4-7 (minimums); 4-7: a
    // nibble of bytes 8-11 below the top two bits of bytes 0-3 (scales) and 4-7 (minimums).
    *sc = (uint64_t)((w[2] & low4) | ((w[0] >> 6) & top2) << 4) << 32 | (w[0] & low6);
    *m = (uint64_t)(((w[2] >> 4) & low4) | ((w[1] >> 6) & top2) << 4) << 32 | (w[1] & low6);
}

// Q4_K / Q5_K: sub-block j of 32 is (d * sc_j) * q - dmin * m_j, q unsigned; the pairs of
// q * x (below 2 * 31 * 127) times sc_j in vpmaddwd. The minimums' terms (lane j: sub-blocks
// j) multiply the activation blocks' sums d_x * sum q_x into the accumulator, whose lanes
// are summed at the end anyway.
INLINE T256 void row_q45_k(const int F, const int MM, const moe_cpu_matrix* w, int64_t r, const moe_cpu_q8_rows* a,
                           float* c, int64_t ldc) {
    const int bytes = ggml_block_shape_of(F).bytes, CH = K_CHAINS(MM);
    const uint8_t* b = row_data(w, r);
    const x_blocks x = x_blocks_of(MM, a);
    __m256 acc[Q8_ROWS];
    for (int i = 0; i < MM; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < w->cols; k += 256, b += bytes) {
        prefetch_block(b, bytes);
        uint64_t sc8, m8;
        k_scales_mins(b + 4, &sc8, &m8);
        // The scales as int16, all eight in each 128-bit lane.
        const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((int64_t)sc8)));
        const __m256 dm = _mm256_mul_ps(_mm256_set1_ps(half_to_float(b + 2)),
                                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((int64_t)m8))));
        __m256 t[4][Q8_ROWS];
        for (int u = 0; u < CH; u++)
            for (int i = 0; i < MM; i++) t[u][i] = _mm256_setzero_ps();
#pragma clang loop unroll(full)
        for (int sub = 0; sub < 8; sub++) {
            const __m256i codes = k_codes(F, b, sub), scale = pick_words(scales, sub);
            for (int i = 0; i < MM; i++) {
                const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, load_x(a, i, k + 32 * sub)), scale);
                t[sub % CH][i] = add_scaled(dot, x.scales[i] + (k >> 5) + sub, t[sub % CH][i]);
            }
        }
        add_chains(MM, t, _mm256_set1_ps(half_to_float(b)), acc);
        for (int i = 0; i < MM; i++) acc[i] = _mm256_fnmadd_ps(dm, _mm256_loadu_ps(x.sums[i] + (k >> 5)), acc[i]);
    }
    for (int i = 0; i < MM; i++) c[i * ldc] = hsum8(acc[i]);
}

// Q6_K: d * sc * (q - 32), a signed 8-bit scale per 16 elements. The codes stay unsigned
// (0-63: vpmaddubsw's pairs stay below 2 * 63 * 127 < 2^15) and the int16 pairs of each
// half of a 32-element block are weighted by their scale in vpmaddwd; the -32 is taken
// out once per block of 256 as -32 * sum_j sc_j * (the activation codes' sum over
// sub-block j of 16), those sums made once per call (sums16, one int16 per 16 elements),
// not once per weight row. Per 32 elements both parts are exact integers in float
// (|sum| < 2^24), so the integers are those of sc * (q - 32) * x.
INLINE T256 void row_q6_k(const int MM, const moe_cpu_matrix* w, int64_t r, const moe_cpu_q8_rows* a,
                          const int16_t* sums16, float* c, int64_t ldc) {
    const int CH = K_CHAINS(MM);
    const uint8_t* b = row_data(w, r);
    const int64_t per_row = w->cols >> 4;
    const x_blocks x = x_blocks_of(MM, a);
    // Scale bytes 0, 2, ..., 14 then 1, 3, ..., 15: the first and second halves' scales of
    // blocks 0-7 of 32.
    const __m128i halves = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    __m256 acc[Q8_ROWS];
    for (int i = 0; i < MM; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < w->cols; k += 256, b += 210) {
        prefetch_block(b, 210);
        const __m128i sc8 = _mm_loadu_si128((const __m128i*)(b + 192));
        // As int16: the first halves' scales in the low 128-bit lane, the second halves' in
        // the high one, so that block p's are words p of the lanes.
        const __m256i scales = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, halves));
        // -32 * sc_j in element order fits int16 (-4064 to 4096); lane j of its products
        // with the sums: block j's offset term, below 2 * 2032 * 4096 < 2^24.
        const __m256i offsets = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc8), 5));
        __m256 t[4][Q8_ROWS];
        for (int u = 1; u < CH; u++)
            for (int i = 0; i < MM; i++) t[u][i] = _mm256_setzero_ps();
        for (int i = 0; i < MM; i++) {
            const __m256i x16 = _mm256_loadu_si256((const __m256i*)(sums16 + i * per_row + (k >> 4)));
            t[0][i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(x16, offsets)),
                                    _mm256_loadu_ps(x.scales[i] + (k >> 5)));
        }
#pragma clang loop unroll(full)
        for (int half = 0; half < 2; half++) {
            __m256i q[4];
            q6_k_codes(b, half, q);
#pragma clang loop unroll(full)
            for (int p = 0; p < 4; p++) {
                const int blk = 4 * half + p;
                const __m256i scale = pick_words(scales, blk);
                for (int i = 0; i < MM; i++) {
                    const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(q[p], load_x(a, i, k + 32 * blk)), scale);
                    t[blk % CH][i] = add_scaled(dot, x.scales[i] + (k >> 5) + blk, t[blk % CH][i]);
                }
            }
        }
        add_chains(MM, t, _mm256_set1_ps(half_to_float(b + 208)), acc);
    }
    for (int i = 0; i < MM; i++) c[i * ldc] = hsum8(acc[i]);
}

// sums16[i * cols / 16 + g]: the sum of activation row i's codes g * 16 to g * 16 + 15
// (|sum| <= 16 * 127), for row_q6_k. vpsadbw sums unsigned bytes in eights: the codes
// biased by 128, and 16 * 128 taken off each pair of eights.
INLINE T256 void q8_sums16(int mm, const moe_cpu_q8_rows* a, int64_t cols, int16_t* sums16) {
    for (int i = 0; i < mm; i++)
        for (int64_t k = 0; k < cols; k += 32) {
            const __m256i eights =
                _mm256_sad_epu8(_mm256_xor_si256(load_x(a, i, k), _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
            const __m256i sixteens = _mm256_add_epi64(eights, _mm256_srli_si256(eights, 8));
            int16_t* out = sums16 + i * (cols >> 4) + (k >> 4);
            out[0] = (int16_t)(_mm256_extract_epi16(sixteens, 0) - 2048);
            out[1] = (int16_t)(_mm256_extract_epi16(sixteens, 8) - 2048);
        }
}

T256 int moe_cpu_q8_matmul_avx2(int64_t m, int64_t n, const moe_cpu_q8_rows* a, const moe_cpu_matrix* w,
                                int64_t row0, float* c, int64_t ldc) {
    if (!moe_cpu_q8_supported(w) || w->cols % 32) return 0;
    const int F = w->format;
    // Q4_0's codes are q - 8 with q unsigned: the sign trick's two extra instructions per
    // block become one subtraction of 8 * (the activation block's sums over each lane's
    // elements), computed once per call for all rows. The lanes' integers are the same.
    const int64_t blocks = w->cols >> 5;
    __m256i* eights = NULL;
    if (F == MOE_FORMAT_GGML_Q4_0) {
        // Without memory for them, the sign trick: the same integers.
        eights = aligned_alloc(32, (size_t)(MIN(m, Q8_ROWS) * blocks) * sizeof(__m256i));
    }
    int16_t* sums16 = NULL;
    if (F == MOE_FORMAT_GGML_Q6_K) {
        // Without memory for them, the float product of the grid values (the caller's).
        sums16 = malloc((size_t)(MIN(m, Q8_ROWS) * (w->cols >> 4)) * sizeof(int16_t));
        if (!sums16) return 0;
    }
    for (int64_t i0 = 0; i0 < m; i0 += Q8_ROWS) {
        const int mm = (int)MIN(Q8_ROWS, m - i0);
        const moe_cpu_q8_rows ai = {a->codes + i0 * a->stride, a->scales + i0 * a->stride / 32,
                                    a->sums + i0 * a->stride / 32, a->stride};
        float* ci = c + i0 * ldc;
        if (eights)
            for (int i = 0; i < mm; i++)
                for (int64_t b = 0; b < blocks; b++)
                    eights[i * blocks + b] = dot_unsigned(_mm256_set1_epi8(8), load_x(&ai, i, 32 * b));
        if (sums16) q8_sums16(mm, &ai, w->cols, sums16);
        const int g64 = F == MOE_FORMAT_AFFINE && w->group_size >= 64;
        for (int64_t j = 0; j < n; j++) {
#define B32_(FMT, MM)                                                                                             \
    if (g64) row_b32(FMT, MM, 1, 0, w, row0 + j, &ai, eights, ci + j, ldc);                                                   \
    else row_b32(FMT, MM, 0, 0, w, row0 + j, &ai, eights, ci + j, ldc);
#define ROW_(MM)                                                                                                  \
    switch (F) {                                                                                                  \
    case MOE_FORMAT_AFFINE: B32_(MOE_FORMAT_AFFINE, MM) break;                                                    \
    case MOE_FORMAT_MXFP4: row_b32(MOE_FORMAT_MXFP4, MM, 0, 0, w, row0 + j, &ai, eights, ci + j, ldc); break;              \
    case MOE_FORMAT_GGML_Q8_0: row_b32(MOE_FORMAT_GGML_Q8_0, MM, 0, 0, w, row0 + j, &ai, eights, ci + j, ldc); break;        \
    case MOE_FORMAT_GGML_Q4_0:                                                                                    \
        if (eights) row_b32(MOE_FORMAT_GGML_Q4_0, MM, 0, 1, w, row0 + j, &ai, eights, ci + j, ldc);              \
        else row_b32(MOE_FORMAT_GGML_Q4_0, MM, 0, 0, w, row0 + j, &ai, eights, ci + j, ldc);                     \
        break;                                                                                                    \
    case MOE_FORMAT_GGML_IQ4_NL: row_b32(MOE_FORMAT_GGML_IQ4_NL, MM, 0, 0, w, row0 + j, &ai, eights, ci + j, ldc); break;    \
    case MOE_FORMAT_GGML_MXFP4: row_b32(MOE_FORMAT_GGML_MXFP4, MM, 0, 0, w, row0 + j, &ai, eights, ci + j, ldc); break;      \
    case MOE_FORMAT_GGML_Q4_K: row_q45_k(MOE_FORMAT_GGML_Q4_K, MM, w, row0 + j, &ai, ci + j, ldc); break;         \
    case MOE_FORMAT_GGML_Q5_K: row_q45_k(MOE_FORMAT_GGML_Q5_K, MM, w, row0 + j, &ai, ci + j, ldc); break;         \
    default: row_q6_k(MM, w, row0 + j, &ai, sums16, ci + j, ldc); break;                                         \
    }
            ROWS_AS_CONSTANT(mm, ROW_)
#undef ROW_
#undef B32_
        }
    }
    free(eights);
    free(sums16);
    return 1;
}

#endif
