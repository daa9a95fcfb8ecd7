// One weight format's 8-bit-activation product (moe_cpu_matmul_q8) over a matrix of
// 2048-column rows: from DRAM (a matrix larger than the last-level cache, each pass over
// it timed) and from L2 (the first 300 KB over and over), with the read probe of the same
// buffer in between. Prints one JSON object. Built and run by benchmarks/q8_stream.py.
//   q8_stream FORMAT_CODE M MEGABYTES REPEATS
#include "moe_cpu_formats.h"

#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

// GB/s of four independent 32-byte loads per 128 bytes over the buffer (n a multiple of 128).
__attribute__((target("avx2"))) static double read_probe(const uint8_t* p, size_t n) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    const double t = now();
    for (size_t i = 0; i + 128 <= n; i += 128) {
        s0 = _mm256_add_epi8(s0, _mm256_load_si256((const __m256i*)(p + i)));
        s1 = _mm256_add_epi8(s1, _mm256_load_si256((const __m256i*)(p + i + 32)));
        s2 = _mm256_add_epi8(s2, _mm256_load_si256((const __m256i*)(p + i + 64)));
        s3 = _mm256_add_epi8(s3, _mm256_load_si256((const __m256i*)(p + i + 96)));
    }
    const double dt = now() - t;
    volatile int sink = _mm256_extract_epi32(_mm256_add_epi8(_mm256_add_epi8(s0, s1), _mm256_add_epi8(s2, s3)), 0);
    (void)sink;
    return n / dt / 1e9;
}

int main(int argc, char** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: q8_stream FORMAT_CODE M MEGABYTES REPEATS\n");
        return 2;
    }
    const int format = atoi(argv[1]), m = atoi(argv[2]), repeats = atoi(argv[4]);
    const int64_t cols = 2048;
    int elems = 32, bytes = 16;  // ours (affine 4-bit group 64, mxfp4): 16 code bytes per 32
    switch (format) {
    case MOE_FORMAT_GGML_Q4_0: case MOE_FORMAT_GGML_IQ4_NL: bytes = 18; break;
    case MOE_FORMAT_GGML_Q8_0: bytes = 34; break;
    case MOE_FORMAT_GGML_MXFP4: bytes = 17; break;
    case MOE_FORMAT_GGML_Q4_K: elems = 256, bytes = 144; break;
    case MOE_FORMAT_GGML_Q5_K: elems = 256, bytes = 176; break;
    case MOE_FORMAT_GGML_IQ4_XS: elems = 256, bytes = 136; break;
    case MOE_FORMAT_GGML_Q6_K: elems = 256, bytes = 210; break;
    case MOE_FORMAT_AFFINE: case MOE_FORMAT_MXFP4: break;
    default: fprintf(stderr, "format %d is not benchmarked here\n", format); return 2;
    }
    const int64_t row_bytes = cols / elems * bytes, rows = (int64_t)(atof(argv[3]) * 1e6) / row_bytes;
    const size_t size = (size_t)(rows * row_bytes + 127) / 128 * 128;
    uint8_t* w = aligned_alloc(64, size);
    if (!w) return 1;
    srand(1);
    for (size_t i = 0; i < size; i++) w[i] = (uint8_t)rand();
    moe_cpu_matrix mat = {0};
    mat.format = format, mat.cols = cols, mat.row_bytes = row_bytes, mat.data = w;
    void *scales = NULL, *biases = NULL;
    if (format == MOE_FORMAT_AFFINE || format == MOE_FORMAT_MXFP4) {
        const int64_t groups = rows * cols / (format == MOE_FORMAT_AFFINE ? 64 : 32);
        mat.bits = 4, mat.split_nibbles = 1, mat.group_size = format == MOE_FORMAT_AFFINE ? 64 : 32;
        mat.scale_type = MOE_DTYPE_F16;
        scales = malloc((size_t)groups * 2), biases = malloc((size_t)groups * 2);
        for (int64_t g = 0; g < groups; g++) {
            const uint16_t s = 0x2000, b = 0xa000;
            if (format == MOE_FORMAT_MXFP4) ((uint8_t*)scales)[g] = 120;
            else memcpy((uint8_t*)scales + 2 * g, &s, 2), memcpy((uint8_t*)biases + 2 * g, &b, 2);
        }
        mat.scales = scales, mat.biases = format == MOE_FORMAT_AFFINE ? biases : NULL;
    } else {  // finite float16 scales (0x2000 ~ 0.0078), mxfp4 exponents of 2^-7
        for (int64_t r = 0; r < rows; r++)
            for (int64_t b = 0; b < cols / elems; b++) {
                uint8_t* blk = w + r * row_bytes + b * bytes;
                switch (format) {
                case MOE_FORMAT_GGML_MXFP4: blk[0] = 120; break;
                case MOE_FORMAT_GGML_Q6_K: blk[208] = 0, blk[209] = 0x20; break;
                case MOE_FORMAT_GGML_Q4_K: case MOE_FORMAT_GGML_Q5_K: blk[2] = 0, blk[3] = 0x20; /* fall through */
                default: blk[0] = 0, blk[1] = 0x20;
                }
            }
    }
    float* x = malloc(sizeof(float) * (size_t)(cols * m));
    int8_t* codes = malloc((size_t)(cols * m));
    float* xs = malloc(sizeof(float) * (size_t)(cols * m / 32));
    float* sums = malloc(sizeof(float) * (size_t)(cols * m / 32));
    float* c = malloc(sizeof(float) * (size_t)(rows * m));
    for (int64_t i = 0; i < cols * m; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < m; i++) moe_cpu_q8_quantize(x + i * cols, cols, codes + i * cols, xs + i * cols / 32, sums + i * cols / 32, NULL);
    const moe_cpu_q8_rows a = {codes, xs, sums, cols};
    if (!moe_cpu_matmul_q8(m, 1, &a, &mat, 0, c, 1)) {
        fprintf(stderr, "no integer product for format %d on this CPU\n", format);
        return 3;
    }
    double dram = 1e30, probe = 0, l2 = 1e30;
    for (int it = 0; it < repeats; it++) {
        double t = now();
        moe_cpu_matmul_q8(m, rows, &a, &mat, 0, c, rows);
        t = now() - t;
        dram = t < dram ? t : dram;
        const double p = read_probe(w, size);
        probe = p > probe ? p : probe;
    }
    const int64_t small = 300000 / row_bytes;
    for (int it = 0; it < 50 * repeats; it++) {
        double t = now();
        moe_cpu_matmul_q8(m, small, &a, &mat, 0, c, small);
        t = now() - t;
        l2 = t < l2 ? t : l2;
    }
    printf("{\"format\": %d, \"m\": %d, \"bytes\": %zu, \"dram_gbs\": %.3f, \"probe_gbs\": %.3f, "
           "\"dram_gweights\": %.3f, \"l2_gweights\": %.3f}\n",
           format, m, (size_t)(rows * row_bytes), rows * row_bytes / dram / 1e9, probe, rows * cols / dram / 1e9,
           small * cols / l2 / 1e9);
    return 0;
}
