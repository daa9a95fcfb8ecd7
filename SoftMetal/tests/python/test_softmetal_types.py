"""SoftMetal's MSL types through the kernel-level harness: half and bfloat rounding every
operation, bfloat in the usual arithmetic conversions, vector constructors and swizzles,
packed vectors, simdgroup matrices (float, half, bfloat), the types without `using
namespace metal`."""

import numpy as np
import pytest

import softmetal
from softmetal_testlib import bf16_round, from_bf16_bits, sizes, to_bf16_bits

pytestmark = pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++")


def test_half_rounds_every_operation(lib):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(50) * 0.9).astype(np.float16)
    out = np.zeros(3, np.float16)
    lib.launch("half_chain", [x, out, sizes(len(x))], threadgroups=(1,), threads_per_threadgroup=(1,))
    acc, prod = np.float16(0), np.float16(1)
    for v in x:
        acc = np.float16(acc + v)
        prod = np.float16(np.float16(prod * v) + np.float16(0.25))
    assert out[0] == acc and out[1] == prod and out[2] == np.float16(x[0] * x[1])
    # and it is not float arithmetic rounded once at the end
    assert out[0] != np.float16(x.astype(np.float32).sum()) or acc == np.float16(x.astype(np.float32).sum())


def test_bfloat_rounds_every_operation(lib):
    rng = np.random.default_rng(3)
    xf = rng.standard_normal(40).astype(np.float32) * 3
    x = to_bf16_bits(xf)
    out = np.zeros(3, np.uint16)
    widened = np.zeros(1, np.float32)
    lib.launch("bfloat_chain", [x, out, widened, sizes(len(x))], threadgroups=(1,), threads_per_threadgroup=(1,))
    xs = from_bf16_bits(x)
    acc, prod = np.float32(0), np.float32(1)
    for v in xs:
        acc = bf16_round(acc + v)[()]
        prod = bf16_round(bf16_round(prod * v) + np.float32(0.25))[()]
    got = from_bf16_bits(out)
    assert got[0] == acc and got[1] == prod
    assert widened[0] == np.float32(xs[0] * xs[1])
    assert got[2] == bf16_round(widened)[0]
    naive = bf16_round([xs.sum()])[0]
    assert got[0] != naive or acc == naive


def test_vector_constructors_and_swizzles(lib):
    out = np.zeros(32, np.float32)
    ints = np.array([-3, 1 << 20], np.int32)
    lib.launch("vectors", [out, ints], threadgroups=(1,), threads_per_threadgroup=(1,))
    expected = [1, 2, 5, 6, 6, 5, 7, 4, 2.5, 2.5, 2.5, 2.5, -3, 1 << 20, 3, 2, 1, 1 + 2 + 5,
                0.5, 1, 1.5, 2, 8, 9, 10, 11, 25, 5, 2.5 + 3.5, 2]
    np.testing.assert_array_equal(out[: len(expected)], np.array(expected, np.float32))


