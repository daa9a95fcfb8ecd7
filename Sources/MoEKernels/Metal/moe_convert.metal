// moe_convert.metal - a caller's activations in float32, float16 or bfloat16 (the encode
// API's buffers) to and from the float32 rows the stages compute on. One instance per
// MOE_DTYPE_ROWS row, named moe_{load,store}_activations_<dtype name>; the float32 ones
// copy (a caller's buffer the stages cannot bind in place).
// float32 -> float16 rounds to nearest even (MSL's conversion rule); float32 -> bfloat16
// does the same on the bits, so that no `bfloat` type (MSL 3.1) is needed and a NaN stays
// a NaN (its payload's high bits kept, the quiet bit set).
// Also moe_quantize_q8: float32 rows replaced by their 8-bit activation grid values.
#include "moe_kernel_params.h"
#include "moe_common.h"

static inline float moe_activation_to_float(float v) { return v; }
static inline float moe_activation_to_float(half v) { return float(v); }
static inline float moe_activation_to_float(ushort v) { return as_type<float>(uint(v) << 16); }

static inline void moe_activation_from_float(float v, device float* out) { *out = v; }
static inline void moe_activation_from_float(float v, device half* out) { *out = half(v); }
static inline void moe_activation_from_float(float v, device ushort* out)
{
    const uint bits = as_type<uint>(v);
    if (isnan(v)) {
        *out = ushort((bits >> 16) | 0x40u);
        return;
    }
    *out = ushort((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// Grid: (ceil(hidden / MOE_CONVERT_THREADS), tokens) threadgroups of MOE_CONVERT_THREADS.
template <typename T>
kernel void moe_load_activations(constant moe_convert_params& p [[buffer(MOE_CONVERT_BUF_PARAMS)]],
                                 device const T* src [[buffer(MOE_CONVERT_BUF_SRC)]],   // (T, H) of the caller's dtype
                                 device float* dst [[buffer(MOE_CONVERT_BUF_DST)]],     // (T, H)
                                 uint2 group [[threadgroup_position_in_grid]],
                                 uint tid [[thread_index_in_threadgroup]])
{
    const uint h = group.x * MOE_CONVERT_THREADS + tid;
    if (group.y >= p.tokens || h >= p.hidden) return;
    const ulong i = (ulong)group.y * p.hidden + h;
    dst[i] = moe_activation_to_float(src[i]);
}

template <typename T>
kernel void moe_store_activations(constant moe_convert_params& p [[buffer(MOE_CONVERT_BUF_PARAMS)]],
                                  device const float* src [[buffer(MOE_CONVERT_BUF_SRC)]],  // (T, H)
                                  device T* dst [[buffer(MOE_CONVERT_BUF_DST)]],            // (T, H) of the caller's dtype
                                  uint2 group [[threadgroup_position_in_grid]],
                                  uint tid [[thread_index_in_threadgroup]])
{
    const uint h = group.x * MOE_CONVERT_THREADS + tid;
    if (group.y >= p.tokens || h >= p.hidden) return;
    const ulong i = (ulong)group.y * p.hidden + h;
    moe_activation_from_float(src[i], dst + i);
}

// bfloat16 travels as its bits (ushort).
#define MOE_ACTIVATION_STORAGE_F32 float
#define MOE_ACTIVATION_STORAGE_F16 half
#define MOE_ACTIVATION_STORAGE_BF16 ushort
#define MOE_INSTANTIATE_CONVERT(NAME, code, name, bytes) \
    template [[host_name("moe_load_activations_" name)]] [[kernel]] \
    decltype(moe_load_activations<MOE_ACTIVATION_STORAGE_##NAME>) moe_load_activations<MOE_ACTIVATION_STORAGE_##NAME>; \
    template [[host_name("moe_store_activations_" name)]] [[kernel]] \
    decltype(moe_store_activations<MOE_ACTIVATION_STORAGE_##NAME>) moe_store_activations<MOE_ACTIVATION_STORAGE_##NAME>;
MOE_DTYPE_ROWS(MOE_INSTANTIATE_CONVERT)

// The grid values of 8-bit activations (moe_options.h, MOE_ACTIVATION_QUANTIZATION_Q8):
// each row of p.hidden elements in blocks of MOE_Q8_ACTIVATION_BLOCK consecutive ones (the
// last may be shorter), per block amax = max |x|, d = amax / 127, x -> d * rint(x / d),
// |code| <= 127; a block of zeros stays zeros; a non-finite element makes its whole block
// NaN, so every product that reads the block is NaN. The expert kernels then read these
// values as they read any float32 rows, so every weight loader serves both modes.
// One simdgroup per block, one lane per element: p.hidden elements of row group.y from
// group.x * MOE_CONVERT_THREADS. src may be dst (in place: each lane reads its element
// before it writes it, and no other lane reads it).
// Under fast math x / d may round to the other neighbour, so in a near-tie the code can
// differ by one step from IEEE division: still a grid value within about d / 2 of x, and
// the clamp keeps |code| <= 127 whatever the quotient. A d that flushes to zero (subnormal
// amax) gives zeros, as an all-zero block does, never inf.
static_assert(MOE_Q8_ACTIVATION_BLOCK == MOE_SIMD_WIDTH && MOE_CONVERT_THREADS % MOE_SIMD_WIDTH == 0,
              "moe_quantize_q8: one simdgroup per block");
kernel void moe_quantize_q8(constant moe_convert_params& p [[buffer(MOE_CONVERT_BUF_PARAMS)]],
                            device const float* src [[buffer(MOE_CONVERT_BUF_SRC)]],   // (rows, hidden)
                            device float* dst [[buffer(MOE_CONVERT_BUF_DST)]],         // (rows, hidden)
                            uint2 group [[threadgroup_position_in_grid]],
                            uint tid [[thread_index_in_threadgroup]])
{
    if (group.y >= p.tokens) return;
    // Lanes past the row still take part in the block's reductions, as zeros.
    const uint h = group.x * MOE_CONVERT_THREADS + tid;
    const bool inside = h < p.hidden;
    const ulong i = (ulong)group.y * p.hidden + h;
    const float v = inside ? src[i] : 0.0f;
    // Finite by the exponent bits, so that no math mode assumes the test away.
    const bool finite = (as_type<uint>(v) & 0x7F800000u) != 0x7F800000u;
    const bool block_finite = simd_all(finite);
    const float amax = simd_max(block_finite ? fabs(v) : 0.0f);
    const float d = amax / 127.0f;
    const int code = d > 0.0f ? clamp(int(rint(v / d)), -127, 127) : 0;
    if (inside) dst[i] = block_finite ? d * float(code) : as_type<float>(0x7FC00000u);
}
