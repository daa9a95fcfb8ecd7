/*
 * moe_swift.h - the C ABI of libMoESwift: one Mixture-of-Experts feed-forward layer
 * (router, top-k, expert FFNs, weighted combine, shared expert, residual) in one call.
 *
 * This header is the single source of truth for the ABI. The Swift exports
 * (Sources/MoEKernels/CABI) are checked against it by the Swift tests, and the Python
 * package hands the text between the CFFI-BEGIN and CFFI-END markers to cffi unchanged
 * (after the enums it expands from moe_options.h's rows), so that part must stay plain C
 * declarations without preprocessor directives.
 *
 * What one forward computes is specified in docs/spec.md, "What one call computes" (mirrored by
 * python/moe_swift/reference.py). Arrays are dense and row-major; activations and the
 * float fields of moe_layer_desc are float32, ids int32. Weight matrices may instead be
 * given in other formats (float16, bfloat16, MLX's affine and mxfp4 quantizations)
 * through the moe_tensor fields; the layer keeps them in that format.
 *
 * Errors: every function that can fail returns a moe_status; on failure,
 * moe_last_error() returns a message for the calling thread that stays valid until the
 * next failing call on that thread. No input makes a function abort the process, except
 * pointers that do not point to arrays of the documented size, which C cannot check.
 */
#ifndef MOE_SWIFT_H
#define MOE_SWIFT_H

#include <stdint.h>

/* The options' vocabulary (moe_backend, moe_scoring, moe_activation, moe_format,
 * moe_dtype and the defaults of moe_layer_desc_init) is declared in its tables. */
#include "moe_options.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a function's meaning changes or a function is removed; adding fields at
 * the end of moe_layer_desc or adding functions does not bump it. */
#define MOE_SWIFT_ABI_VERSION 1

/* CFFI-BEGIN */

typedef enum moe_status {
    MOE_OK = 0,
    MOE_ERROR_INVALID_ARGUMENT = 1,  /* bad size, option, pointer or handle */
    MOE_ERROR_UNAVAILABLE = 2,       /* the requested backend is not available here */
    MOE_ERROR_OUT_OF_MEMORY = 3,
    MOE_ERROR_INTERNAL = 4           /* a bug: please report the message */
} moe_status;

/* A weight matrix in any format, in the moe_layer_desc fields named *_tensor. Its logical
 * shape is that of the float field of the same name, e.g. gate_proj_tensor (E, I, H);
 * quantization groups run along the last dimension. A tensor whose data is NULL is not
 * given. Quantized layouts are MLX's (mx.quantize):
 *   data:   packed codes, (..., rows, cols * bits / 32) uint32 words; each row is a
 *           little-endian bit stream, element 0 in the lowest bits (3, 5 and 6 bits
 *           cross word boundaries); mxfp4: 4-bit e2m1 codes;
 *   scales: (..., rows, cols / group_size), of scale_dtype for affine, uint8 E8M0 for mxfp4;
 *   biases: affine only, like scales.
 * Meaning: affine value = scale * q + bias; mxfp4 value = e2m1(code) * 2^(scale - 127).
 * ggml's block formats (MOE_FORMAT_GGML_*, MOE_GGML_TYPE_ROWS) read `data` only: each row
 * is cols / block_elems blocks exactly as ggml stores them (a GGUF tensor's bytes), the
 * scales inside the blocks; bits, group_size, scale_dtype, scales and biases are ignored.
 * Meaning: ggml's dequantization of each block (docs/formats.md, "ggml blocks"). */
typedef struct moe_tensor {
    int32_t format;          /* moe_format */
    int32_t bits;            /* affine: one of MOE_AFFINE_BITS_ROWS */
    int32_t group_size;      /* affine: one of MOE_AFFINE_GROUP_SIZE_ROWS; mxfp4: 32 (0 means 32) */
    int32_t scale_dtype;     /* affine: moe_dtype of scales and biases */
    const void* data;
    const void* scales;
    const void* biases;
} moe_tensor;

