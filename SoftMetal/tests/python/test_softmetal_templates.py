"""Templated kernels, the preprocessor and includes (MLX-style MSL) through SoftMetal's
harness: template instances under their host names from an included header, version-gated
instances, the combined kernel attribute, defines and predefined macros, compile errors
naming the MSL file and line (also in an included header), the standard library declaring
MSL's names only."""

import struct

import numpy as np
import pytest

import softmetal
from softmetal_testlib import from_bf16_bits, to_bf16_bits

pytestmark = pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++")

QUANT_HEADER = r"""
#pragma once
#include <metal_stdlib>
#include "dequant.h"
using namespace metal;

// y[row] = sum_k dequant(w[row, k]) * x[k]; w packs 32 / BITS codes per uint.
template <typename T, int BITS>
[[kernel, max_total_threads_per_threadgroup(64)]] void qmv(
    device const uint* w [[buffer(0)]], device const T* scales [[buffer(1)]],
    device const T* x [[buffer(2)]], device T* y [[buffer(3)]],
    constant uint& k [[buffer(4)]], uint row [[thread_position_in_grid]]) {
    constexpr uint per_word = 32 / BITS;
    float acc = 0.0f;
    for (uint i = 0; i < k; ++i) {
        uint word = w[(row * k + i) / per_word];
        acc += DEQUANT(word, i % per_word, BITS) * float(scales[row]) * float(x[i]);
    }
    y[row] = T(acc);
}
"""


QUANT_SOURCE = r"""
#include "quant/qmv.h"
#define instantiate_qmv(tname, T, bits) \
  template [[host_name("qmv_" #tname "_" #bits)]] [[kernel]] decltype(qmv<T, bits>) qmv<T, bits>;
instantiate_qmv(float32, float, 4)
instantiate_qmv(float16, half, 4)
// One more level so that QBITS (a -D define) expands before # stringizes it.
#define instantiate_qmv_expanded(tname, T, bits) instantiate_qmv(tname, T, bits)
#if defined(__HAVE_BFLOAT__) && __METAL_VERSION__ >= 310
instantiate_qmv_expanded(bfloat16, bfloat, QBITS)
#endif
"""


def quant_include_dir(tmp_path):
    """include/quant/qmv.h includes "dequant.h" next to itself (found only relative to it)."""
    (tmp_path / "include" / "quant").mkdir(parents=True)
    (tmp_path / "include" / "quant" / "qmv.h").write_text(QUANT_HEADER)
    (tmp_path / "include" / "quant" / "dequant.h").write_text(
        "#pragma once\n#define DEQUANT(word, j, bits) float(((word) >> ((j) * (bits))) & ((1u << (bits)) - 1))\n")
    return tmp_path / "include"


def qmv_reference(codes, scales, x):
    return (codes.astype(np.float32) * scales[:, None].astype(np.float32)) @ x.astype(np.float32)


def pack(codes, bits):
    per_word = 32 // bits
    flat = codes.reshape(-1, per_word).astype(np.uint32)
    return (flat << (np.arange(per_word, dtype=np.uint32) * bits)).sum(1).astype(np.uint32)


@pytest.mark.parametrize("name,dtype,bits", [("qmv_float32_4", np.float32, 4), ("qmv_float16_4", np.float16, 4),
                                             ("qmv_bfloat16_8", "bf16", 8)])
def test_template_instances_from_an_included_header_run_under_their_host_names(tmp_path, name, dtype, bits):
    lib = softmetal.compile(QUANT_SOURCE, include_dirs=[quant_include_dir(tmp_path)], defines={"QBITS": 8})
    rows, k = 8, 16
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, (rows, k))
    scales = np.array([0.5, 0.25, 1, 2, 0.125, 1.5, 0.75, 1], np.float32)
    x = rng.integers(-4, 5, k).astype(np.float32)
    if dtype == "bf16":  # exact in bfloat: small integers and powers of two
        s_in, x_in, y = to_bf16_bits(scales), to_bf16_bits(x), np.zeros(rows, np.uint16)
    else:
        s_in, x_in, y = scales.astype(dtype), x.astype(dtype), np.zeros(rows, dtype)
    lib.launch(name, [pack(codes, bits), s_in, x_in, y, struct.pack("I", k)], grid=(rows,),
               threads_per_threadgroup=(4,))
    got = from_bf16_bits(y) if dtype == "bf16" else y.astype(np.float32)
    np.testing.assert_allclose(got, qmv_reference(codes, scales, x), rtol=1e-2)


