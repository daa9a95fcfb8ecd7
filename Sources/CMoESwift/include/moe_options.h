/*
 * moe_options.h - the vocabulary of every option, declared once.
 *
 * Each table is an X-macro: MOE_<TABLE>_ROWS(X) calls X once per row, one row per line.
 * Everything else is expanded from these rows:
 *   - C (moe_swift.h, the CPU kernels): the enums below, and the name lookups of
 *     Sources/CMoESwift/options.c that Swift calls;
 *   - MSL (moe_kernel_params.h includes this file): the same enums, and the kernel
 *     instances of MOE_SPECIALISATION_ROWS;
 *   - Swift: the imported enum constants and MOE_DEFAULT_* macros;
 *   - Python (moe_swift/options.py): reads the rows and defaults between OPTIONS-BEGIN and
 *     OPTIONS-END as text, so that part keeps one `X(...)` row or one `#define` per line.
 * docs/extending.md lists what else a new row needs.
 */
#ifndef MOE_OPTIONS_H
#define MOE_OPTIONS_H

/* OPTIONS-BEGIN */

/* Where a layer runs. X(NAME, code, "name") */
#define MOE_BACKEND_ROWS(X) \
    X(AUTO, 0, "auto") \
    X(CPU, 1, "cpu") \
    X(METAL, 2, "metal") \
    X(SOFTMETAL, 3, "softmetal")

/* How router scores are made from the logits. X(NAME, code, "name") */
#define MOE_SCORING_ROWS(X) \
    X(SOFTMAX, 0, "softmax") \
    X(SIGMOID, 1, "sigmoid")

/* The gated activation of every expert FFN, a = act(g, u).
 * X(NAME, code, "name", "the Hugging Face hidden_act values that mean it, space-separated")
 *   SILU:       silu(g) * u (SwiGLU: Mixtral, Qwen, DeepSeek, OLMoE, GLM)
 *   GELU_TANH:  gelu_tanh(g) * u (GeGLU with the tanh approximation)
 *   SWIGLU_OAI: gpt-oss: min(g, limit) * sigmoid(alpha * min(g, limit)) * (clip(u, +-limit) + 1)
 *               (no hidden_act names it: gpt-oss's modules carry alpha and limit)
 *   GELU:       gelu(g) * u, gelu(g) = g * (1 + erf(g / sqrt(2))) / 2 (GeGLU, exact)
 *   RELU:       max(g, 0) * u (ReGLU)
 *   SWIGLU_CLAMPED: silu(min(g, limit)) * clip(u, +-limit) (DeepSeek-V4, GLM-5 Next,
 *               Hunyuan V4: SwiGLU with swiglu_limit; no hidden_act names the clamp) */
#define MOE_ACTIVATION_ROWS(X) \
    X(SILU, 0, "silu", "silu swish") \
    X(GELU_TANH, 1, "gelu_tanh", "gelu_pytorch_tanh gelu_tanh gelu_new gelu_fast") \
    X(SWIGLU_OAI, 2, "swiglu_oai", "") \
    X(GELU, 3, "gelu", "gelu gelu_python") \
    X(RELU, 4, "relu", "relu") \
    X(SWIGLU_CLAMPED, 5, "swiglu_clamped", "")

/* The activations that enter a quantized-format weight product (gate/up, down, the shared
 * expert's; never the router's logits, never dense f32/f16/bf16 weights). X(NAME, code, "name")
 *   NONE: float32 as they are (the exact product of the weights' values)
 *   Q8:   8-bit, as ggml's dot products take them (docs/formats.md, "8-bit activations"):
 *         each row is cut into blocks of MOE_Q8_ACTIVATION_BLOCK consecutive elements; per
 *         block, in float32, amax = max |x_i|, d = amax / 127 (a block of zeros: d = 0,
 *         codes 0), q_i = round-to-nearest-even(x_i / d) (|q_i| <= 127; clamped there
 *         where a subnormal d has lost bits), and the block's
 *         values become d * q_i; the product is that of these grid values (a kernel may
 *         compute d_w * d_x * sum q_w q_x per block in integers). A non-finite element
 *         makes the products of its block NaN. Per element the error is at most
 *         d / 2 = amax / 254 of its own block, so an outlier channel spoils only its block. */
#define MOE_ACTIVATION_QUANTIZATION_ROWS(X) \
    X(NONE, 0, "none") \
    X(Q8, 1, "q8")

