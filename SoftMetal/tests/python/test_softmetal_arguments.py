"""A launch's arguments through SoftMetal's harness: buffers by position or index and
read-only arrays, function constants by index and by name, and which arguments must be
bound (as Metal: those active after specialization, whichever path the dispatch takes)."""

import struct

import numpy as np
import pytest

import softmetal

pytestmark = pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++")


def test_dict_buffers_and_input_only_bytes(lib):
    x = np.arange(64, dtype=np.float32)
    out = np.zeros(1, np.float32)
    lib.launch("tree_sum", {1: out, 0: x.copy()}, threadgroups=(1,), threads_per_threadgroup=(64,),
               threadgroup_memory={0: 64 * 4})
    assert out[0] == x.sum()
    frozen = np.zeros(2, np.uint32)
    frozen.flags.writeable = False
    lib.launch("write_args", [np.zeros(4, np.uint32), frozen], threadgroups=(1,), threads_per_threadgroup=(1,))


FUNCTION_CONSTANTS = """
#include <metal_stdlib>
using namespace metal;
constant bool has_bias [[function_constant(0)]];
constant int scale [[function_constant(1)]];
constant half half_step [[function_constant(2)]];
constant bool has_scale = is_function_constant_defined(scale);
kernel void affine(device float* y [[buffer(0)]], device const float* bias [[buffer(1), function_constant(has_bias)]],
                   uint i [[thread_position_in_grid]]) {
    float v = float(i) * (has_scale ? float(scale) : 1.0f) + float(half_step);
    if (has_bias) v += bias[i];
    y[i] = v;
}
"""


def test_function_constants_through_the_harness():
    lib = softmetal.compile(FUNCTION_CONSTANTS)
    y = np.zeros(8, np.float32)
    bias = np.full(8, 100.0, np.float32)
    # By index and by name; the bias buffer exists only when has_bias is true.
    lib.launch("affine", {0: y, 1: bias}, threadgroups=(1,), threads_per_threadgroup=(8,),
               constants={0: True, "scale": 3, 2: 0.5})
    np.testing.assert_array_equal(y, np.arange(8) * 3 + 0.5 + 100)
    lib.launch("affine", [y], threadgroups=(1,), threads_per_threadgroup=(8,), constants={"has_bias": False})
    np.testing.assert_array_equal(y, np.arange(8))  # scale undefined: 1; half_step: 0
    with pytest.raises(softmetal.InvalidUsageError, match="no function constant with index 7.*has_bias \\(0, bool\\)"):
        lib.launch("affine", [y], threadgroups=(1,), threads_per_threadgroup=(8,), constants={7: 1})
    with pytest.raises(softmetal.InvalidUsageError, match="scale is int: 2.5 is not a value of that type"):
        lib.launch("affine", [y], threadgroups=(1,), threads_per_threadgroup=(8,), constants={"scale": 2.5})
    with pytest.raises(softmetal.InvalidUsageError, match="a key must be"):
        lib.launch("affine", [y], threadgroups=(1,), threads_per_threadgroup=(8,), constants={(0,): 1})


def test_parameters_the_kernel_never_uses_need_not_be_bound():
    # As in Metal: an argument the body never names may stay unbound; a used one may not.
    lib = softmetal.compile("""
kernel void k(device float* y [[buffer(0)]], device const float* spare [[buffer(1)]],
              threadgroup float* scratch [[threadgroup(0)]], uint i [[thread_position_in_grid]]) {
    y[i] = 2.0f;
}
kernel void uses(device float* y [[buffer(0)]], device const float* x [[buffer(1)]], uint i [[thread_position_in_grid]]) {
    y[i] = x[i];
}
""")
    y = np.zeros(4, np.float32)
    lib.launch("k", {0: y}, threadgroups=(1,), threads_per_threadgroup=(4,))
    np.testing.assert_array_equal(y, 2.0)
    with pytest.raises(softmetal.InvalidUsageError, match=r"buffer\(1\) \(`const float\* x`\) is not bound"):
        lib.launch("uses", {0: y}, threadgroups=(1,), threads_per_threadgroup=(4,))