/* Everything that defines a layer. Fill it with moe_layer_desc_init() (which sets
 * struct_size and the defaults), then set what you need. The library reads only the
 * first struct_size bytes, so a caller built against an older, shorter header keeps
 * working when fields are appended. Weights are copied at creation (the caller may free
 * its arrays as soon as moe_layer_create returns), except those in mapped_memory. Optional arrays are NULL when absent.
 * Shapes: H = hidden_size, I = intermediate_size, E = num_experts, Is = shared size. */
typedef struct moe_layer_desc {
    uint32_t struct_size;             /* sizeof(moe_layer_desc) of the caller's header */
    int32_t backend;                  /* moe_backend */

    int64_t hidden_size;              /* H */
    int64_t intermediate_size;        /* I */
    int64_t num_experts;              /* E */
    int64_t top_k;                    /* k, 1 <= k <= E */

    /* router */
    int32_t scoring;                  /* moe_scoring */
    int32_t norm_topk_prob;           /* renormalise the k weights (0 / 1) */
    float routed_scaling_factor;
    int32_t n_group;                  /* group-limited routing; 1: off */
    int32_t topk_group;               /* groups kept */
    const float* router_weight;       /* (E, H), required */
    const float* router_bias;         /* (E) added to the logits */
    const float* selection_bias;      /* (E) changes which experts win, not weights */
    const float* per_expert_scale;    /* (E) multiplies the final weights */

    /* experts: either gate_proj + up_proj, or gate_up_proj */
    int32_t activation;               /* moe_activation */
    float swiglu_alpha;               /* swiglu_oai only */
    float swiglu_limit;               /* swiglu_oai only */
    const float* gate_proj;           /* (E, I, H) */
    const float* up_proj;             /* (E, I, H) */
    const float* gate_up_proj;        /* (E, 2I, H): gate rows [0, I), up rows [I, 2I) */
    const float* down_proj;           /* (E, H, I), required */
    const float* gate_up_bias;        /* (E, 2I) */
    const float* down_bias;           /* (E, H) */

    /* shared expert: present when shared_intermediate_size > 0 */
    int64_t shared_intermediate_size; /* Is */
    const float* shared_gate_proj;    /* (Is, H) */
    const float* shared_up_proj;      /* (Is, H) */
    const float* shared_down_proj;    /* (H, Is) */
    const float* shared_sigmoid_gate; /* (H): factor sigmoid(x . g); NULL: factor 1 */

    /* Appended after the first release (older callers' struct_size ends above): the weight
     * matrices in any format. Each replaces the float pointer of the same name, which must
     * then be NULL. */
    moe_tensor router_weight_tensor;
    moe_tensor gate_proj_tensor;
    moe_tensor up_proj_tensor;
    moe_tensor gate_up_proj_tensor;
    moe_tensor down_proj_tensor;
    moe_tensor shared_gate_proj_tensor;
    moe_tensor shared_up_proj_tensor;
    moe_tensor shared_down_proj_tensor;
    /* Appended later. memory_limit: bytes the layer's copies of its weights may take; 0
     * means no limit but the system's (MemAvailable, the cgroup's limit). Creating a layer
     * whose copies exceed the limit fails with MOE_ERROR_OUT_OF_MEMORY, naming the bytes,
     * before anything is allocated. */
    int64_t memory_limit;
    /* Weights read in place instead of copied: every weight matrix (float pointer or
     * *_tensor part) that lies inside the mapped_length bytes at mapped_memory is read
     * there for the layer's lifetime, wherever the backend's kernels read its layout as it
     * is (metal and softmetal: every format, the region wrapped with bytesNoCopy and each
     * tensor bound at its offset; cpu: all but 4-bit codes, which it repacks). mapped_memory
     * and mapped_length must be multiples of MOE_MAPPED_ALIGNMENT (16384: Apple silicon's
     * page, Metal's rule for bytesNoCopy buffers). mapped_release(mapped_context), if not
     * NULL, is called once when the library no longer reads the memory: when the last layer
     * reading it is destroyed, or before moe_layer_create returns if none does (a failure
     * included). */
    const void* mapped_memory;
    int64_t mapped_length;
    void (*mapped_release)(void* context);
    void* mapped_context;
    /* Appended later: the activations that enter quantized-format weight products
     * (moe_activation_quantization; moe_options.h gives the exact meaning of Q8). Dense
     * weights and the router always take float32 activations. */
    int32_t activation_quantization;
    /* Appended later: expert parallelism. The layer holds the num_local_experts routed
     * experts first_local_expert, first_local_expert + local_expert_stride, ... (stride 0
     * or 1: consecutive ids; num_local_experts 0: all E, the other two then 0):
     * gate_proj, up_proj, gate_up_proj, down_proj, gate_up_bias and down_bias have
     * num_local_experts in place of E, in that order; the router's arrays (router_weight, router_bias,
     * selection_bias, per_expert_scale) keep all E. Such a layer routes every token over all
     * E experts and returns the partial sum of the slots whose experts it holds, plus its
     * shared expert and residual when it is given them: layers holding disjoint shares of
     * which one has the shared expert and the residual sum to the whole layer, which the
     * host's own collective adds up (docs/distributed.md). next_norm and the stacks need the
     * whole sum and are refused. */
    int64_t first_local_expert;
    int64_t num_local_experts;
    int64_t local_expert_stride;
} moe_layer_desc;