/* Element types: dense weights, affine scales and biases. X(NAME, code, "name", bytes) */
#define MOE_DTYPE_ROWS(X) \
    X(F32, 0, "float32", 4) \
    X(F16, 1, "float16", 2) \
    X(BF16, 2, "bfloat16", 2)

/* How a weight matrix is stored (docs/formats.md). X(NAME, code, "name")
 *   F32, F16, BF16: dense
 *   AFFINE: MLX affine, value = scale * q + bias per group (bits and group sizes below)
 *   MXFP4:  OCP MX FP4 as MLX stores it, e2m1 codes with an E8M0 scale per 32
 *   GGML_*: ggml's (llama.cpp's, GGUF's) block quantizations exactly as ggml stores them:
 *           a row is cols / block_elems blocks of block_bytes bytes, scales inside the
 *           blocks (MOE_GGML_TYPE_ROWS); the value of an element is ggml's dequantization.
 *           Their codes are 100 + ggml's type number. */
#define MOE_FORMAT_ROWS(X) \
    X(F32, 0, "float32") \
    X(F16, 1, "float16") \
    X(BF16, 2, "bfloat16") \
    X(AFFINE, 3, "affine") \
    X(MXFP4, 4, "mxfp4") \
    X(GGML_Q4_0, 102, "q4_0") \
    X(GGML_Q4_1, 103, "q4_1") \
    X(GGML_Q5_0, 106, "q5_0") \
    X(GGML_Q5_1, 107, "q5_1") \
    X(GGML_Q8_0, 108, "q8_0") \
    X(GGML_Q2_K, 110, "q2_K") \
    X(GGML_Q3_K, 111, "q3_K") \
    X(GGML_Q4_K, 112, "q4_K") \
    X(GGML_Q5_K, 113, "q5_K") \
    X(GGML_Q6_K, 114, "q6_K") \
    X(GGML_IQ4_NL, 120, "iq4_nl") \
    X(GGML_IQ4_XS, 123, "iq4_xs") \
    X(GGML_MXFP4, 139, "mxfp4_ggml")

/* ggml's tensor types that this layer reads (GGUF's tensor type field), and the format
 * each is kept in: X(FORMAT, ggml_type, block_elems, block_bytes), FORMAT a NAME of
 * MOE_FORMAT_ROWS. ggml's F32, F16 and BF16 are the dense formats. */
#define MOE_GGML_TYPE_ROWS(X) \
    X(F32, 0, 1, 4) \
    X(F16, 1, 1, 2) \
    X(BF16, 30, 1, 2) \
    X(GGML_Q4_0, 2, 32, 18) \
    X(GGML_Q4_1, 3, 32, 20) \
    X(GGML_Q5_0, 6, 32, 22) \
    X(GGML_Q5_1, 7, 32, 24) \
    X(GGML_Q8_0, 8, 32, 34) \
    X(GGML_Q2_K, 10, 256, 84) \
    X(GGML_Q3_K, 11, 256, 110) \
    X(GGML_Q4_K, 12, 256, 144) \
    X(GGML_Q5_K, 13, 256, 176) \
    X(GGML_Q6_K, 14, 256, 210) \
    X(GGML_IQ4_NL, 20, 32, 18) \
    X(GGML_IQ4_XS, 23, 256, 136) \
    X(GGML_MXFP4, 39, 32, 17)

/* The code widths and group sizes of affine quantization (MLX's). X(n) */
#define MOE_AFFINE_BITS_ROWS(X) X(2) X(3) X(4) X(5) X(6) X(8)
#define MOE_AFFINE_GROUP_SIZE_ROWS(X) X(32) X(64) X(128)

/* The formats with kernels of their own, on the CPU and in MSL: X(suffix, FORMAT, bits).
 * A weight takes the first row whose format and bits (0: any) are its own; `any` reads
 * format, bits, group size and scale type per call. MSL instantiates every kernel that
 * reads weights once per row under the host name <kernel>_<suffix>; the CPU kernels have
 * one driver per row (4-bit rows need the CPU's nibble order, else they run as `any`). */
#define MOE_SPECIALISATION_ROWS(X) \
    X(f32, F32, 0) \
    X(f16, F16, 0) \
    X(bf16, BF16, 0) \
    X(q4, AFFINE, 4) \
    X(q8, AFFINE, 8) \
    X(mxfp4, MXFP4, 0) \
    X(q4_0, GGML_Q4_0, 0) \
    X(q8_0, GGML_Q8_0, 0) \
    X(q4_K, GGML_Q4_K, 0) \
    X(q5_K, GGML_Q5_K, 0) \
    X(q6_K, GGML_Q6_K, 0) \
    X(mxfp4_ggml, GGML_MXFP4, 0) \
    X(any, AFFINE, 0)

