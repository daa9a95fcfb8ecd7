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
// Terms of a weight's offset (affine biases; the minimums of Q4_1, Q5_1 and the K-quants;
// the offsets of unsigned codes: Q4_0's 8, Q5_0's 16, mxfp4's 12) multiply the activation
// block's sum d_x * sum q_x.
#include "ggml_avx2_blocks.h"

#include <stdlib.h>

#ifdef MOE_CPU_FORMATS_X86

enum { Q8_ROWS = 4 };
// Bytes ahead of the weight block being read that a row prefetches: one core's stream
// needs a few DRAM latencies' worth of bytes in flight for its reads to overlap its
// arithmetic (benchmarks/q8_stream.py measures the distances, setting MOE_Q8_PREFETCH).
#ifndef MOE_Q8_PREFETCH
#define MOE_Q8_PREFETCH 4096
#endif
enum { Q8_PREFETCH = MOE_Q8_PREFETCH };
// Every line of a block that straddles lines (a Q4_K block spans 2.25 of them, Q6_K 3.3):
// one prefetch per block would leave most lines to the demand loads.
INLINE void prefetch_block(const uint8_t* p, const int bytes) {
    for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char*)p + Q8_PREFETCH + o, _MM_HINT_T0);
    _mm_prefetch((const char*)p + Q8_PREFETCH + bytes - 1, _MM_HINT_T0);
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

INLINE T256 int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
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

// Block-of-32 formats: the block at element k as codes (signed, or Q4_1's and Q5_1's
// unsigned), its scale d and the bias b that multiplies the activation block's sum (0 for
// all but affine and ggml's minimums).
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
    default: {
        const uint8_t* blk = row + ((uint64_t)k >> 5) * ggml_block_shape_of(F).bytes;
        _mm_prefetch((const char*)blk + Q8_PREFETCH, _MM_HINT_T0);
        if (F == MOE_FORMAT_GGML_Q4_1 || F == MOE_FORMAT_GGML_Q5_1) *b = half_to_float(blk + 2);  // the minimum
        return block32(F, blk, d);
    }
    }
}

