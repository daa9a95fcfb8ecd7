/*
 * moe_kernel_params.h - the parameter structs and constants of the Metal kernels,
 * declared once for both sides:
 *   - MSL: MetalKernels.swift pastes this file where a kernel file says
 *     #include "moe_kernel_params.h" (makeLibrary(source:) cannot resolve includes);
 *   - Swift: imported through the CMoESwift module map (Sources/CMoESwift/include/
 *     module.modulemap names this file by a relative path);
 *   - the Python kernel tests: cffi reads the part between PARAMS-BEGIN and PARAMS-END.
 * Plain C, fixed-width fields only (4 bytes each, so the layouts agree without packing
 * rules), every struct padded to a multiple of 16 bytes. Not part of the public ABI.
 */
#ifndef MOE_KERNEL_PARAMS_H
#define MOE_KERNEL_PARAMS_H

/* The codes of every option (moe_scoring, moe_activation, moe_format, moe_dtype) and the
 * kernel specialisations. */
#include "moe_options.h"

#ifdef __METAL_VERSION__
typedef unsigned int moe_u32;
typedef int moe_i32;
#else
#include <stdint.h>
typedef uint32_t moe_u32;
typedef int32_t moe_i32;
#endif

/* PARAMS-BEGIN */

/* Threads of a simdgroup on every Apple GPU (and on SoftMetal). */
#define MOE_SIMD_WIDTH 32

/* Router: one threadgroup of MOE_ROUTER_THREADS threads routes up to
 * MOE_ROUTER_MAX_TOKENS tokens (one simdgroup per token for the top-k). */
#define MOE_ROUTER_THREADS 256
#define MOE_ROUTER_SIMDGROUPS 8
#define MOE_ROUTER_MAX_TOKENS 8
/* Decode router (tokens <= MOE_DECODE_MAX_TOKENS), two dispatches: moe_router_gemv, one
 * router row per simdgroup, MOE_ROUTER_GEMV_SIMDGROUPS rows per threadgroup, every token
 * in every threadgroup; then moe_router_topk, one simdgroup (threadgroup) per token. */
#define MOE_ROUTER_GEMV_THREADS 128
#define MOE_ROUTER_GEMV_SIMDGROUPS 4
/* The top-k keeps one bit per expert and lane: at most 32 * 32 experts. */
#define MOE_MAX_EXPERTS 1024

/* Decode path: matrix-vector kernels; one threadgroup of MOE_GEMV_THREADS threads
 * (MOE_GEMV_SIMDGROUPS simdgroups) computes MOE_GEMV_ROWS output rows of one expert
 * (MOE_GEMV_ROWS_PER_SIMDGROUP consecutive rows per simdgroup) for every token that
 * selected it (at most MOE_DECODE_MAX_TOKENS). */
#define MOE_DECODE_MAX_TOKENS 4
#define MOE_GEMV_THREADS 128
#define MOE_GEMV_SIMDGROUPS 4
#define MOE_GEMV_ROWS_PER_SIMDGROUP 4
#define MOE_GEMV_ROWS 16

/* Prefill path: bucketing in one threadgroup (tiles of MOE_GEMM_BM bucket rows); tiled
 * GEMMs with simdgroup matrices, threadgroups of MOE_GEMM_THREADS threads (2 x 2
 * simdgroups), K in double-buffered steps of MOE_GEMM_BK. Per threadgroup: gate/up
 * MOE_GEMM_BM rows x MOE_GEMM_GATE_UP_BN columns of gate and of up (simdgroups of
 * 16 x 16 each), down MOE_GEMM_BM rows x MOE_GEMM_DOWN_BN columns (simdgroups of 16 x 32). */
#define MOE_BUCKET_THREADS 256
#define MOE_BUCKET_SIMDGROUPS 8
#define MOE_GEMM_BM 32
#define MOE_GEMM_GATE_UP_BN 32
#define MOE_GEMM_DOWN_BN 64
#define MOE_GEMM_BK 32
#define MOE_GEMM_THREADS 128

/* Combine: MOE_COMBINE_THREADS consecutive hidden elements of one token per threadgroup. */
#define MOE_COMBINE_THREADS 256