/* The defaults of moe_layer_desc_init, one per line. */
#define MOE_DEFAULT_BACKEND MOE_BACKEND_AUTO
#define MOE_DEFAULT_SCORING MOE_SCORING_SOFTMAX
#define MOE_DEFAULT_NORM_TOPK_PROB 1
#define MOE_DEFAULT_ROUTED_SCALING_FACTOR 1.0f
#define MOE_DEFAULT_N_GROUP 1
#define MOE_DEFAULT_TOPK_GROUP 1
#define MOE_DEFAULT_ACTIVATION MOE_ACTIVATION_SILU
#define MOE_DEFAULT_SWIGLU_ALPHA 1.702f
#define MOE_DEFAULT_SWIGLU_LIMIT 7.0f
#define MOE_DEFAULT_ACTIVATION_QUANTIZATION MOE_ACTIVATION_QUANTIZATION_NONE
#define MOE_MXFP4_GROUP_SIZE 32
/* The elements per block of 8-bit activations (MOE_ACTIVATION_QUANTIZATION_ROWS' Q8). */
#define MOE_Q8_ACTIVATION_BLOCK 32
/* The alignment (address and length) of weights read in place (moe_layer_desc's
 * mapped_memory): Apple silicon's page, Metal's rule for bytesNoCopy buffers. */
#define MOE_MAPPED_ALIGNMENT 16384

/* OPTIONS-END */

#define MOE_OPTION_ENUM_BACKEND_(NAME, code, ...) MOE_BACKEND_##NAME = code,
#define MOE_OPTION_ENUM_SCORING_(NAME, code, ...) MOE_SCORING_##NAME = code,
#define MOE_OPTION_ENUM_ACTIVATION_(NAME, code, ...) MOE_ACTIVATION_##NAME = code,
#define MOE_OPTION_ENUM_ACTIVATION_QUANTIZATION_(NAME, code, ...) MOE_ACTIVATION_QUANTIZATION_##NAME = code,
#define MOE_OPTION_ENUM_DTYPE_(NAME, code, ...) MOE_DTYPE_##NAME = code,
#define MOE_OPTION_ENUM_FORMAT_(NAME, code, ...) MOE_FORMAT_##NAME = code,
#define MOE_OPTION_ENUM_SPECIALISATION_(suffix, ...) MOE_SPECIALISATION_##suffix,

typedef enum moe_backend { MOE_BACKEND_ROWS(MOE_OPTION_ENUM_BACKEND_) } moe_backend;
typedef enum moe_scoring { MOE_SCORING_ROWS(MOE_OPTION_ENUM_SCORING_) } moe_scoring;
typedef enum moe_activation { MOE_ACTIVATION_ROWS(MOE_OPTION_ENUM_ACTIVATION_) } moe_activation;
typedef enum moe_activation_quantization {
    MOE_ACTIVATION_QUANTIZATION_ROWS(MOE_OPTION_ENUM_ACTIVATION_QUANTIZATION_)
} moe_activation_quantization;
typedef enum moe_dtype { MOE_DTYPE_ROWS(MOE_OPTION_ENUM_DTYPE_) } moe_dtype;
typedef enum moe_format { MOE_FORMAT_ROWS(MOE_OPTION_ENUM_FORMAT_) } moe_format;
/* Indices of MOE_SPECIALISATION_ROWS, in row order (not part of the C ABI). */
typedef enum moe_specialisation {
    MOE_SPECIALISATION_ROWS(MOE_OPTION_ENUM_SPECIALISATION_) MOE_SPECIALISATION_COUNT
} moe_specialisation;

/* The defaults that name a row, as constants that Swift imports (it does not import a
 * macro that names an enum constant). */
enum moe_option_default_codes {
    MOE_DEFAULT_BACKEND_CODE = MOE_DEFAULT_BACKEND,
    MOE_DEFAULT_SCORING_CODE = MOE_DEFAULT_SCORING,
    MOE_DEFAULT_ACTIVATION_CODE = MOE_DEFAULT_ACTIVATION,
    MOE_DEFAULT_ACTIVATION_QUANTIZATION_CODE = MOE_DEFAULT_ACTIVATION_QUANTIZATION
};

#endif /* MOE_OPTIONS_H */
