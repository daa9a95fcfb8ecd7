#include "moe_cpu_formats.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
// The CPU format kernels (Sources/CMoECPU/formats/) on exact-size buffers in every format
// (ggml's types too) and odd sizes, built with AddressSanitizer by
// tests/python/test_valgrind.py: no read past a buffer; each product (float32 and 8-bit
// activations) against dequantize + a double-precision dot; and a row's result bitwise the
// same whatever other activation rows share the call.
static uint32_t rng = 12345;
static uint32_t rnd(void) { rng = rng * 1664525u + 1013904223u; return rng >> 8; }
// Activations: 0 uniform in [-1, 1); 1 with exponents spread over 2^-20..2^20 and the first
// 64 values zero (fixed-point groups whose largest value is 0 or dwarfs the rest); 2 the
// first activation row's element 5 NaN, whose outputs must all be NaN.
static int activations = 0;
// Scales multiplied by 2^-118 (float32 scales), the tolerance relative only: products of a
// scale and a fixed-point step below float32's normal range must not lose the row.
static int tiny_scales = 0;
// The largest |c - a . deq| over the m x rows results (double-precision dots), and in
// *scale the largest sum of |a_x deq_x| of one.
static double worst_error(int m, int64_t rows, int64_t cols, const float* a, const float* deq, const float* c,
                          double* scale) {
    double worst = 0;
    *scale = 0;
    for (int i = 0; i < m; i++)
        for (int64_t j = 0; j < rows; j++) {
            double ref = 0, mag = 0;
            for (int64_t x = 0; x < cols; x++) {
                ref += (double)a[i * cols + x] * deq[j * cols + x];
                mag += fabs((double)a[i * cols + x] * deq[j * cols + x]);
            }
            const double d = fabs(ref - c[i * rows + j]);
            if (d > worst) worst = d;
            if (mag > *scale) *scale = mag;
        }
    return worst;
}

// The 8-bit-activation product (moe_cpu_matmul_q8, where the format has one on this CPU)
// against a double-precision dot of the dequantized weights with the activations' grid
// values, on exact-size activation codes, scales and sums.
static int check_q8(const moe_cpu_matrix* w, int64_t rows, int64_t cols, int m, const float* a, const float* deq) {
    const int64_t blocks = (cols + 31) / 32;
    int8_t* codes = malloc(m * cols);
    float* scales = malloc(m * blocks * 4);
    float* sums = malloc(m * blocks * 4);
    float* grid = malloc(m * cols * 4);
    float* c = malloc(m * rows * 4);
    for (int i = 0; i < m; i++)
        moe_cpu_q8_quantize(a + i * cols, cols, codes + i * cols, scales + i * blocks, sums + i * blocks, grid + i * cols);
    const moe_cpu_q8_rows q = {codes, scales, sums, cols};
    int ok = 1;
    if (moe_cpu_matmul_q8(m, rows, &q, w, 0, c, rows)) {
        double scale;
        const double worst = worst_error(m, rows, cols, grid, deq, c, &scale);
        ok = worst <= 1e-5 * scale + 1e-6;
        if (!ok) printf("FAIL q8 format %d %ldx%ld m %d: %g (scale %g)\n", w->format, (long)rows, (long)cols, m, worst, scale);
    }
    free(codes); free(scales); free(sums); free(grid); free(c);
    return ok;
}