/* Activation conversion (a caller's float16 / bfloat16 buffers, or float32 ones the
 * stages cannot bind in place; 8-bit activation grid values): MOE_CONVERT_THREADS
 * consecutive elements of one row per threadgroup. */
#define MOE_CONVERT_THREADS 256

/* moe_ffn_params.mode */
#define MOE_FFN_ROUTED 0   /* rows are (token, slot) pairs, experts from the router */
#define MOE_FFN_SHARED 1   /* rows are tokens, expert 0 of the shared-expert weights */

/* moe_ffn_params.gate_up_pass (gate/up kernels): gate and up in one dispatch, or in two
 * when their products read different inputs (8-bit activations for the quantized one of a
 * dense / quantized pair): the first keeps the gate product (with its bias) in the output,
 * the second reads it back there for the activation. */
#define MOE_GATE_UP_BOTH 0
#define MOE_GATE_UP_KEEP_GATE 1
#define MOE_GATE_UP_WITH_KEPT_GATE 2

/* One weight matrix as a kernel reads it, in its stored format (Formats/WeightFormat.swift):
 * three buffers - codes (or the dense values), scales, biases - and where the matrix's
 * rows are. Row r of expert e is row e * rows_per_expert + row_offset + r of the tensor;
 * a row of `cols` elements takes cols * bits / 8 bytes of codes and cols >> group_shift
 * scales (and biases), except in ggml's block formats, whose rows are row_bytes bytes of
 * blocks that hold their own scales (no scale or bias buffer). Gate and up of a fused
 * (E, 2I, H) tensor are the same buffers with row_offset 0 and I. With per_expert, each
 * expert's tensor lies on its own (a checkpoint of one tensor per expert, read where it
 * lies): row r of expert e is row row_offset + r of the tensor whose codes, scales and
 * biases start at the byte offsets of entry e of the matrix's moe_expert_parts table
 * (MOE_FFN_BUF_W0_EXPERTS / _W1_EXPERTS) from the start of one of the three buffers, its
 * `span`: 0 the codes buffer, 1 the scales buffer, 2 the biases buffer. A per-expert matrix
 * binds there the wrapped spans of up to three files (a projection whose experts straddle
 * the shards of a checkpoint) and reads all three parts of an expert from its span. */
typedef struct moe_weight_desc {
    moe_u32 format;               /* moe_format */
    moe_u32 bits;                 /* bits per element: 32, 16, 16, 2..8 (affine), 4 (mxfp4), 0 (ggml) */
    moe_u32 group_shift;          /* log2(group_size) of quantized formats */
    moe_u32 scale_type;           /* moe_dtype of affine scales and biases */
    moe_u32 rows_per_expert;
    moe_u32 row_offset;
    moe_u32 row_bytes;            /* ggml blocks: cols / block_elems * block_bytes; 0 otherwise */
    moe_u32 per_expert;           /* 1: experts through the moe_expert_parts table */
} moe_weight_desc;

/* Where one expert's tensor lies in a per-expert matrix: which of the three bound buffers
 * holds it (`span`), and the byte offsets in it of its codes, scales and biases, each as
 * low and high 32 bits. */
typedef struct moe_expert_parts {
    moe_u32 codes_lo, codes_hi;
    moe_u32 scales_lo, scales_hi;
    moe_u32 biases_lo, biases_hi;
    moe_u32 span;
    moe_u32 _pad0;
} moe_expert_parts;

/* Buffer indices ([[buffer(n)]]) of moe_router_<format>. */
#define MOE_ROUTER_BUF_PARAMS 0
#define MOE_ROUTER_BUF_X 1
#define MOE_ROUTER_BUF_W 2              /* router weight (E, H): codes or dense values */
#define MOE_ROUTER_BUF_ROUTER_BIAS 3
#define MOE_ROUTER_BUF_SELECTION_BIAS 4
#define MOE_ROUTER_BUF_EXPERT_SCALE 5
#define MOE_ROUTER_BUF_SHARED_GATE 6
#define MOE_ROUTER_BUF_IDS 7
#define MOE_ROUTER_BUF_WEIGHTS 8
#define MOE_ROUTER_BUF_SHARED_FACTOR 9
#define MOE_ROUTER_BUF_W_SCALES 10
#define MOE_ROUTER_BUF_W_BIASES 11
#define MOE_ROUTER_BUF_NORM_WEIGHT 12   /* the input norm's weight (H) */
#define MOE_ROUTER_BUF_X_NORMED 13      /* out: the normalised input (T, H) the later stages read */
#define MOE_ROUTER_BUF_LOGITS 14        /* decode: scratch logits (T, logit_stride), gemv -> topk */