// One block at a time: our 8-bit affine codes. Two accumulators per activation row (even
// and odd blocks), so that consecutive blocks' multiply-adds do not wait on each other's
// latency. G64: affine groups of 64 or more, whose scale and bias the two blocks of a step
// share, converted once per group rather than once per block (their conversions cost as
// much as a block's integer products).
INLINE T256 void row_b32(const int F, const int MM, const int G64, const moe_cpu_matrix* w, int64_t r,
                         const moe_cpu_q8_rows* a, float* c, int64_t ldc) {
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
                const __m256i dot = dot_signed(codes, load_x(a, i, k));
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

// ---- ggml's 32-element blocks, eight at a time ------------------------------------------
// Per block, the scalar work around a block's integer products (its float16 scale
// converted, times the activation block's scale, broadcast) cost as much as the products.
// So the blocks of a row go eight at a time: their eight scales are gathered into one
// vector, converted and multiplied by the eight activation scales in one instruction each.
// Q8_0's factor then reaches each block's lanes with one permute. 4-bit blocks go in
// pairs: two blocks' 16 code bytes fill one register, whose low nibbles are elements 0-15
// of each and high nibbles 16-31, against the activation codes rearranged to match once
// per call (nibble_pair_x); two transposing additions leave one block's sum per lane, and
// one multiply-add per eight blocks applies their factors.

enum { OCTET = 8 * 32 };

// Lanes of block q (0-7) of an octet in Q8_0, and the blocks of a nibble octet's sums' lanes.
static const int32_t octet_lanes[8][8] __attribute__((aligned(32))) = {
    {0, 0, 0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1, 1, 1}, {2, 2, 2, 2, 2, 2, 2, 2}, {3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4}, {5, 5, 5, 5, 5, 5, 5, 5}, {6, 6, 6, 6, 6, 6, 6, 6}, {7, 7, 7, 7, 7, 7, 7, 7}};
static const int32_t pair_order[8] __attribute__((aligned(32))) = {0, 2, 4, 6, 1, 3, 5, 7};

// The scales of the eight blocks from b on (`bytes` apart): float16 ones through one
// conversion; ggml's mxfp4 E8M0 exponents as 2^(e - 128) (its doubled E2M1 codes), 255 NaN.
INLINE T256 __m256 octet_scales(const int F, const uint8_t* b, int bytes) {
    if (F == MOE_FORMAT_GGML_MXFP4) {
        uint64_t e = 0;
        for (int q = 0; q < 8; q++) e |= (uint64_t)b[q * bytes] << (8 * q);
        return e8m0_half_scales(_mm_cvtsi64_si128((long long)e));
    }
    // Inserted word by word (vpinsrw from memory): shifting and or-ing them into two
    // integers first took a third more of the octet's instructions (Q4_0 from L2: 8-14%).
    __m128i h = u16_in_fresh_register(b);
    h = _mm_insert_epi16(h, load_u16(b + bytes, 0), 1);
    h = _mm_insert_epi16(h, load_u16(b + 2 * bytes, 0), 2);
    h = _mm_insert_epi16(h, load_u16(b + 3 * bytes, 0), 3);
    h = _mm_insert_epi16(h, load_u16(b + 4 * bytes, 0), 4);
    h = _mm_insert_epi16(h, load_u16(b + 5 * bytes, 0), 5);
    h = _mm_insert_epi16(h, load_u16(b + 6 * bytes, 0), 6);
    h = _mm_insert_epi16(h, load_u16(b + 7 * bytes, 0), 7);
    return _mm256_cvtph_ps(h);
}

// Our affine scales or biases (one per group of 2^shift elements, 32 to 128) of octet o,
// one per block: the octet's groups are loaded (exactly their bytes: the array may end
// there) and spread over their blocks' lanes.
INLINE T256 __m256 group_octet(const uint8_t* p, int type, int shift, int64_t o) {
    const int groups = 8 >> (shift - 5);
    const int64_t g0 = (o * OCTET) >> shift;
    __m256 v;
    if (type == MOE_DTYPE_F32) {
        const float* f = (const float*)p + g0;
        v = groups == 8 ? _mm256_loadu_ps(f)
          : groups == 4 ? _mm256_castps128_ps256(_mm_loadu_ps(f))
                        : _mm256_castps128_ps256(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i*)f)));
    } else {
        const uint8_t* h = p + 2 * g0;
        const __m128i x = groups == 8 ? _mm_loadu_si128((const __m128i*)h)
                        : groups == 4 ? _mm_loadl_epi64((const __m128i*)h)
                                      : _mm_cvtsi32_si128((int)(load_u16(h, 0) | (uint32_t)load_u16(h, 1) << 16));
        v = type == MOE_DTYPE_F16 ? _mm256_cvtph_ps(x)
                                  : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
    }
    return _mm256_permutevar8x32_ps(v, _mm256_load_si256((const __m256i*)group_lanes[shift - 5]));
}

// The activation codes of each pair of blocks (2p, 2p + 1) as two registers: elements
// 0-15 of both blocks, then 16-31 of both, the order of a nibble pair's low and high codes.
static T256 void nibble_pair_x(int mm, const moe_cpu_q8_rows* a, int64_t pairs, __m256i* xp) {
    for (int i = 0; i < mm; i++)
        for (int64_t p = 0; p < pairs; p++) {
            const __m256i x0 = load_x(a, i, 64 * p), x1 = load_x(a, i, 64 * p + 32);
            xp[2 * (i * pairs + p)] = _mm256_permute2x128_si256(x0, x1, 0x20);
            xp[2 * (i * pairs + p) + 1] = _mm256_permute2x128_si256(x0, x1, 0x31);
        }
}

// Where a 32-element ggml block's 16 code bytes start.
INLINE int octet_code_offset(const int F) {
    switch (F) {
    case MOE_FORMAT_AFFINE: case MOE_FORMAT_MXFP4: return 0;
    case MOE_FORMAT_GGML_MXFP4: return 1;
    case MOE_FORMAT_GGML_Q4_1: return 4;
    case MOE_FORMAT_GGML_Q5_0: return 6;
    case MOE_FORMAT_GGML_Q5_1: case MOE_FORMAT_GGML_IQ4_XS: return 8;
    default: return 2;
    }
}

// Q5_0 / Q5_1: bit j of a block's 32-bit qh is bit 4 of element j. A nibble pair's low
// codes (elements 0-15 of blocks b0 and b1, one per 128-bit lane) take bits 0-15 (qh
// bytes 0 and 1), its high codes bits 16-31 (bytes 2 and 3).
INLINE T256 void fifth_bits(const uint8_t* qh0, const uint8_t* qh1, __m256i* lo, __m256i* hi) {
    uint32_t h0, h1;
    memcpy(&h0, qh0, 4);
    memcpy(&h1, qh1, 4);
    const __m256i qh = _mm256_set_m128i(_mm_cvtsi32_si128((int)h1), _mm_cvtsi32_si128((int)h0));
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    *lo = _mm256_or_si256(*lo, fifth_bit_values(qh, pick));
    *hi = _mm256_or_si256(*hi, fifth_bit_values(qh, _mm256_add_epi8(pick, _mm256_set1_epi8(2))));
}