typedef struct moe_layer moe_layer;   /* opaque */

/* MOE_SWIFT_ABI_VERSION of the loaded library. */
uint32_t moe_abi_version(void);

/* The message of the calling thread's last failure ("" if none), whole (a compiler's
 * output included); valid until the thread's next failing call. */
const char* moe_last_error(void);

/* 1 if the backend can be created in this process, else 0. */
int32_t moe_backend_available(int32_t backend);

/* The instruction set of the CPU backend's kernels: "avx512gfni" (AVX-512 with VNNI,
 * VBMI and GFNI), "avx512vnni", "avx512", "avx2" or "portable" (a static string). The best this
 * CPU has, or a lower one named by the environment variable MOE_CPU_ISA (read once per
 * process, before the first CPU forward). */
const char* moe_cpu_instruction_set(void);

/* The read bandwidth of this machine in GB/s (1e9 bytes per second) as the CPU backend's
 * kernels see it: a buffer of `bytes` (at least 64 MiB; on huge pages where the system
 * has them) is read by every worker thread of the CPU backend with the loads of
 * moe_cpu_instruction_set() (on AVX-512: 512-bit loads, and 256-bit ones, which dense
 * weights use), `repeats` times; the best time counts. For a benchmark's
 * roofline: no kernel here streams its weights faster. */
moe_status moe_measure_read_bandwidth(int64_t bytes, int32_t repeats, double* gb_per_s);

/* The time in seconds (and, when bytes_read is not NULL, the bytes) in which the CPU
 * backend's worker threads read `count` regions [starts[i], starts[i] + bytes[i]) once,
 * with moe_measure_read_bandwidth's loads: each region from its first 64-byte boundary in
 * whole 256-byte steps (a few bytes at its ends are left), in pieces of 64 KiB that the
 * threads claim as they claim a call's work items. The threads are woken before the clock
 * starts. Every byte of every region must be readable. For a benchmark's roof of one
 * call: the bytes that call reads, in the same places, read and nothing else (flush the
 * caches before it as before the call). */
moe_status moe_measure_read_time(const void* const* starts, const int64_t* bytes, int32_t count, double* seconds,
                                 int64_t* bytes_read);