int check(int fmt, int bits, int gs, int stype, int split, int64_t rows, int64_t cols, int m) {
    moe_cpu_matrix w = {0};
    w.format = fmt; w.bits = bits; w.group_size = gs; w.scale_type = stype; w.cols = cols; w.split_nibbles = split;
    int esz = fmt == 0 ? 4 : 2;
    w.row_bytes = fmt <= 2 ? cols * esz : cols * bits / 8;
    size_t db = rows * w.row_bytes;
    uint8_t* data = malloc(db);
    for (size_t i = 0; i < db; i++) data[i] = rnd();
    if (fmt == 2 || fmt == 1) for (size_t i = 0; i < db / 2; i++) ((uint16_t*)data)[i] = fmt == 2 ? (0x3f00 | (rnd() & 0x7f)) ^ ((rnd() & 1) << 15) : (0x3800 | (rnd() & 0x3ff));
    if (fmt == 0) for (size_t i = 0; i < db / 4; i++) ((float*)data)[i] = (rnd() % 1000) / 1000.0f - 0.5f;
    w.data = data;
    size_t groups = fmt >= 3 ? rows * (cols / gs) : 0;
    int ssz = fmt == 4 ? 1 : (stype == 0 ? 4 : 2);
    void* sc = groups ? malloc(groups * ssz) : NULL;
    void* bi = (groups && fmt == 3) ? malloc(groups * ssz) : NULL;
    for (size_t g = 0; g < groups; g++) {
        if (fmt == 4) ((uint8_t*)sc)[g] = 120 + rnd() % 10;
        else if (stype == 0) {
            ((float*)sc)[g] = ldexpf(0.01f * (1 + rnd() % 5), tiny_scales ? -118 : 0);
            ((float*)bi)[g] = ldexpf(-0.05f, tiny_scales ? -118 : 0);
        }
        else if (stype == 1) { ((uint16_t*)sc)[g] = 0x2000 + rnd() % 256; ((uint16_t*)bi)[g] = 0xA800; }
        else { ((uint16_t*)sc)[g] = 0x3c00 + rnd() % 64; ((uint16_t*)bi)[g] = 0xBd00; }
    }
    w.scales = sc; w.biases = bi;
    float* deq = malloc(rows * cols * 4);
    moe_cpu_dequantize_rows(&w, 0, rows, deq);
    float* a = malloc(m * cols * 4);
    for (int64_t i = 0; i < m * cols; i++) a[i] = (rnd() % 2000) / 1000.0f - 1;
    if (activations == 1)
        for (int64_t i = 0; i < m * cols; i++) a[i] = i % cols < 64 ? 0.0f : ldexpf(a[i], (int)(rnd() % 41) - 20);
    if (activations == 2 && cols > 5) a[5] = NAN;
    float* c = malloc(m * rows * 4);
    moe_cpu_matmul_formatted(m, rows, a, cols, &w, 0, c, rows);
    double worst = 0, scale = 0;
    for (int i = 0; i < m; i++) for (int64_t j = 0; j < rows; j++) {
        if (activations == 2 && cols > 5) {
            if (i == 0 && !isnan(c[j])) { worst = INFINITY; printf("NaN activation, row %ld: %g\n", (long)j, c[j]); }
            if (i == 0) continue;
        }
        double ref = 0, mag = 0;
        for (int64_t x = 0; x < cols; x++) { ref += (double)a[i * cols + x] * deq[j * cols + x]; mag += fabs(a[i*cols+x]*deq[j*cols+x]); }
        double d = fabs(ref - c[i * rows + j]); if (d > worst) worst = d; if (mag > scale) scale = mag;
    }
    int ok = worst <= 1e-5 * scale + (tiny_scales ? 0 : 1e-6);
    if (m >= 2) {  // a row's result must not depend on the other rows of the call
        float* c1 = malloc(rows * 4);
        moe_cpu_matmul_formatted(1, rows, a, cols, &w, 0, c1, rows);
        if (memcmp(c1, c, rows * 4) != 0) { ok = 0; printf("row 0 differs between m=1 and m=%d\n", m); }
        free(c1);
    }
    if (!ok) printf("FAIL fmt %d bits %d gs %d stype %d split %d %ldx%ld m %d: %g (scale %g)\n", fmt, bits, gs, stype, split, rows, cols, m, worst, scale);
    if (activations == 0 && m <= 4) ok &= check_q8(&w, rows, cols, m, a, deq);
    free(data); free(sc); free(bi); free(deq); free(a); free(c);
    return ok;
}