@pytest.mark.parametrize("m,n,k", [(8, 8, 8), (16, 32, 24), (24, 64, 40)])
def test_simdgroup_matrix_gemm_matches_numpy(lib, m, n, k):
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    sgs = 2 if (n // 8) % 2 == 0 else 1
    lib.launch("sg_gemm", [a, b, c, np.array([m, n, k, 0], np.uint32)],
               threadgroups=(n // 8 // sgs, m // 8), threads_per_threadgroup=(32 * sgs,), check_races=True)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_simdgroup_matrix_thread_elements_layout_and_transpose(lib):
    rng = np.random.default_rng(4)
    a = rng.integers(-4, 4, (8, 8)).astype(np.float16)
    out = np.zeros((8, 8), np.float32)
    lanes = np.zeros(64, np.float32)
    lib.launch("sg_elements", [a, out, lanes], threadgroups=(1,), threads_per_threadgroup=(32,))
    want = a.astype(np.float32) @ a.T.astype(np.float32) + np.eye(8, dtype=np.float32)
    for lane in range(32):
        q = lane // 4
        row = (q & 4) + (lane // 2) % 4
        col = (q & 2) * 2 + (lane % 2) * 2
        assert lanes[2 * lane] == want[row, col] and lanes[2 * lane + 1] == want[row, col + 1]
        want[row, col] *= 2
    np.testing.assert_array_equal(out, want)


def test_simdgroup_matrix_bfloat(lib):
    rng = np.random.default_rng(5)
    a = to_bf16_bits(rng.standard_normal((8, 8)))
    b = to_bf16_bits(rng.standard_normal((8, 8)))
    c0 = rng.standard_normal((8, 8)).astype(np.float32)
    c = c0.copy()
    d = np.zeros((8, 8), np.uint16)
    lib.launch("sg_bfloat", [a, b, c, d], threadgroups=(1,), threads_per_threadgroup=(32,))
    product = from_bf16_bits(a).astype(np.float64) @ from_bf16_bits(b).astype(np.float64)
    np.testing.assert_allclose(c, product + c0, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(from_bf16_bits(d), bf16_round(product.astype(np.float32)))


def test_types_need_no_using_namespace():
    lib = softmetal.compile("""
#include <metal_stdlib>
kernel void k(device float* x [[buffer(0)]], device half* h [[buffer(1)]], uint i [[thread_position_in_grid]]) {
    float4 v = float4(float2(1.0f, 2.0f), 3.0f, 4.0f);
    x[i] = v[i] + metal::exp(0.0f);
    h[i] = half(v[i]) * 0.5h;
}
""")
    x = np.zeros(4, np.float32)
    h = np.zeros(4, np.float16)
    lib.launch("k", [x, h], threadgroups=(1,), threads_per_threadgroup=(4,))
    np.testing.assert_array_equal(x, [2, 3, 4, 5])
    np.testing.assert_array_equal(h, [0.5, 1, 1.5, 2])


def test_a_vector_from_a_packed_vector_converts_each_component():
    """`float4(packed_char4)` (ggml's dequantize_q8_0): four components, not a splat of the first."""
    lib = softmetal.compile("""
#include <metal_stdlib>
using namespace metal;
kernel void k(device const char* x [[buffer(0)]], device float4* out [[buffer(1)]]) {
    device const packed_char4* q = (device const packed_char4*) x;
    out[0] = float4(q[0]) * 0.5f;
    out[1] = float4(packed_float3(float3(1.0f, 2.0f, 3.0f)), 4.0f);
}
""")
    out = np.zeros((2, 4), np.float32)
    lib.launch("k", [np.array([-8, 3, 0, 127], np.int8), out], threadgroups=(1,), threads_per_threadgroup=(1,))
    np.testing.assert_array_equal(out, [[-4, 1.5, 0, 63.5], [1, 2, 3, 4]])


def test_bfloat_takes_part_in_the_usual_arithmetic_conversions(lib):
    xf = np.array([1.5, 0.3, -2.75, 1e-3, 3.0e38, 7.0, -0.0, 65504.0], np.float32)
    x = to_bf16_bits(xf)
    xs = from_bf16_bits(x)
    n = len(x)
    picked, halves = np.zeros(n, np.float32), np.zeros(n, np.float16)
    with_int, from_half = np.zeros(n, np.uint16), np.zeros(n, np.uint16)
    lib.launch("bfloat_conversions", [x, picked, with_int, halves, from_half], threadgroups=(1,),
               threads_per_threadgroup=(n,))
    odd = np.arange(n) % 2 == 1
    np.testing.assert_array_equal(picked, np.where(odd, xs, np.float32(0.1)))  # 0.1 not rounded to bfloat
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(from_bf16_bits(with_int), bf16_round(xs * 3))
        h = xs.astype(np.float16)
    np.testing.assert_array_equal(halves, h)
    np.testing.assert_array_equal(from_bf16_bits(from_half), bf16_round(h.astype(np.float32)))