/* Whether `bytes` more bytes of copies fit the budget that moe_layer_create checks its own
 * copies against: the smallest of memory_limit (0: none), MemAvailable of /proc/meminfo
 * and what the cgroup has left. MOE_OK if they fit; MOE_ERROR_OUT_OF_MEMORY with a message
 * naming `what` (may be NULL), the bytes and what is available if not. For hosts that
 * convert or gather weights before creating a layer: check the copies before making them,
 * then give the layer memory_limit less those bytes. */
moe_status moe_memory_check(int64_t bytes, int64_t memory_limit, const char* what);

/* Sets struct_size and every default (MOE_DEFAULT_* of moe_options.h); pointers NULL,
 * sizes 0. */
void moe_layer_desc_init(moe_layer_desc* desc);

/* Validates desc, copies the weights and creates the layer in *out. */
moe_status moe_layer_create(const moe_layer_desc* desc, moe_layer** out);

/* y = moe(x) (+ residual). x, residual, y: (num_tokens, H); residual may be NULL. y may be
 * x or residual (in place) or overlap them in any way (then the result goes through a
 * temporary). num_tokens may be 0. Safe to call from several threads at once. */
moe_status moe_layer_forward(moe_layer* layer, const float* x, int64_t num_tokens,
                             const float* residual, float* y);

/* An RMSNorm of a decoder block, per token row v of H floats:
 * v * (1 / sqrt(mean(v^2) + eps)) * (offset + weight), float32 accumulation.
 * weight NULL: no norm. */
typedef struct moe_rms_norm {
    const float* weight;              /* (H); read during the call only */
    float eps;                        /* > 0 and finite */
    float offset;                     /* 0; 1 for Gemma-style norms, which scale by (1 + weight) */
} moe_rms_norm;

/* One call of moe_layer_forward_ex: a decoder's whole post-attention block,
 *   h = residual + moe(input_norm(x)),  normed = next_norm(h)  (per token),
 * with both norms fused into the layer's own stages. Fill it with moe_forward_desc_init()
 * (struct_size, everything NULL / 0), then set what you need. The library reads only the
 * first struct_size bytes, so fields can be appended later. */
typedef struct moe_forward_desc {
    uint32_t struct_size;             /* sizeof(moe_forward_desc) of the caller's header */
    int32_t residual_is_input;        /* 1: the residual is x itself, before input_norm
                                         (then residual must be NULL) */
    const float* x;                   /* (num_tokens, H) */
    int64_t num_tokens;               /* may be 0 */
    const float* residual;            /* (num_tokens, H) or NULL; may alias y */
    float* y;                         /* (num_tokens, H): h; may be or overlap x or residual */
    moe_rms_norm input_norm;          /* normalise x before the router and experts */
    moe_rms_norm next_norm;           /* the next layer's norm of h, written to normed;
                                         without a residual, h = moe(x) */
    float* normed;                    /* (num_tokens, H), required with next_norm; must not
                                         overlap x, residual or y (an error) */
} moe_forward_desc;

/* Sets struct_size; everything else NULL / 0. */
void moe_forward_desc_init(moe_forward_desc* desc);

/* The forward of moe_forward_desc. Same threading rules as moe_layer_forward; on the
 * metal backends the norms add no dispatch. */
moe_status moe_layer_forward_ex(moe_layer* layer, const moe_forward_desc* desc);

/* The routed experts with the routing given (no router, no shared expert, no residual):
 * y[t] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) over the k slots in order.
 * ids (num_tokens, k) int32, each in [0, E) (checked: an invalid id is an error naming
 * it, nothing is read through it); weights (num_tokens, k) float32; x, y (num_tokens, H),
 * which may overlap. */
moe_status moe_layer_forward_routed(moe_layer* layer, const float* x, int64_t num_tokens,
                                    const int32_t* ids, const float* weights, float* y);

/* moe_layer_forward_routed on a framework's tensors as they are: x and y (num_tokens, H)
 * in x_dtype and y_dtype (moe_dtype: float32, float16 or bfloat16; y rounded to nearest
 * even), ids (num_tokens, k) of ids_bytes-byte signed integers (4 or 8: int64, as torch's
 * topk gives them), weights (num_tokens, k) in weights_dtype. The conversions happen in
 * the call, so that a host converts nothing; results equal moe_layer_forward_routed's on
 * the converted values. x and y may overlap only if they are the same bytes of one dtype. */