_SPECIALIZED = """
constant bool use_x [[function_constant(0)]];
template <bool B> static inline void add(device float* y, device const float* b, uint i) {
    if (B) y[i] += b[i];
}
template <bool HasBias>
[[kernel]] void affine(device float* y [[buffer(0)]], device const float* bias [[buffer(1)]],
                       device const float* x [[buffer(2)]], constant int& n [[buffer(3)]],
                       threadgroup float* scratch [[threadgroup(0)]], uint i [[thread_position_in_grid]]) {
    y[i] = 2.0f;
    if constexpr (HasBias) { scratch[i] = bias[i]; y[i] += scratch[i]; }
    add<HasBias>(y, bias, i);
    if (use_x) y[i] += x[i];
}
template [[host_name("affine_plain")]] [[kernel]] decltype(affine<false>) affine<false>;
template [[host_name("affine_bias")]] [[kernel]] decltype(affine<true>) affine<true>;
kernel void runtime_branch(device float* y [[buffer(0)]], device const float* x [[buffer(1)]],
                           constant int& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    y[i] = n > 100 ? x[i] : 1.0f;
}
"""


def test_arguments_inactive_after_specialization_need_not_be_bound():
    # As Metal's reflection after specialization says (MTLArgument.isActive): an argument
    # whose every use a template argument or function constant removes (MLX launches gemv
    # without its bias) may stay unbound; an active one may not, whether or not this
    # dispatch's path reaches it (Metal's validation refuses it on every path).
    lib = softmetal.compile(_SPECIALIZED)
    y = np.zeros(4, np.float32)
    lib.launch("affine_plain", {0: y, 3: struct.pack("i", 4)}, threadgroups=(1,), threads_per_threadgroup=(4,),
               constants={"use_x": False})
    np.testing.assert_array_equal(y, 2.0)
    bias, x = np.arange(4, dtype=np.float32), np.full(4, 10, np.float32)
    lib.launch("affine_plain", {0: y, 2: x, 3: struct.pack("i", 4)}, threadgroups=(1,), threads_per_threadgroup=(4,),
               constants={"use_x": True})
    np.testing.assert_array_equal(y, 12.0)
    # The function constant makes x active: unbound, refused.
    with pytest.raises(softmetal.InvalidUsageError, match=r"kernel affine_plain: buffer\(2\) \(`const float\* x`\) is not bound"):
        lib.launch("affine_plain", {0: y, 3: struct.pack("i", 4)}, threadgroups=(1,), threads_per_threadgroup=(4,),
                   constants={"use_x": True})
    # The template argument makes bias and the threadgroup memory active.
    with pytest.raises(softmetal.InvalidUsageError, match=r"kernel affine_bias: buffer\(1\) \(`const float\* bias`\) is not bound"):
        lib.launch("affine_bias", {0: y, 3: struct.pack("i", 4)}, threadgroups=(1,), threads_per_threadgroup=(4,),
                   threadgroup_memory={0: 16}, constants={"use_x": False})
    with pytest.raises(softmetal.InvalidUsageError, match=r"kernel affine_bias: threadgroup\(0\) .* has no memory"):
        lib.launch("affine_bias", {0: y, 1: bias, 3: struct.pack("i", 4)}, threadgroups=(1,), threads_per_threadgroup=(4,),
                   constants={"use_x": False})
    lib.launch("affine_bias", {0: y, 1: bias, 3: struct.pack("i", 4)}, threadgroups=(1,), threads_per_threadgroup=(4,),
               threadgroup_memory={0: 16}, constants={"use_x": False})
    np.testing.assert_array_equal(y, 2.0 + 2 * bias)
    # A runtime condition keeps the argument active, though this launch never takes the branch.
    with pytest.raises(softmetal.InvalidUsageError, match=r"kernel runtime_branch: buffer\(1\) \(`const float\* x`\) is not bound"):
        lib.launch("runtime_branch", {0: y, 2: struct.pack("i", 4)}, threadgroups=(1,), threads_per_threadgroup=(4,))