/* Buffer indices of the expert kernels (moe_{gate_up,down}_{gemv,gemm}_<format>).
 * W0 is the gate matrix of gate/up kernels and the down matrix of down kernels; W1 the up
 * matrix (gate/up only). */
#define MOE_FFN_BUF_PARAMS 0
#define MOE_FFN_BUF_INPUT 1             /* x (T, H), or the activations (rows, I) for down */
#define MOE_FFN_BUF_W0 2
#define MOE_FFN_BUF_BIAS 3              /* (E, 2I) gate/up, (E, H) down */
#define MOE_FFN_BUF_OUTPUT 4
#define MOE_FFN_BUF_IDS 5               /* decode: the router's ids */
#define MOE_FFN_BUF_ROWS 5              /* prefill: bucket row -> pair */
#define MOE_FFN_BUF_TILES 6
#define MOE_FFN_BUF_OFFSETS 7
#define MOE_FFN_BUF_ROW_WEIGHT 8        /* down: routing weight or shared-expert factor per row */
#define MOE_FFN_BUF_W0_SCALES 9
#define MOE_FFN_BUF_W0_BIASES 10
#define MOE_FFN_BUF_W1 11
#define MOE_FFN_BUF_W1_SCALES 12
#define MOE_FFN_BUF_W1_BIASES 13
#define MOE_FFN_BUF_W0_EXPERTS 14       /* moe_expert_parts (E) of a per-expert w0, else unused */
#define MOE_FFN_BUF_W1_EXPERTS 15

/* Buffer indices of moe_bucket and moe_combine. */
#define MOE_BUCKET_BUF_PARAMS 0
#define MOE_BUCKET_BUF_IDS 1
#define MOE_BUCKET_BUF_OFFSETS 2
#define MOE_BUCKET_BUF_ROWS 3
#define MOE_BUCKET_BUF_TILES 4
#define MOE_BUCKET_BUF_DISPATCH_ARGS 5
#define MOE_COMBINE_BUF_PARAMS 0
#define MOE_COMBINE_BUF_PAIR_OUT 1
#define MOE_COMBINE_BUF_SHARED_OUT 2
#define MOE_COMBINE_BUF_RESIDUAL 3
#define MOE_COMBINE_BUF_OUTPUT 4
#define MOE_COMBINE_BUF_NORM_WEIGHT 5   /* the next layer's norm weight (H) */
#define MOE_COMBINE_BUF_NORMED 6        /* out: the output normalised (T, H) */
#define MOE_COMBINE_BUF_IDS 7           /* the pairs' expert ids (T * k) */
#define MOE_CONVERT_BUF_PARAMS 0
#define MOE_CONVERT_BUF_SRC 1
#define MOE_CONVERT_BUF_DST 2

/* moe_router: grid (ceil(tokens / tokens_per_group)), MOE_ROUTER_THREADS threads,
 * threadgroup(0): tokens_per_group * (logit_stride + 2 * experts) floats.
 * moe_router_gemv (tokens <= MOE_DECODE_MAX_TOKENS): grid (ceil((experts + has_shared_gate)
 * / MOE_ROUTER_GEMV_SIMDGROUPS)), MOE_ROUTER_GEMV_THREADS threads, no threadgroup(0);
 * then moe_router_topk: grid (tokens), MOE_SIMD_WIDTH threads, threadgroup(0):
 * logit_stride + 2 * experts floats. Neither reads tokens_per_group. */