moe_status moe_layer_forward_routed_typed(moe_layer* layer, const void* x, int32_t x_dtype, int64_t num_tokens,
                                          const void* ids, int32_t ids_bytes, const void* weights,
                                          int32_t weights_dtype, void* y, int32_t y_dtype);

/* The router alone: ids (num_tokens, k) int32, in descending selection score, and
 * their final weights (num_tokens, k). */
moe_status moe_layer_route(moe_layer* layer, const float* x, int64_t num_tokens,
                           int32_t* ids, float* weights);

/* The backend the layer runs on (a moe_backend other than AUTO), or -1 for a bad handle. */
int32_t moe_layer_backend(const moe_layer* layer);

/* Frees the layer. NULL is ignored. The handle must not be used afterwards. */
void moe_layer_destroy(moe_layer* layer);

/* Several layers in one call, each layer's output feeding the next:
 * x_{i+1} = x_i + layer_i(x_i) for i = 0 .. num_layers-1, and y = x_{num_layers}.
 * All layers must run on the same backend and have the same hidden size H; x and y are
 * (num_tokens, H) and may alias or overlap. On the metal and softmetal backends the whole stack is
 * one command buffer with one wait at its end; on cpu it is a loop of forwards. */
moe_status moe_run_layers(moe_layer* const* layers, int64_t num_layers, const float* x,
                          int64_t num_tokens, float* y);

/* moe_run_layers as a stack of decoder post-attention blocks: with input_norms (num_layers
 * entries, each with a weight), x_{i+1} = x_i + layer_i(input_norms[i](x_i)); input_norms
 * NULL is moe_run_layers. */
moe_status moe_run_layers_ex(moe_layer* const* layers, int64_t num_layers, const float* x,
                             int64_t num_tokens, float* y, const moe_rms_norm* input_norms);

/* --- Encode, don't run (metal and softmetal backends) ------------------------------------
 * A forward or a stack recorded into the caller's Metal command buffer, reading and writing
 * the caller's Metal buffers: no commit, no wait, no copy through host memory, no device
 * allocation in steady state; the caller commits when it likes. Results equal those of
 * moe_layer_forward_ex / moe_run_layers_ex bit for bit once the command buffer completes.
 * Metal objects are passed as opaque pointers: on Apple platforms the id<MTL...> objects
 * themselves (from Objective-C: (__bridge void*)obj; from metal-cpp: the MTL:: pointer), on
 * Linux SoftMetal's objects (from Swift: Unmanaged.passUnretained(obj).toOpaque()); they are
 * borrowed for the call. A pointer that is not such an object cannot be detected.
 * With buffers Metal does not track (MLX's), the call's pass and the host's may run at
 * the same time unless the descriptor's fences or events order them.
 * Scratch buffers come from the layer's pool and go back when the command buffer completes
 * (a completed handler is added to it), so several command buffers may be in flight; the
 * command buffer must not be committed yet. That handler also holds the layer (weights,
 * their file mappings, pipelines) until the GPU is done, so moe_layer_free may follow the
 * encode call at once, even for a command buffer with unretained references (MLX makes
 * its own so); the caller's buffers are the caller's to keep alive until then. With `encoder` NULL the call makes, fills and
 * ends a compute encoder of its own on the command buffer (no other encoder of it may be
 * open); given, it is the caller's open compute encoder of that command buffer (serial, or
 * concurrent: the call then puts memory barriers between its stages and after its last),
 * left open with its pipeline and bindings changed. Metal offers no way to tell an
 * encoder that was already ended: Metal's validation layer stops the program at its first
 * use, SoftMetal fails the command buffer naming the misuse. Every argument is checked
 * before anything is recorded (an error leaves the command buffer as it was), every size
 * and offset with overflow-checked arithmetic; on the cpu backend the calls fail with
 * MOE_ERROR_UNAVAILABLE. */