// Row r of a 32-element block format against MM activation rows: ggml's Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1, IQ4_NL, IQ4_XS and mxfp4, and ours in 4 bits (affine, mxfp4; the CPU's
// nibble order, whose blocks of 16 bytes are a pair's 32 bytes). Whole octets here; the
// blocks after the last one (a row of 2880: two) one at a time.
INLINE T256 void row_octets(const int F, const int MM, const moe_cpu_matrix* w, int64_t r, const moe_cpu_q8_rows* a,
                            const __m256i* xp, int64_t pairs, float* c, int64_t ldc) {
    const int ours = F == MOE_FORMAT_AFFINE || F == MOE_FORMAT_MXFP4;
    // IQ4_XS: an octet is one 256-element block, iq4_nl's codes with a 6-bit scale per 32.
    const int xs = F == MOE_FORMAT_GGML_IQ4_XS;
    // Whose sub-blocks' 16 code bytes follow each other: a pair is 32 bytes at one place.
    const int contiguous = ours || xs;
    const int bytes = ours ? 16 : ggml_block_shape_of(F).bytes, head = octet_code_offset(F);
    const int octet_bytes = xs ? bytes : 8 * bytes;
    // Q4_1 and Q5_1 add a minimum m per block; Q5_0 and Q5_1 have a fifth bit per code.
    const int with_min = F == MOE_FORMAT_GGML_Q4_1 || F == MOE_FORMAT_GGML_Q5_1;
    const int five = F == MOE_FORMAT_GGML_Q5_0 || F == MOE_FORMAT_GGML_Q5_1;
    // The offset taken out of unsigned codes (Q4_0: q - 8, Q5_0: q - 16, mxfp4: table + 12),
    // times the activation blocks' sums; affine biases and ggml's minimums come in the same
    // way, with the sign of -1.
    const float offset = F == MOE_FORMAT_GGML_Q4_0 ? 8.0f
                       : F == MOE_FORMAT_GGML_Q5_0 ? 16.0f
                       : F == MOE_FORMAT_GGML_MXFP4 || F == MOE_FORMAT_MXFP4 ? 12.0f
                       : F == MOE_FORMAT_AFFINE || with_min ? -1.0f : 0.0f;
    const int mx = F == MOE_FORMAT_GGML_MXFP4 || F == MOE_FORMAT_MXFP4;
    const uint8_t* b = row_data(w, r);
    group_cursor gc = {0};
    if (ours) gc = group_cursor_for(w, r);
    const int64_t octets = w->cols / OCTET;
    const __m256i mask = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i table = mx ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)mxfp4_table_plus12))
                             : _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)iq4nl_table));
    __m256 acc[2][Q8_ROWS], sums[Q8_ROWS];
    for (int i = 0; i < MM; i++) acc[0][i] = acc[1][i] = sums[i] = _mm256_setzero_ps();
    for (int64_t o = 0; o < octets; o++, b += octet_bytes) {
        for (int l = 0; l < octet_bytes; l += 64) _mm_prefetch((const char*)b + Q8_PREFETCH + l, _MM_HINT_T0);
        __m256 dw, bw = _mm256_setzero_ps();
        if (F == MOE_FORMAT_AFFINE) {
            dw = group_octet(gc.scales, gc.type, gc.shift, o);
            bw = group_octet(gc.biases, gc.type, gc.shift, o);
        } else if (F == MOE_FORMAT_MXFP4) {
            uint64_t e;
            memcpy(&e, gc.scales + 8 * o, 8);
            dw = e8m0_half_scales(_mm_cvtsi64_si128((long long)e));
        } else if (xs) {
            dw = iq4_xs_factors(b);
        } else {
            dw = octet_scales(F, b, bytes);
            if (with_min) bw = octet_scales(MOE_FORMAT_GGML_Q4_1, b + 2, bytes);
        }
        __m256 ds[Q8_ROWS];
        for (int i = 0; i < MM; i++) {
            const uint64_t blk = (uint64_t)(i * a->stride + o * OCTET) >> 5;
            ds[i] = _mm256_mul_ps(dw, _mm256_loadu_ps(a->scales + blk));
            if (offset != 0.0f)
                sums[i] = _mm256_fmadd_ps(F == MOE_FORMAT_AFFINE || with_min ? bw : dw, _mm256_loadu_ps(a->sums + blk), sums[i]);
        }
        if (F == MOE_FORMAT_GGML_Q8_0) {
#pragma clang loop unroll(full)
            for (int q = 0; q < 8; q++) {
                const __m256i codes = _mm256_loadu_si256((const __m256i*)(b + q * bytes + head));
                const __m256i lanes = _mm256_load_si256((const __m256i*)octet_lanes[q]);
                for (int i = 0; i < MM; i++) {
                    const __m256i dot = dot_signed(codes, load_x(a, i, o * OCTET + 32 * q));
                    acc[q & 1][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_permutevar8x32_ps(ds[i], lanes), acc[q & 1][i]);
                }
            }
            continue;
        }
        __m256i dots[Q8_ROWS][4];
#pragma clang loop unroll(full)
        for (int p = 0; p < 4; p++) {
            const __m256i q = contiguous ? _mm256_loadu_si256((const __m256i*)(b + head + 32 * p))
                                   : _mm256_loadu2_m128i((const __m128i*)(b + (2 * p + 1) * bytes + head),
                                                         (const __m128i*)(b + 2 * p * bytes + head));
            __m256i lo = _mm256_and_si256(q, mask), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
            if (mx || F == MOE_FORMAT_GGML_IQ4_NL || xs) lo = _mm256_shuffle_epi8(table, lo), hi = _mm256_shuffle_epi8(table, hi);
            if (five) {
                const int at = F == MOE_FORMAT_GGML_Q5_0 ? 2 : 4;
                fifth_bits(b + 2 * p * bytes + at, b + (2 * p + 1) * bytes + at, &lo, &hi);
            }
            for (int i = 0; i < MM; i++) {
                const __m256i* x = xp + 2 * (i * pairs + 4 * o + p);
                dots[i][p] = F == MOE_FORMAT_GGML_IQ4_NL || xs
                    ? _mm256_add_epi32(dot_signed(lo, x[0]), dot_signed(hi, x[1]))
                    : _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, x[0]), _mm256_maddubs_epi16(hi, x[1])), ones);
            }
        }
        // Pair p's lanes hold block 2p in the low half, 2p + 1 in the high one: two
        // transposing additions leave one block's sum per lane, in pair_order.
        const __m256i order = _mm256_load_si256((const __m256i*)pair_order);
        // One activation row: one accumulator (acc[o & 1], o not being a constant, would be a
        // stack slot, and a chain of one FMA per octet does not limit this loop). More rows
        // keep two: one each measured slower there.
        const int u = MM == 1 ? 0 : (int)(o & 1);
        for (int i = 0; i < MM; i++) {
            const __m256i t01 = _mm256_add_epi32(_mm256_unpacklo_epi32(dots[i][0], dots[i][1]), _mm256_unpackhi_epi32(dots[i][0], dots[i][1]));
            const __m256i t23 = _mm256_add_epi32(_mm256_unpacklo_epi32(dots[i][2], dots[i][3]), _mm256_unpackhi_epi32(dots[i][2], dots[i][3]));
            const __m256i blocks = _mm256_add_epi32(_mm256_unpacklo_epi64(t01, t23), _mm256_unpackhi_epi64(t01, t23));
            acc[u][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(blocks), _mm256_permutevar8x32_ps(ds[i], order), acc[u][i]);
        }
    }
    for (int i = 0; i < MM; i++) {
        float tail = 0.0f;
        for (int64_t k = octets * OCTET; k < w->cols; k += 32) {
            float d, bias;
            const __m256i codes = b32_codes(F, 0, w, row_data(w, r), &gc, k, &d, &bias);
            tail = fmaf(d * x_scale(a, i, k), (float)hsum_i32(dot_signed(codes, load_x(a, i, k))), tail);
            tail = fmaf(bias, x_sum(a, i, k), tail);
        }
        c[i * ldc] = hsum8(_mm256_fnmadd_ps(_mm256_set1_ps(offset), sums[i], _mm256_add_ps(acc[0][i], acc[1][i]))) + tail;
    }
}