def test_no_bfloat_instances_before_msl_3_1_and_the_template_is_not_a_kernel(tmp_path):
    lib = softmetal.compile(QUANT_SOURCE, include_dirs=[str(quant_include_dir(tmp_path))], defines={"QBITS": 8},
                            metal_version=300)
    with pytest.raises(softmetal.InvalidUsageError, match=r"no kernel named qmv_bfloat16_8.*qmv_float16_4"):
        lib.launch("qmv_bfloat16_8", [], grid=(1,))
    with pytest.raises(softmetal.InvalidUsageError, match="no kernel named qmv "):
        lib.launch("qmv", [], grid=(1,))


def test_combined_kernel_attribute_limits_threads_per_threadgroup(tmp_path):
    lib = softmetal.compile(QUANT_SOURCE, include_dirs=[quant_include_dir(tmp_path)], defines={"QBITS": 8})
    with pytest.raises(softmetal.InvalidUsageError, match="exceeds maxTotalThreadsPerThreadgroup 64"):
        lib.launch("qmv_float32_4", [np.zeros(64, np.uint32), np.zeros(128, np.float32), np.zeros(16, np.float32),
                                     np.zeros(128, np.float32), struct.pack("I", 16)],
                   grid=(128,), threads_per_threadgroup=(128,))


def test_defines_and_predefined_macros():
    source = r"""
    kernel void macros(device int* out [[buffer(0)]]) {
        out[0] = __METAL_VERSION__;
    #ifdef __HAVE_BFLOAT__
        out[1] = __HAVE_BFLOAT__;
    #endif
        out[2] = WIDTH;
    #if FLAG
        out[3] = 1;
    #endif
    }
    """
    out = np.zeros(4, np.int32)
    softmetal.compile(source, defines={"WIDTH": 7, "FLAG": None}).launch("macros", [out], grid=(1,))
    assert out.tolist() == [310, 1, 7, 1]
    out[:] = 0
    softmetal.compile(source, defines={"WIDTH": "2 * 3", "FLAG": False}, metal_version=300).launch("macros", [out], grid=(1,))
    assert out.tolist() == [300, 0, 6, 0]


def test_unsupported_kernel_attribute_is_a_compile_error_with_the_msl_line():
    source = "#include <metal_stdlib>\n\ntemplate <typename T>\n[[kernel, visible]] void f(device T* x [[buffer(0)]]) {}\n"
    with pytest.raises(softmetal.CompileError) as e:
        softmetal.compile(source)
    message = str(e.value)
    assert "source.metal:4: error: the kernel attribute [[visible]] is not supported by SoftMetal" in message
    assert "MSL line 4: [[kernel, visible]]" in message
    assert "softmetal-generated" not in message


def test_compile_errors_in_an_included_header_name_its_file_and_line(tmp_path):
    include = quant_include_dir(tmp_path)
    header = include / "quant" / "qmv.h"
    header.write_text(QUANT_HEADER.replace("acc += DEQUANT", "acc += undeclared_scale * DEQUANT"))
    line = QUANT_HEADER.split("\n").index("        acc += DEQUANT(word, i % per_word, BITS) * float(scales[row]) * float(x[i]);") + 1
    with pytest.raises(softmetal.CompileError) as e:
        softmetal.compile(QUANT_SOURCE, include_dirs=[include], defines={"QBITS": 8})
    message = str(e.value)
    assert f"{header}:{line}:" in message and "undeclared_scale" in message, message
    assert f"qmv.h line {line}: acc += undeclared_scale" in message, message


def test_missing_include_is_a_compile_error():
    with pytest.raises(softmetal.CompileError, match=r"source.metal:2:\d+: (fatal )?error: 'nowhere.h' file not found"):
        softmetal.compile("// x\n#include \"nowhere.h\"\n")


def test_the_standard_library_declares_msl_names_only():
    """MSL has no erf: a stand-in metal::erf silently changed which erf a third-party
    kernel that brings its own (as MLX does) called."""
    src = """
    #include <metal_stdlib>
    using namespace metal;
    float erf(float a) { return a * 2; }
    kernel void k(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = erf(y[i]); }
    """
    y = np.ones(4, np.float32)
    softmetal.compile(src).launch("k", [y], grid=(4,), threads_per_threadgroup=(4,))
    assert y.tolist() == [2, 2, 2, 2]
    with pytest.raises(softmetal.CompileError, match="undeclared identifier 'erf'"):
        softmetal.compile("#include <metal_stdlib>\nusing namespace metal;\n"
                          "kernel void k(device float* y [[buffer(0)]]) { y[0] = erf(y[0]); }")