/* Activations in a Metal buffer: (num_tokens, H) elements of dtype (moe_dtype; the layer
 * computes in float32 and converts float16 / bfloat16 rows on the GPU, rounding to nearest
 * even), row-major from byte `offset`, which must be a multiple of the element size. */
typedef struct moe_metal_array {
    void* buffer;                     /* id<MTLBuffer>; NULL: not given */
    int64_t offset;                   /* bytes */
    int32_t dtype;                    /* moe_dtype */
} moe_metal_array;

/* One encode call. Fill it with moe_encode_desc_init() (struct_size, NULLs, float32
 * dtypes), then set what you need. The library reads only the first struct_size bytes. */
typedef struct moe_encode_desc {
    uint32_t struct_size;             /* sizeof(moe_encode_desc) of the caller's header */
    int32_t residual_is_input;        /* 1: the residual is x itself, before input_norm */
    void* command_buffer;             /* id<MTLCommandBuffer>, required, not committed */
    void* encoder;                    /* id<MTLComputeCommandEncoder> open on it, or NULL */
    int64_t num_tokens;               /* may be 0 (nothing is recorded) */
    moe_metal_array x;                /* (num_tokens, H), required */
    moe_metal_array residual;         /* (num_tokens, H) or buffer NULL; may be y */
    moe_metal_array y;                /* (num_tokens, H), required; may be or overlap x or residual */
    moe_rms_norm input_norm;          /* as in moe_forward_desc; weights are host memory, */
    moe_rms_norm next_norm;           /* read during the call only */
    moe_metal_array normed;           /* (num_tokens, H), required with next_norm; must not
                                         overlap x, residual or y */
    /* Appended later (older callers' struct_size ends above). Ordering with the host's own
     * passes on buffers Metal does not track (MLX makes every buffer untracked); tracked
     * buffers need none of it. Fences apply to the call's pass (with `encoder` given: to
     * that whole pass, as Metal's do); events only with `encoder` NULL, as Metal encodes
     * them between encoders. */
    void* const* wait_fences;         /* id<MTLFence>[num_wait_fences]: the pass waits for each */
    void* const* update_fences;       /* id<MTLFence>[num_update_fences]: updated once it completes */
    int32_t num_wait_fences;
    int32_t num_update_fences;
    void* wait_event;                 /* id<MTLEvent> or NULL: the work starts once it reaches */
    uint64_t wait_value;              /* this value */
    void* signal_event;               /* id<MTLEvent> or NULL: set to signal_value once the */
    uint64_t signal_value;            /* work is done */
} moe_encode_desc;

/* Sets struct_size; pointers NULL, offsets 0, dtypes MOE_DTYPE_F32. */
void moe_encode_desc_init(moe_encode_desc* desc);

/* moe_layer_forward_ex recorded into desc->command_buffer. */
moe_status moe_layer_encode(moe_layer* layer, const moe_encode_desc* desc);

/* moe_layer_forward_routed recorded into desc->command_buffer: the routing is read on the
 * GPU from ids_buffer (num_tokens, k) int32 at byte ids_offset and weights_buffer
 * (num_tokens, k) float32 at byte weights_offset. The ids are not known when the call is
 * made, so they cannot be refused: a pair whose id is outside [0, E) selects no expert and
 * adds nothing to its token's output (moe_layer_forward_routed, which sees them, refuses
 * it). desc's residual, norms and normed must not be given. */
moe_status moe_layer_encode_routed(moe_layer* layer, const moe_encode_desc* desc, void* ids_buffer,
                                   int64_t ids_offset, void* weights_buffer, int64_t weights_offset);

/* moe_run_layers_ex recorded into desc->command_buffer (x, y, num_tokens, command_buffer
 * and encoder of desc; its residual, norms and normed must not be given). input_norms:
 * NULL, or num_layers norms, each with a weight. */