// The formats row_octets multiplies: ggml's types with products here but the K-quants,
// and ours in 4 bits.
INLINE int octet_format(const moe_cpu_matrix* w) {
    const int F = w->format;
    if (is_ggml(F))
        return ggml_avx2_has_products(F) && F != MOE_FORMAT_GGML_Q4_K && F != MOE_FORMAT_GGML_Q5_K &&
               F != MOE_FORMAT_GGML_Q6_K;
    return F == MOE_FORMAT_MXFP4 || (F == MOE_FORMAT_AFFINE && w->bits == 4);
}

T256 int moe_cpu_q8_matmul_avx2(int64_t m, int64_t n, const moe_cpu_q8_rows* a, const moe_cpu_matrix* w,
                                int64_t row0, float* c, int64_t ldc) {
    if (!moe_cpu_q8_supported(w) || w->cols % 32) return 0;
    const int F = w->format;
    const int64_t pairs = 4 * (w->cols / OCTET);
    __m256i* xp = NULL;
    if (octet_format(w) && F != MOE_FORMAT_GGML_Q8_0 && pairs > 0) {
        // Without memory for the rearranged codes, the caller's float product of the grid
        // values serves: the same meaning.
        xp = aligned_alloc(32, (size_t)(MIN(m, Q8_ROWS) * pairs * 2) * sizeof(__m256i));
        if (!xp) return 0;
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
        if (xp) nibble_pair_x(mm, &ai, pairs, xp);
        if (sums16) q8_sums16(mm, &ai, w->cols, sums16);
        const int g64 = F == MOE_FORMAT_AFFINE && w->group_size >= 64;
        for (int64_t j = 0; j < n; j++) {
#define OCTETS_(FMT, MM) row_octets(FMT, MM, w, row0 + j, &ai, xp, pairs, ci + j, ldc);
#define ROW_(MM)                                                                                                  \
    switch (F) {                                                                                                  \
    case MOE_FORMAT_AFFINE:                                                                                       \
        if (w->bits == 4) row_octets(MOE_FORMAT_AFFINE, MM, w, row0 + j, &ai, xp, pairs, ci + j, ldc);            \
        else if (g64) row_b32(MOE_FORMAT_AFFINE, MM, 1, w, row0 + j, &ai, ci + j, ldc);                           \
        else row_b32(MOE_FORMAT_AFFINE, MM, 0, w, row0 + j, &ai, ci + j, ldc);                                    \
        break;                                                                                                    \
    case MOE_FORMAT_MXFP4: OCTETS_(MOE_FORMAT_MXFP4, MM) break;                                                   \
    case MOE_FORMAT_GGML_Q8_0: OCTETS_(MOE_FORMAT_GGML_Q8_0, MM) break;                                           \
    case MOE_FORMAT_GGML_Q4_0: OCTETS_(MOE_FORMAT_GGML_Q4_0, MM) break;                                           \
    case MOE_FORMAT_GGML_Q4_1: OCTETS_(MOE_FORMAT_GGML_Q4_1, MM) break;                                           \
    case MOE_FORMAT_GGML_Q5_0: OCTETS_(MOE_FORMAT_GGML_Q5_0, MM) break;                                           \
    case MOE_FORMAT_GGML_Q5_1: OCTETS_(MOE_FORMAT_GGML_Q5_1, MM) break;                                           \
    case MOE_FORMAT_GGML_IQ4_NL: OCTETS_(MOE_FORMAT_GGML_IQ4_NL, MM) break;                                       \
    case MOE_FORMAT_GGML_IQ4_XS: OCTETS_(MOE_FORMAT_GGML_IQ4_XS, MM) break;                                       \
    case MOE_FORMAT_GGML_MXFP4: OCTETS_(MOE_FORMAT_GGML_MXFP4, MM) break;                                         \
    case MOE_FORMAT_GGML_Q4_K: row_q45_k(MOE_FORMAT_GGML_Q4_K, MM, w, row0 + j, &ai, ci + j, ldc); break;         \
    case MOE_FORMAT_GGML_Q5_K: row_q45_k(MOE_FORMAT_GGML_Q5_K, MM, w, row0 + j, &ai, ci + j, ldc); break;         \
    default: row_q6_k(MM, w, row0 + j, &ai, sums16, ci + j, ldc); break;                                         \
    }
            ROWS_AS_CONSTANT(mm, ROW_)
#undef ROW_
#undef OCTETS_
        }
    }
    free(xp);
    free(sums16);
    return 1;
}

#endif