// ggml's block types (format, block elements, bytes, the byte offsets of its float16
// fields; mxfp4's E8M0 byte at 0).
void moe_cpu_ggml_dequantize_rows(const moe_cpu_matrix* w, int64_t row0, int64_t rows, float* out);
static const struct { int format, elems, bytes, halves[2]; } ggml_types[] = {
    {102, 32, 18, {0, -1}}, {103, 32, 20, {0, 2}},    {106, 32, 22, {0, -1}},   {107, 32, 24, {0, 2}},
    {108, 32, 34, {0, -1}}, {110, 256, 84, {80, 82}}, {111, 256, 110, {108, -1}}, {112, 256, 144, {0, 2}},
    {113, 256, 176, {0, 2}}, {114, 256, 210, {208, -1}}, {120, 32, 18, {0, -1}}, {123, 256, 136, {0, -1}},
    {139, 32, 17, {-1, -1}}};

// One ggml type on an exact-size buffer of `blocks` blocks per row: the dequantized rows
// the same bits as the portable decoders (ggml's), the float product against a
// double-precision dot, and the 8-bit product (check_q8).
static int check_ggml(int t, int64_t rows, int64_t blocks, int m) {
    moe_cpu_matrix w = {0};
    w.format = ggml_types[t].format;
    w.cols = blocks * ggml_types[t].elems;
    w.row_bytes = blocks * ggml_types[t].bytes;
    const int64_t cols = w.cols;
    uint8_t* data = malloc(rows * w.row_bytes);
    for (int64_t i = 0; i < rows * w.row_bytes; i++) data[i] = rnd();
    for (int64_t b = 0; b < rows * blocks; b++) {
        uint8_t* blk = data + b * ggml_types[t].bytes;
        for (int h = 0; h < 2; h++)
            if (ggml_types[t].halves[h] >= 0) {  // 2^-7 to 2^-6: finite products
                const uint16_t v = 0x2000 | (rnd() & 0x3ff);
                memcpy(blk + ggml_types[t].halves[h], &v, 2);
            }
        if (w.format == 139) blk[0] = 118 + rnd() % 8;
    }
    w.data = data;
    float* deq = malloc(rows * cols * 4);
    float* portable = malloc(rows * cols * 4);
    moe_cpu_dequantize_rows(&w, 0, rows, deq);
    moe_cpu_ggml_dequantize_rows(&w, 0, rows, portable);
    int ok = memcmp(deq, portable, rows * cols * 4) == 0;
    if (!ok) printf("FAIL ggml %d: dequantized rows differ from the portable decoders\n", w.format);
    float* a = malloc(m * cols * 4);
    for (int64_t i = 0; i < m * cols; i++) a[i] = (rnd() % 2000) / 1000.0f - 1;
    float* c = malloc(m * rows * 4);
    moe_cpu_matmul_formatted(m, rows, a, cols, &w, 0, c, rows);
    double scale;
    const double worst = worst_error(m, rows, cols, a, deq, c, &scale);
    if (worst > 1e-5 * scale + 1e-6) {
        ok = 0;
        printf("FAIL ggml %d %ldx%ld m %d: %g (scale %g)\n", w.format, (long)rows, (long)cols, m, worst, scale);
    }
    if (m <= 4) ok &= check_q8(&w, rows, cols, m, a, deq);
    free(data); free(deq); free(portable); free(a); free(c);
    return ok;
}
// The fixed-point products keep a thread's last prepared activations for the next call on
// the same floats: a call after the caller rewrote its buffer in place, or on a matrix of
// another group size or row count, must give bitwise what a first call gives.
static moe_cpu_matrix affine4(int gs, int64_t rows, int64_t cols) {
    moe_cpu_matrix w = {0};
    w.format = 3; w.bits = 4; w.group_size = gs; w.scale_type = 1; w.cols = cols; w.split_nibbles = 1;
    w.row_bytes = cols / 2;
    uint8_t* data = malloc(rows * w.row_bytes);
    for (int64_t i = 0; i < rows * w.row_bytes; i++) data[i] = rnd();
    uint16_t* sc = malloc(rows * (cols / gs) * 2);
    uint16_t* bi = malloc(rows * (cols / gs) * 2);
    for (int64_t g = 0; g < rows * (cols / gs); g++) sc[g] = 0x2000 + rnd() % 256, bi[g] = 0xA800;
    w.data = data; w.scales = sc; w.biases = bi;
    return w;
}
static void free_matrix(moe_cpu_matrix* w) { free((void*)w->data); free((void*)w->scales); free((void*)w->biases); }