moe_status moe_run_layers_encode(moe_layer* const* layers, int64_t num_layers, const moe_encode_desc* desc,
                                 const moe_rms_norm* input_norms);

/* What the calling thread's last call (moe_layer_create, _forward, _route or
 * moe_run_layers) did on its device. Set struct_size = sizeof(moe_stats) first; only
 * the first struct_size bytes are written. On the cpu backend the Metal counters are 0. */
typedef struct moe_stats {
    uint32_t struct_size;             /* sizeof(moe_stats) of the caller's header */
    int32_t backend;                  /* moe_backend of the call; -1 before any call */
    int64_t tokens;                   /* rows of x */
    int64_t layers;                   /* layers run (1, or num_layers of moe_run_layers) */
    int64_t dispatches;               /* compute kernels encoded */
    int64_t command_buffers;          /* command buffers committed */
    int64_t cpu_waits;                /* times the CPU waited for the GPU */
    int64_t allocations;              /* device buffers created during the call */
    int64_t allocated_bytes;          /* their total length */
    /* Appended later (older callers' struct_size ends above): */
    int64_t host_copies;              /* activation arrays (x, residual, y, normed, ids,
                                         weights) copied between host memory and device
                                         buffers; 0 for the encode calls and on cpu */
} moe_stats;

moe_status moe_last_stats(moe_stats* out);

/* What a layer is: its sizes and backend (e.g. of a layer made from a checkpoint). Set
 * struct_size = sizeof(moe_layer_info) first; only the first struct_size bytes are written. */
typedef struct moe_layer_info {
    uint32_t struct_size;             /* sizeof(moe_layer_info) of the caller's header */
    int32_t backend;                  /* moe_backend the layer runs on */
    int64_t hidden_size;              /* H */
    int64_t intermediate_size;        /* I */
    int64_t num_experts;              /* E */
    int64_t top_k;                    /* k */
    int64_t shared_intermediate_size; /* Is, 0 without a shared expert */
    /* Appended later: the experts held (all: 0, E and 1). */
    int64_t first_local_expert;
    int64_t num_local_experts;
    int64_t local_expert_stride;
} moe_layer_info;

moe_status moe_layer_get_info(const moe_layer* layer, moe_layer_info* out);

/* --- Checkpoints -------------------------------------------------------------------------
 * A Hugging Face / mlx-lm checkpoint folder: config.json and *.safetensors (sharded through
 * model.safetensors.index.json, or one model.safetensors). model_types: mixtral, qwen2_moe,
 * qwen3_moe, olmoe, deepseek_v2, deepseek_v3, glm4_moe, gpt_oss, granitemoe; layouts: per-expert 2-D,
 * transformers 5 fused 3-D, gpt-oss's (bf16 or MXFP4 blocks) and mlx-lm's (quantized or not).
 * The files stay memory-mapped while the handle is open, and afterwards for as long as a
 * layer reads them: a layer reads its tensors in place from the mapping, in their stored
 * format, wherever its backend's kernels read that layout (metal and softmetal: every
 * format; cpu: all but 4-bit codes, which it repacks), and copies the rest once, so
 * closing the checkpoint after creating layers leaves each weight held once.
 * The folder is the boundary of what is read: config.json, the index and every shard it
 * names must be regular files inside it once symlinks are resolved (or inside the blob
 * store of a Hugging Face cache whose snapshot the folder is); shard names are relative
 * paths without "..". Everything config.json and the headers say is checked (types,
 * ranges, products, shapes against each other and the format) before a byte of tensor
 * data is read or a buffer is sized from it.
 * Or llama.cpp's GGUF files (v2/v3): a .gguf file, one split of a split model (all its
 * splits are read), or a folder without config.json holding one GGUF model; architectures
 * qwen3moe, qwen2moe, llama with experts, olmoe, deepseek2, glm4moe, gpt-oss, tensors in
 * their ggml type (docs/checkpoints.md, "GGUF"), checked as strictly. */