typedef struct moe_router_params {
    moe_u32 tokens;
    moe_u32 hidden;
    moe_u32 experts;
    moe_u32 top_k;
    moe_u32 scoring;              /* moe_scoring */
    moe_u32 norm_topk_prob;
    float routed_scaling_factor;
    moe_u32 n_group;
    moe_u32 topk_group;
    moe_u32 has_router_bias;
    moe_u32 has_selection_bias;
    moe_u32 has_per_expert_scale;
    moe_u32 has_shared_gate;      /* also compute sigmoid(x . shared_gate) */
    moe_u32 tokens_per_group;     /* moe_router: 1 ... MOE_ROUTER_MAX_TOKENS */
    moe_u32 logit_stride;         /* >= experts + 1 */
    moe_u32 _pad0;
    moe_weight_desc weight;       /* the router weight (E, H) */
    moe_u32 has_input_norm;       /* normalise x into X_NORMED first, then route that */
    float input_norm_eps;
    float input_norm_offset;      /* scale by (offset + weight): 0, or 1 for Gemma */
    moe_u32 _pad1;
} moe_router_params;

/* moe_bucket: one threadgroup of MOE_BUCKET_THREADS threads,
 * threadgroup(0): 6 * experts uints (counts, cursors, per-simdgroup counts as ushort). */
typedef struct moe_bucket_params {
    moe_u32 pairs;                /* tokens * top_k */
    moe_u32 experts;              /* the experts held: E, or an expert-parallel share's count */
    moe_u32 gate_up_column_tiles; /* ceil(I / MOE_GEMM_GATE_UP_BN): y of the gate/up GEMM grid */
    moe_u32 down_column_tiles;    /* ceil(H / MOE_GEMM_DOWN_BN): y of the down GEMM grid */
    moe_u32 expert_base;          /* the experts held: ids base, base + stride, ...; a pair's */
    moe_u32 expert_stride;        /* bucket is its id's place among them (moe_held_place) */
} moe_bucket_params;

/* The expert kernels (gate/up and down, matrix-vector and GEMM), routed or shared. */
typedef struct moe_ffn_params {
    moe_u32 tokens;
    moe_u32 hidden;               /* H */
    moe_u32 inner;                /* I (or the shared expert's Is) */
    moe_u32 top_k;                /* pairs per token (1 for the shared expert) */
    moe_u32 mode;                 /* MOE_FFN_ROUTED or MOE_FFN_SHARED */
    moe_u32 activation;           /* moe_activation */
    float swiglu_alpha;
    float swiglu_limit;
    moe_u32 has_bias;
    moe_u32 gate_up_pass;         /* MOE_GATE_UP_* */
    moe_u32 experts;              /* the experts held (E, or a share's count): a routed pair */
    moe_u32 expert_base;          /* whose id is not held (moe_held_place) is skipped */
    moe_u32 expert_stride;
    moe_u32 _pad2;
    moe_weight_desc w0;           /* gate (gate/up kernels) or down */
    moe_weight_desc w1;           /* up (gate/up kernels) */
} moe_ffn_params;

/* moe_combine: grid (ceil(hidden / MOE_COMBINE_THREADS), tokens); with has_next_norm
 * (1, tokens): one threadgroup per token, which reduces the row's sum of squares. */
typedef struct moe_combine_params {
    moe_u32 tokens;
    moe_u32 hidden;
    moe_u32 top_k;
    moe_u32 has_shared;
    moe_u32 has_residual;
    moe_u32 has_next_norm;        /* also write NORMED = rmsnorm(out) * (offset + weight) */
    float next_norm_eps;
    float next_norm_offset;
    moe_u32 experts;              /* the experts held: a pair whose id is not held */
    moe_u32 expert_base;          /* (moe_held_place) adds nothing */
    moe_u32 expert_stride;
    moe_u32 _pad1;
} moe_combine_params;

/* moe_load_activations_<dtype> / moe_store_activations_<dtype>: grid
 * (ceil(hidden / MOE_CONVERT_THREADS), tokens); element (t, h) of SRC converted to DST.
 * moe_quantize_q8 takes the same grid over any float32 rows (x: tokens rows of H; the
 * expert activations: pairs or tokens rows of I or Is), `hidden` their length. */
typedef struct moe_convert_params {
    moe_u32 tokens;
    moe_u32 hidden;
    moe_u32 _pad0;
    moe_u32 _pad1;
} moe_convert_params;

/* PARAMS-END */

#endif /* MOE_KERNEL_PARAMS_H */