static int check_prepared_reuse(void) {
    const int64_t rows = 6, cols = 2048;
    moe_cpu_matrix w64 = affine4(64, rows, cols), w32 = affine4(32, rows, cols);
    float* a = malloc(2 * cols * 4);
    float* other = malloc(2 * cols * 4);
    for (int64_t i = 0; i < 2 * cols; i++) a[i] = (rnd() % 2000) / 1000.0f - 1, other[i] = (rnd() % 2000) / 1000.0f - 1;
    float before[2 * 6], after[2 * 6], first[2 * 6], c32[2 * 6];
    int ok = 1;
    for (int m = 1; m <= 2; m++) {
        moe_cpu_matmul_formatted(m, rows, a, cols, &w64, 0, before, rows);
        a[cols - 1] += 0.5f;  // in place: the same pointer, other floats
        moe_cpu_matmul_formatted(m, rows, a, cols, &w64, 0, after, rows);
        moe_cpu_matmul_formatted(m, rows, a, cols, &w32, 0, c32, rows);  // same floats, another group size
        memcpy(other, a, m * cols * 4);
        moe_cpu_matmul_formatted(1, rows, other + cols, cols, &w64, 0, first, rows);  // something else in between
        moe_cpu_matmul_formatted(m, rows, other, cols, &w64, 0, first, rows);
        if (memcmp(after, first, m * rows * 4) != 0 || memcmp(after, before, m * rows * 4) == 0) {
            ok = 0;
            printf("FAIL prepared activations reused after the floats changed (m %d)\n", m);
        }
        moe_cpu_matmul_formatted(1, rows, other + cols, cols, &w64, 0, first, rows);
        moe_cpu_matmul_formatted(m, rows, other, cols, &w32, 0, first, rows);
        if (memcmp(c32, first, m * rows * 4) != 0) {
            ok = 0;
            printf("FAIL prepared activations reused for another group size (m %d)\n", m);
        }
    }
    free_matrix(&w64); free_matrix(&w32); free(a); free(other);
    return ok;
}

// moe_cpu_q8_quantize against the definition (reference.quantize_activations_q8), element
// by element in float32, bit for bit: whole and short blocks, zeros, ties, an outlier, a
// block whose d is subnormal (the clamp), non-finite elements; and in place (grid = x).
static int check_quantizer(void) {
    enum { N = 32 * 7 + 5 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) / 97.0f;
    for (int i = 0; i < 32; i++) x[i] = 0;                         // block 0: zeros
    for (int i = 32; i < 64; i++) x[i] = (float)(i - 32) - 15.5f;  // block 1: d = 1 with x[63] = 127, ties
    x[63] = 127;
    x[70] = 1e4f;                                                   // block 2: an outlier
    for (int i = 96; i < 128; i++) x[i] = 1e-43f * (float)(i % 5);  // block 3: d subnormal
    x[140] = INFINITY;                                              // block 4: non-finite
    x[170] = NAN;                                                   // block 5: NaN
    int8_t codes[N];
    float scales[8], sums[8], grid[N], in_place[N];
    moe_cpu_q8_quantize(x, N, codes, scales, sums, grid);
    memcpy(in_place, x, sizeof x);
    int8_t codes2[N];
    float scales2[8], sums2[8];
    moe_cpu_q8_quantize(in_place, N, codes2, scales2, sums2, in_place);
    int bad = 0;
    for (int b = 0; b * 32 < N; b++) {
        const int len = N - b * 32 < 32 ? N - b * 32 : 32;
        const float* v = x + b * 32;
        float amax = 0;
        int finite = 1;
        for (int i = 0; i < len; i++) {
            finite &= isfinite(v[i]) != 0;
            if (fabsf(v[i]) > amax) amax = fabsf(v[i]);
        }
        const float d = finite ? amax / 127.0f : NAN;
        int total = 0;
        for (int i = 0; i < len; i++) {
            const int8_t q = d > 0 ? (int8_t)fminf(fmaxf(rintf(v[i] / d), -127.0f), 127.0f) : 0;
            const float g = d * (float)q;
            total += q;
            bad += codes[b * 32 + i] != q || codes2[b * 32 + i] != q;
            bad += memcmp(&grid[b * 32 + i], &g, 4) != 0 || memcmp(&in_place[b * 32 + i], &g, 4) != 0;
        }
        const float sum = d * (float)total;
        bad += memcmp(&scales[b], &d, 4) != 0 || memcmp(&sums[b], &sum, 4) != 0;
        bad += memcmp(&scales2[b], &d, 4) != 0 || memcmp(&sums2[b], &sum, 4) != 0;
    }
    if (bad) printf("FAIL q8 quantizer: %d values differ from the definition\n", bad);
    return bad == 0;
}