typedef struct moe_checkpoint moe_checkpoint;   /* opaque */

/* Reads config.json and the safetensors headers of the folder at path, or the GGUF
 * file(s) path names (a file-system path: its bytes are used as they are). */
moe_status moe_checkpoint_open(const char* path, moe_checkpoint** out);

/* The indices of the checkpoint's MoE layers, ascending (the layers below
 * num_hidden_layers whose block has tensors in the files and that config.json makes MoE
 * layers): the first min(count, capacity) are written to indices (which may be NULL when capacity is 0), their number to *count. */
moe_status moe_checkpoint_moe_layers(const moe_checkpoint* checkpoint, int32_t* indices, int32_t capacity,
                                     int32_t* count);

/* What MoE layer `layer` is (config.json's sizes, without overrides), before creating it:
 * e.g. its num_experts, to divide them among the ranks of a group. backend is
 * MOE_BACKEND_AUTO, first_local_expert 0 and num_local_experts E. */
moe_status moe_checkpoint_layer_info(const moe_checkpoint* checkpoint, int32_t layer, moe_layer_info* out);

/* Creates MoE layer `layer` (0-based, as in model.layers.{layer}) on backend. Options of
 * config.json may be overridden by name: override_names[i] = override_values[i] for
 * i < num_overrides (both NULL when 0). Names: top_k, norm_topk_prob (0/1),
 * routed_scaling_factor, scoring (moe_scoring), n_group, topk_group, activation
 * (moe_activation), swiglu_alpha, swiglu_limit, activation_quantization
 * (moe_activation_quantization). */
moe_status moe_layer_create_from_checkpoint(const moe_checkpoint* checkpoint, int32_t layer, int32_t backend,
                                            int32_t num_overrides, const char* const* override_names,
                                            const double* override_values, moe_layer** out);

/* How moe_layer_create_from_checkpoint_ex loads a layer. Fill it with
 * moe_load_options_init() (struct_size, everything 0), then set what you need. */
typedef struct moe_load_options {
    uint32_t struct_size;             /* sizeof(moe_load_options) of the caller's header */
    int32_t copy_weights;             /* 1: copy every tensor instead of reading the mapping in place */
    int64_t memory_limit;             /* as moe_layer_desc.memory_limit; 0: the system's */
    /* Appended later: expert parallelism (moe_layer_desc's fields of the same names). Only
     * the tensors of those experts are read (num_local_experts 0: all); the router's are
     * read whole. */
    int64_t first_local_expert;
    int64_t num_local_experts;
    int64_t local_expert_stride;
    int32_t without_shared_expert;    /* 1: leave the shared expert out (every rank but one) */
    /* Appended later: the shared expert split along its width into shared_expert_parts
     * (gate and up rows, down columns; 0 or 1: whole), this layer holding part
     * shared_expert_part: the parts' outputs sum to the whole expert's. A width that does
     * not split into whole quantization groups stays whole on part 0, none on the others
     * (moe_layer_info's shared_intermediate_size says which). */
    int32_t shared_expert_parts;
    int32_t shared_expert_part;
} moe_load_options;
/* Sets struct_size; everything else 0. */
void moe_load_options_init(moe_load_options* options);
/* moe_layer_create_from_checkpoint with options (NULL: the defaults). */
moe_status moe_layer_create_from_checkpoint_ex(const moe_checkpoint* checkpoint, int32_t layer, int32_t backend,
                                               int32_t num_overrides, const char* const* override_names,
                                               const double* override_values, const moe_load_options* options,
                                               moe_layer** out);
/* Frees the handle; the files stay mapped while layers made from it read them in place,
 * and those layers stay valid. NULL is ignored. */
void moe_checkpoint_close(moe_checkpoint* checkpoint);

/* CFFI-END */

#ifdef __cplusplus
}
#endif

#endif /* MOE_SWIFT_H */