int main(void) {
    int fails = 0, n = 0;
    int ms[] = {1, 2, 3, 4, 5, 9};
    for (int mi = 0; mi < 6; mi++) {
        int m = ms[mi];
        for (int fmt = 0; fmt <= 2; fmt++) { int64_t c2[] = {1, 31, 33, 64, 100}; for (int k = 0; k < 5; k++) { fails += !check(fmt, 0, 0, 0, 0, 7, c2[k], m); n++; } }
        int bitsv[] = {2, 3, 4, 5, 6, 8};
        for (int b = 0; b < 6; b++) for (int gs = 32; gs <= 128; gs *= 2) for (int st = 0; st < 3; st++) for (int split = 0; split <= (bitsv[b] == 4); split++) {
            fails += !check(3, bitsv[b], gs, st, split, 5, gs * 3, m); n++;
        }
        for (int split = 0; split <= 1; split++) { fails += !check(4, 4, 32, 0, split, 6, 96, m); fails += !check(4, 4, 32, 0, split, 3, 32 * 300, m); n += 2; }
        fails += !check(3, 4, 32, 1, 1, 2, 32 * 600, m); n++;  // more groups than one segment
        // Factored affine products (AVX-512): 16 groups of scales at a time plus a tail, and
        // rows with more groups than their stack buffer holds (the table path serves those).
        fails += !check(3, 8, 32, 2, 0, 3, 32 * 17, m); fails += !check(3, 4, 64, 0, 1, 3, 64 * 33, m);
        fails += !check(3, 4, 32, 1, 1, 2, 32 * 1100, m); n += 3;
    }
    // Fixed-point activations (the affine 4- and 8-bit products): zero groups, a wide
    // dynamic range, a NaN (modes 1, 2: float16 / bfloat16 scales); float32 scales near
    // 2^-125 (mode 3).
    for (int mode = 1; mode <= 3; mode++) {
        activations = mode <= 2 ? mode : 0;
        tiny_scales = mode == 3;
        const int rows = tiny_scales ? 5 : 3;
        for (int mi = 0; mi < 6; mi++)
            for (int gs = 32; gs <= 128; gs *= 2) {
                fails += !check(3, 4, gs, tiny_scales ? 0 : 1, 1, rows, gs * 5, ms[mi]);
                fails += !check(3, 8, gs, tiny_scales ? 0 : 2, 0, rows, gs * 5, ms[mi]);
                // Whole steps of 64 codes (AVX2's 4-bit product needs them), eight groups: its vector part alone.
                fails += !check(3, 4, gs, tiny_scales ? 0 : 1, 1, rows, gs * 8, ms[mi]);
                n += 3;
            }
    }
    activations = tiny_scales = 0;
    // ggml's types: rows of one block, of whole and partial eights of 32-element blocks
    // (9, 90 = gpt-oss's 2880), and of three 256-element blocks.
    for (int t = 0; t < (int)(sizeof ggml_types / sizeof ggml_types[0]); t++)
        for (int mi = 0; mi < 6; mi++) {
            const int64_t counts32[] = {1, 9, 90}, counts256[] = {1, 3};
            const int small = ggml_types[t].elems == 256;
            for (int k = 0; k < (small ? 2 : 3); k++) {
                fails += !check_ggml(t, 3, small ? counts256[k] : counts32[k], ms[mi]);
                n++;
            }
        }
    fails += !check_prepared_reuse();
    fails += !check_quantizer();
    n += 2;
    printf("%d of %d cases failed\n", fails, n);
    return fails != 0;
}
