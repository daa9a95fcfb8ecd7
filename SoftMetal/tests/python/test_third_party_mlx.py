"""MLX's Metal kernels (MIT), run on SoftMetal from their original files.

The files under tests/third_party/mlx/ are verbatim copies of
mlx/backend/metal/kernels/*.{metal,h} (repository and commit in tests/third_party/README.md,
SHA-256s checked by test_third_party_kernels.py::test_vendored_files_are_unmodified_copies).
MLX's build compiles each .metal file with `-I` of its repository root, so they are
compiled here with include directory tests/third_party/mlx. Each test launches kernels by
their [[host_name]] (as MLX's host code names them) and compares with NumPy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

sm = pytest.importorskip("softmetal")

if not sm.available():
    pytest.skip("SoftMetal needs Linux and clang++", allow_module_level=True)

MLX = Path(__file__).resolve().parents[1] / "third_party" / "mlx"
KERNELS = MLX / "mlx" / "backend" / "metal" / "kernels"

RNG = np.random.default_rng(4321)

_LIBS: dict[str, object] = {}


def mlx_library(name):
    """One of MLX's kernel files, compiled as MLX's build does (-I repository root)."""
    if name not in _LIBS:
        _LIBS[name] = sm.compile((KERNELS / name).read_text(), include_dirs=[str(MLX)])
    return _LIBS[name]


def scalar(value, dtype):
    return np.array([value], dtype=dtype).tobytes()


def to_bf16(x):
    """float32 -> bfloat16 bits (round to nearest even), as uint16."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ---- arange.metal: out[i] = start + i * step ----

@pytest.mark.parametrize("host_name,dtype", [("arangefloat32", np.float32), ("arangeint32", np.int32),
                                              ("arangeuint8", np.uint8), ("arangefloat16", np.float16)])
def test_mlx_arange(host_name, dtype):
    n = 200
    out = np.zeros(n, dtype=dtype)
    start, step = dtype(3), dtype(2)
    mlx_library("arange.metal").launch(host_name, buffers=[scalar(start, dtype), scalar(step, dtype), out],
                                       grid=(n, 1, 1), threads_per_threadgroup=(64, 1, 1))
    expected = (np.arange(n, dtype=np.int64) * 2 + 3).astype(dtype)
    np.testing.assert_array_equal(out, expected)


def test_mlx_arange_bfloat16():
    n = 100
    out = np.zeros(n, dtype=np.uint16)
    start, step = to_bf16(0.5), to_bf16(0.25)
    mlx_library("arange.metal").launch("arangebfloat16", buffers=[start.tobytes(), step.tobytes(), out],
                                       grid=(n, 1, 1), threads_per_threadgroup=(32, 1, 1), check_memory=True)
    # bfloat arithmetic: index * step rounds to bfloat, then start + that rounds again.
    prod = from_bf16(to_bf16(np.arange(n, dtype=np.float32) * 0.25))
    np.testing.assert_array_equal(from_bf16(out), from_bf16(to_bf16(0.5 + prod)))


# ---- unary.metal: out = op(in), contiguous; `v_` one element per thread, `vn_` N per thread ----

def _erfinv(y):
    # Newton on erf from NumPy-free math (np has no erfinv): start from a rational guess.
    from math import erf, exp, pi, sqrt
    out = []
    for v in y.astype(np.float64):
        x = 0.0
        for _ in range(60):
            x -= (erf(x) - v) / (2 / sqrt(pi) * exp(-x * x))
        out.append(x)
    return np.array(out)


def _erf(x):
    from math import erf
    return np.array([erf(v) for v in x.astype(np.float64)])


UNARY = {
    "Exp": (np.exp, lambda n: RNG.uniform(-5, 5, n)),
    "Expm1": (np.expm1, lambda n: RNG.uniform(-2, 2, n)),
    "Log1p": (np.log1p, lambda n: RNG.uniform(-0.9, 5, n)),
    "Sigmoid": (lambda x: 1 / (1 + np.exp(-x)), lambda n: RNG.uniform(-8, 8, n)),
    "Erf": (_erf, lambda n: RNG.uniform(-3, 3, n)),
    "ErfInv": (_erfinv, lambda n: RNG.uniform(-0.99, 0.99, n)),
    "Tanh": (np.tanh, lambda n: RNG.uniform(-4, 4, n)),
    "Rsqrt": (lambda x: 1 / np.sqrt(x), lambda n: RNG.uniform(0.1, 10, n)),
    "Sign": (np.sign, lambda n: RNG.uniform(-2, 2, n)),
    "Square": (np.square, lambda n: RNG.uniform(-3, 3, n)),
}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("prefix", ["v_", "vn_"])
def test_mlx_unary_float32(op, prefix):
    fn, gen = UNARY[op]
    n = 301  # odd: the vn_ kernels (2 floats per thread) take the tail branch
    x = gen(n).astype(np.float32)
    out = np.zeros_like(x)
    per_thread = 1 if prefix == "v_" else 2  # WorkPerThread<float>::n = 8 / sizeof(float)
    threads = -(-n // per_thread)
    mlx_library("unary.metal").launch(f"{prefix}{op}float32float32", buffers=[x, out, scalar(n, np.uint32)],
                                      grid=(threads, 1, 1), threads_per_threadgroup=(64, 1, 1))
    np.testing.assert_allclose(out, fn(x), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("op", ["Exp", "Sigmoid", "Erf", "Square"])
def test_mlx_unary_bfloat16(op):
    fn, gen = UNARY[op]
    n = 256
    x = to_bf16(gen(n))
    out = np.zeros_like(x)
    mlx_library("unary.metal").launch(f"v_{op}bfloat16bfloat16", buffers=[x, out, scalar(n, np.uint32)],
                                      grid=(n, 1, 1), threads_per_threadgroup=(64, 1, 1))
    np.testing.assert_allclose(from_bf16(out), fn(from_bf16(x)), rtol=1.6e-2, atol=1e-3)


# ---- binary.metal: c = op(a, b), contiguous (vv_), scalar-vector (sv_) and 2-D strided (g2_) ----

BINARY = {
    "Add": np.add, "Subtract": np.subtract, "Multiply": np.multiply, "Divide": np.divide,
    "Maximum": np.maximum, "Minimum": np.minimum, "Power": np.power,
    "LogAddExp": np.logaddexp, "ArcTan2": np.arctan2,
}


@pytest.mark.parametrize("op", sorted(BINARY))
def test_mlx_binary_vv_float32(op):
    n = 257
    a = RNG.uniform(0.5, 3, n).astype(np.float32)
    b = RNG.uniform(0.5, 3, n).astype(np.float32)
    c = np.zeros_like(a)
    mlx_library("binary.metal").launch(f"vv_{op}float32", buffers=[a, b, c, scalar(n, np.uint32)],
                                       grid=(n, 1, 1), threads_per_threadgroup=(64, 1, 1))
    np.testing.assert_allclose(c, BINARY[op](a, b), rtol=2e-6)


def test_mlx_binary_sv_and_vvn():
    n = 301
    a = np.array([2.5], dtype=np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    c = np.zeros_like(b)
    lib = mlx_library("binary.metal")
    lib.launch("sv_Multiplyfloat32", buffers=[a, b, c, scalar(n, np.uint32)],
               grid=(n, 1, 1), threads_per_threadgroup=(64, 1, 1))
    np.testing.assert_allclose(c, 2.5 * b, rtol=1e-6)
    a2 = RNG.standard_normal(n).astype(np.float32)
    c2 = np.zeros_like(b)
    lib.launch("vvn_Subtractfloat32", buffers=[a2, b, c2, scalar(n, np.uint32)],
               grid=(-(-n // 2), 1, 1), threads_per_threadgroup=(32, 1, 1), check_memory=True)
    np.testing.assert_allclose(c2, a2 - b, rtol=1e-6)


def test_mlx_binary_g2_strided():
    """`constant const int64_t a_strides[2]` parameters: arrays bound as buffers."""
    rows, cols = 7, 33
    a_full = RNG.standard_normal((cols, rows)).astype(np.float32)  # a is the transpose view
    b = RNG.standard_normal(cols).astype(np.float32)               # b broadcast along rows
    c = np.zeros((rows, cols), dtype=np.float32)
    a_strides = np.array([1, rows], dtype=np.int64)  # [row stride, column stride] of a^T
    b_strides = np.array([0, 1], dtype=np.int64)
    mlx_library("binary.metal").launch("g2_Addfloat32", buffers=[a_full, b, c, a_strides, b_strides],
                                       grid=(cols, rows, 1), threads_per_threadgroup=(32, 1, 1),
                                       check_memory=True)
    np.testing.assert_allclose(c, a_full.T + b[None, :], rtol=1e-6)


# ---- copy.metal: dst = cast(src), contiguous and 2-D strided ----

def test_mlx_copy_cast_and_strided():
    lib = mlx_library("copy.metal")
    n = 300
    src = RNG.standard_normal(n).astype(np.float32)
    dst = np.zeros(n, dtype=np.float16)
    lib.launch("v_copyfloat32float16", buffers=[src, dst, scalar(n, np.uint32)],
               grid=(n, 1, 1), threads_per_threadgroup=(64, 1, 1))
    np.testing.assert_array_equal(dst, src.astype(np.float16))
    dbf = np.zeros(n, dtype=np.uint16)
    lib.launch("v_copyfloat32bfloat16", buffers=[src, dbf, scalar(n, np.uint32)],
               grid=(n, 1, 1), threads_per_threadgroup=(64, 1, 1))
    np.testing.assert_array_equal(dbf, to_bf16(src))
    back = np.zeros(n, dtype=np.float16)  # static_cast<half>(bfloat): MSL converts
    lib.launch("v_copybfloat16float16", buffers=[dbf, back, scalar(n, np.uint32)],
               grid=(n, 1, 1), threads_per_threadgroup=(64, 1, 1))
    np.testing.assert_array_equal(back, from_bf16(dbf).astype(np.float16))
    rows, cols = 9, 20
    m = RNG.standard_normal((cols, rows)).astype(np.float32)
    out = np.zeros((rows, cols), dtype=np.float32)
    strides = np.array([1, rows], dtype=np.int64)
    lib.launch("g2_copyfloat32float32", buffers={0: m, 1: out, 3: strides},
               grid=(cols, rows, 1), threads_per_threadgroup=(32, 1, 1), check_memory=True)
    np.testing.assert_array_equal(out, m.T)


# ---- softmax.metal ----

@pytest.mark.parametrize("host_name,axis,threads", [
    ("block_softmax_float32", 256, 64),      # one read of 4 per thread
    ("block_softmax_float32", 250, 64),      # a partial last read
    # The looped kernel reads local_max[simd_lane_id] of all 32 simdgroups: MLX launches it
    # with 1024 threads (with fewer, the unwritten entries are poison and the result NaN).
    ("looped_softmax_float32", 5000, 1024),
])
def test_mlx_softmax_float32(host_name, axis, threads):
    rows = 3
    x = (RNG.standard_normal((rows, axis)) * 3).astype(np.float32)
    out = np.zeros_like(x)
    mlx_library("softmax.metal").launch(host_name, buffers=[x, out, scalar(axis, np.int32)],
                                        threadgroups=(rows, 1, 1), threads_per_threadgroup=(threads, 1, 1),
                                        check_memory=(axis == 250))
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-8)


def test_mlx_softmax_bfloat16():
    rows, axis = 2, 128
    xf = (RNG.standard_normal((rows, axis)) * 2).astype(np.float32)
    x = to_bf16(xf)
    out = np.zeros_like(x)
    mlx_library("softmax.metal").launch("block_softmax_bfloat16", buffers=[x, out, scalar(axis, np.int32)],
                                        threadgroups=(rows, 1, 1), threads_per_threadgroup=(32, 1, 1))
    xr = from_bf16(x)
    e = np.exp(xr - xr.max(axis=1, keepdims=True))
    np.testing.assert_allclose(from_bf16(out), e / e.sum(axis=1, keepdims=True), rtol=2e-2, atol=1e-4)


# ---- rms_norm.metal: out = x * rsqrt(mean(x^2) + eps) * w[i * w_stride] ----
# (w_stride 0 with a one-element weight: MLX's host code passes that when there is no weight.
# The function constant has_w (index 20) only matters to the vjp kernels.)

@pytest.mark.parametrize("host_name,axis,threads,w_stride", [
    ("rmsfloat32", 256, 64, 1),
    ("rmsfloat32", 254, 64, 0),
    ("rms_loopedfloat32", 5000, 1024, 1),  # MLX launches the looped kernel with 1024 threads
])
def test_mlx_rms_norm(host_name, axis, threads, w_stride):
    rows, eps = 3, 1e-5
    x = RNG.standard_normal((rows, axis)).astype(np.float32)
    w = RNG.standard_normal(axis if w_stride else 1).astype(np.float32)
    out = np.zeros_like(x)
    mlx_library("rms_norm.metal").launch(
        host_name,
        buffers=[x, w, out, scalar(eps, np.float32), scalar(axis, np.uint32), scalar(w_stride, np.uint32)],
        threadgroups=(rows, 1, 1), threads_per_threadgroup=(threads, 1, 1), constants={20: True},
        check_memory=(host_name == "rmsfloat32" and w_stride == 1))
    expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + eps)
    np.testing.assert_allclose(out, expected * (w if w_stride else w[0]), rtol=1e-5, atol=1e-6)


# ---- layer_norm.metal: out = (x - mean) / sqrt(var + eps) * w[i * w_stride] + b[i * b_stride] ----
# Launched as MLX's LayerNorm::eval_gpu does: the single-row kernel with 32 * ceil(ceil(axis / 8)
# / 32) threads, the looped one with 1024. `threadgroup float local_buffer[SIMD_SIZE] = {0};`
# compiles: the initializer is dropped (see SoftMetal/README.md), and the kernel zeroes
# the buffer itself (initialize_buffer) before any read, so the memory check finds nothing
# uninitialised.

def _layer_norm_ref(x, w, b, eps):
    x64 = x.astype(np.float64)
    return (x64 - x64.mean(axis=1, keepdims=True)) / np.sqrt(x64.var(axis=1, keepdims=True) + eps) * w + b


@pytest.mark.parametrize("host_name,dtype,axis,threads,strides,checks", [
    ("layer_normfloat32", np.float32, 256, 32, 1, {"check_memory": True}),
    ("layer_normfloat32", np.float32, 1024, 128, 1, {"check_memory": True, "schedule": "run-ahead"}),
    pytest.param("layer_normfloat32", np.float32, 1000, 128, 0, {"schedule": "run-ahead"},  # see the next test
                 marks=pytest.mark.own_checks),
    ("layer_normfloat16", np.float16, 512, 64, 1, {}),
    ("layer_norm_loopedfloat32", np.float32, 8000, 1024, 1, {}),
])
def test_mlx_layer_norm(host_name, dtype, axis, threads, strides, checks):
    rows, eps = 3, 1e-5
    x = RNG.standard_normal((rows, axis)).astype(dtype)
    w = RNG.standard_normal(axis if strides else 1).astype(dtype)
    b = RNG.standard_normal(axis if strides else 1).astype(dtype)
    out = np.zeros_like(x)
    mlx_library("layer_norm.metal").launch(
        host_name,
        buffers=[x, w, b, out, scalar(eps, np.float32), scalar(axis, np.uint32), scalar(strides, np.uint32),
                 scalar(strides, np.uint32)],
        threadgroups=(rows, 1, 1), threads_per_threadgroup=(threads, 1, 1), **checks)
    ref = _layer_norm_ref(x, w.astype(np.float64), b.astype(np.float64), eps)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=2e-3, atol=4e-3)
    np.testing.assert_allclose(out.astype(np.float64), ref, **tol)


def test_mlx_layer_norm_writes_before_a_thread_private_array():
    """A finding in unmodified layer_norm_single_row: with MLX's own launch for an axis of
    1000 (125 threads needed, 128 launched), threads 126 and 127 have n = axis - lid * 8 < 0
    and run `for (int i = n; i < N_READS; i++) thread_x[i] = mean;`, writing thread_x[-8..-1]
    and thread_x[-16..-1]: outside a thread-private array. The output is still right here (see
    test_mlx_layer_norm); in the memory check's build the stray stores overwrite the saved
    threadgroup pointer of threadgroup_sum, whose next read is reported as wild (MSL line 42)."""
    axis, rows = 1000, 2
    x = RNG.standard_normal((rows, axis)).astype(np.float32)
    w = np.ones(axis, np.float32)
    out = np.zeros_like(x)
    with pytest.raises(sm.OutOfBoundsError, match=r"layer_normfloat32: out-of-bounds read .* by thread 12[67] .*MSL line 42"):
        mlx_library("layer_norm.metal").launch(
            "layer_normfloat32",
            buffers=[x, w, w, out, scalar(1e-5, np.float32), scalar(axis, np.uint32), scalar(1, np.uint32),
                     scalar(1, np.uint32)],
            threadgroups=(rows, 1, 1), threads_per_threadgroup=(128, 1, 1), check_memory=True)


def test_mlx_vjp_layer_norm():
    """The gradient: gx = rstd * (w g - mean(w g)) - xhat * rstd * mean(w g xc) / (var + eps),
    and gw per row = g * xhat (MLX sums the rows in a second kernel)."""
    rows, axis, eps = 3, 256, 1e-5
    x = RNG.standard_normal((rows, axis)).astype(np.float32)
    w = RNG.standard_normal(axis).astype(np.float32)
    g = RNG.standard_normal((rows, axis)).astype(np.float32)
    gx = np.zeros_like(x)
    gw = np.zeros_like(x)
    mlx_library("layer_norm.metal").launch(
        "vjp_layer_normfloat32",
        buffers=[x, w, g, gx, gw, scalar(eps, np.float32), scalar(axis, np.uint32), scalar(1, np.uint32)],
        threadgroups=(rows, 1, 1), threads_per_threadgroup=(32, 1, 1), constants={20: True}, check_memory=True)
    x64, w64, g64 = x.astype(np.float64), w.astype(np.float64), g.astype(np.float64)
    xc = x64 - x64.mean(axis=1, keepdims=True)
    rstd = 1 / np.sqrt((xc ** 2).mean(axis=1, keepdims=True) + eps)
    wg = w64 * g64
    ref_gx = rstd * (wg - wg.mean(axis=1, keepdims=True)) - xc * rstd ** 3 * (wg * xc).mean(axis=1, keepdims=True)
    np.testing.assert_allclose(gx, ref_gx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gw, g64 * xc * rstd, rtol=1e-5, atol=1e-6)


# ---- arg_reduce.metal: argmin / argmax along the last axis ----

@pytest.mark.parametrize("host_name,dtype", [("argmax_float32", np.float32), ("argmin_float32", np.float32),
                                              ("argmax_int32", np.int32), ("argmin_float16", np.float16)])
def test_mlx_arg_reduce(host_name, dtype):
    rows, axis, threads = 5, 300, 64
    x = (RNG.standard_normal((rows, axis)) * 100).astype(dtype)
    x[1, 17] = x[1, 200] = x[1].max() + 1 if "max" in host_name else x[1].min() - 1  # ties: the first index
    out = np.zeros(rows, dtype=np.uint32)
    mlx_library("arg_reduce.metal").launch(
        host_name,
        buffers=[x, out, np.array([rows], np.int32), np.array([axis], np.int64), np.array([1], np.int64),
                 scalar(1, np.uint64), scalar(1, np.int64), scalar(axis, np.uint64)],
        grid=(threads, rows, 1), threads_per_threadgroup=(threads, 1, 1),
        check_memory=(host_name == "argmax_float32"))
    expected = x.argmax(axis=1) if "max" in host_name else x.argmin(axis=1)
    np.testing.assert_array_equal(out, expected)


# ---- ternary.metal: d = a ? b : c (Select), contiguous, scalar-vector and 2-D strided ----

def test_mlx_ternary_select():
    lib = mlx_library("ternary.metal")
    n = 203
    a = RNG.random(n) < 0.5
    b = RNG.standard_normal(n).astype(np.float32)
    c = RNG.standard_normal(n).astype(np.float32)
    d = np.zeros_like(b)
    lib.launch("v_Selectfloat32", buffers=[a, b, c, d, scalar(n, np.uint32)],
               grid=(n, 1, 1), threads_per_threadgroup=(64, 1, 1))
    np.testing.assert_array_equal(d, np.where(a, b, c))
    d = np.zeros_like(b)
    lib.launch("vs_Selectfloat32", buffers=[a, b, c[:1].copy(), d, scalar(n, np.uint32)],
               grid=(n, 1, 1), threads_per_threadgroup=(64, 1, 1), check_memory=True)
    np.testing.assert_array_equal(d, np.where(a, b, c[0]))
    rows, cols = 6, 40
    a2 = RNG.random((rows, cols)) < 0.3
    b2 = RNG.standard_normal((cols, rows)).astype(np.int32)  # used transposed
    c2 = RNG.integers(-100, 100, cols).astype(np.int32)      # broadcast along rows
    d2 = np.zeros((rows, cols), dtype=np.int32)
    lib.launch("g2_Selectint32", buffers=[a2, b2, c2, d2, np.array([cols, 1], np.int64),
                                          np.array([1, rows], np.int64), np.array([0, 1], np.int64)],
               grid=(cols, rows, 1), threads_per_threadgroup=(32, 1, 1), check_memory=True)
    np.testing.assert_array_equal(d2, np.where(a2, b2.T, c2[None, :]))


# ---- logsumexp.metal: log(sum(exp(x))) over rows ----

@pytest.mark.parametrize("host_name,axis,threads", [
    ("block_logsumexp_float32", 300, 128),
    ("looped_logsumexp_float32", 5000, 1024),
])
def test_mlx_logsumexp(host_name, axis, threads):
    rows = 3
    x = (RNG.standard_normal((rows, axis)) * 4).astype(np.float32)
    out = np.zeros(rows, dtype=np.float32)
    mlx_library("logsumexp.metal").launch(host_name, buffers=[x, out, scalar(axis, np.int32)],
                                          threadgroups=(rows, 1, 1), threads_per_threadgroup=(threads, 1, 1),
                                          check_memory=(host_name.startswith("block")))
    m = x.astype(np.float64).max(axis=1)
    expected = m + np.log(np.exp(x - m[:, None]).sum(axis=1))
    np.testing.assert_allclose(out, expected, rtol=1e-5)


# ---- rope.metal: rotary position embedding (function constants forward=1, traditional=2,
# hs_transpose=3; `base` arrives as log2(base), as MLX's host code passes it) ----

def _rope_reference(x, positions, scale, base, traditional, forward=True):
    """x: (..., L, D) float64; positions: (..., L) offsets of each row."""
    d = x.shape[-1]
    half = d // 2
    inv = 2.0 ** (-(np.arange(half) / half) * np.log2(base))
    theta = (scale * positions)[..., None] * inv
    c, s = np.cos(theta), np.sin(theta)
    if traditional:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        x1, x2 = x[..., :half], x[..., half:]
    if forward:
        r1, r2 = x1 * c - x2 * s, x1 * s + x2 * c
    else:
        r1, r2 = x2 * s + x1 * c, x2 * c - x1 * s
    out = np.empty_like(x)
    if traditional:
        out[..., 0::2], out[..., 1::2] = r1, r2
    else:
        out[..., :half], out[..., half:] = r1, r2
    return out


@pytest.mark.parametrize("traditional", [False, True])
def test_mlx_rope_single(traditional):
    rows, dims, offset, scale, base = 6, 64, 37, 1.0, 10000.0
    x = RNG.standard_normal((rows, dims)).astype(np.float32)
    out = np.zeros_like(x)
    mlx_library("rope.metal").launch(
        "rope_single_float32",
        buffers={0: x, 1: out, 2: scalar(offset, np.int32), 3: scalar(scale, np.float32),
                 4: scalar(dims, np.int64), 10: scalar(np.log2(base), np.float32)},
        grid=(dims // 2, rows, 1), threads_per_threadgroup=(32, 1, 1),
        constants={1: True, 2: traditional, 3: False}, check_memory=not traditional)
    expected = _rope_reference(x.astype(np.float64), np.full(rows, offset, np.float64), scale, base, traditional)
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("forward", [True, False])
def test_mlx_rope_batched(forward):
    """rope_float32: (B, H, L, D) with per-batch offsets, 4 heads per thread (N = 4), 6 heads
    (the last thread's loop stops at n_head), strides through `constant const int64_t [3]`."""
    b, h, seq, dims, scale, base = 2, 6, 5, 32, 0.5, 500.0
    x = RNG.standard_normal((b, h, seq, dims)).astype(np.float32)
    out = np.zeros_like(x)
    offsets = np.array([3, 11], dtype=np.int32)
    strides = np.array([seq * dims, dims, 1], dtype=np.int64)
    n_head_up = 4 * ((h + 3) // 4)
    mlx_library("rope.metal").launch(
        "rope_float32",
        buffers={0: x, 1: out, 2: offsets, 3: scalar(scale, np.float32), 4: strides, 5: strides,
                 6: scalar(1, np.int64), 7: scalar(h, np.int32), 10: scalar(np.log2(base), np.float32)},
        grid=(dims // 2, seq, b * n_head_up // 4), threads_per_threadgroup=(16, 1, 1),
        constants={1: forward, 2: False, 3: False}, check_memory=forward)
    positions = (np.arange(seq)[None, :] + offsets[:, None]).astype(np.float64)[:, None, :]  # (B, 1, L)
    expected = _rope_reference(x.astype(np.float64), np.broadcast_to(positions, (b, h, seq)), scale, base,
                               False, forward)
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5)


# ---- scan.metal: cumulative sum / product / max along rows (contiguous_scan) ----

def _scan_reference(x, op, inclusive, reverse):
    y = x[:, ::-1] if reverse else x
    acc = {"sum": np.cumsum, "prod": np.cumprod, "max": np.maximum.accumulate}[op](y, axis=1)
    if not inclusive:
        init = {"sum": 0, "prod": 1, "max": -np.inf}[op]
        acc = np.concatenate([np.full((x.shape[0], 1), init, dtype=acc.dtype), acc[:, :-1]], axis=1)
    return acc[:, ::-1] if reverse else acc


def _scan_threads(axis, n_reads=4):
    """MLX's thread count for a contiguous scan (mlx/backend/metal/scan.cpp)."""
    per_simd = n_reads * 32
    if axis <= n_reads * 1024:
        return -(-axis // per_simd) * 32
    if axis <= n_reads * 2048:
        return -(-(axis // 2) // per_simd) * 32
    return 1024


@pytest.mark.parametrize("kind", ["inclusive", "exclusive", "reverse_inclusive", "reverse_exclusive"])
@pytest.mark.parametrize("op,axis", [("sum", 1000), ("prod", 37), ("max", 300), ("sum", 5000)])
def test_mlx_contiguous_scan(kind, op, axis):
    rows = 3
    x = (RNG.uniform(0.9, 1.1, (rows, axis)) if op == "prod" else RNG.standard_normal((rows, axis))).astype(np.float32)
    out = np.zeros_like(x)
    threads = _scan_threads(axis)
    mlx_library("scan.metal").launch(
        f"contig_scan_{kind}_{op}_float32_float32", buffers=[x, out, scalar(axis, np.uint64)],
        threadgroups=(1, rows, 1), threads_per_threadgroup=(threads, 1, 1),
        check_memory=(threads == 1024 and kind in ("inclusive", "reverse_exclusive")))
    expected = _scan_reference(x.astype(np.float64), op, not kind.endswith("exclusive"), kind.startswith("reverse"))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3 if axis > 1000 else 1e-4)


def test_mlx_scan_reads_unwritten_simdgroup_sums():
    """Found by the memory check in unmodified code: with fewer than 32 simdgroups (MLX's own
    launch for axis 1000: 256 threads) simdgroup 0 scans `simdgroup_sums[simd_lane_id]` over
    all 32 lanes, reading entries no simdgroup wrote. Harmless (an exclusive scan: the lanes
    whose results are used only see written entries), but a read of undefined memory."""
    axis = 1000
    x = RNG.standard_normal((1, axis)).astype(np.float32)
    out = np.zeros_like(x)
    with pytest.raises(sm.UninitializedReadError, match=r"scan\.h line \d+"):
        mlx_library("scan.metal").launch(
            "contig_scan_inclusive_sum_float32_float32", buffers=[x, out, scalar(axis, np.uint64)],
            threadgroups=(1, 1, 1), threads_per_threadgroup=(_scan_threads(axis), 1, 1), check_memory=True)


# ---- sort.metal: one threadgroup sorts one row (block merge sort), values or indices ----

@pytest.mark.parametrize("host_name,axis,threads", [
    ("c_block_sort_float32_float32_bn128_tn4", 500, 128),
    ("carg_block_sort_float32_uint32_bn128_tn4", 500, 128),
    ("c_block_sort_int32_int32_bn32_tn4", 100, 32),
    ("carg_block_sort_int32_uint32_bn32_tn4", 128, 32),
])
def test_mlx_block_sort(host_name, axis, threads):
    rows = 3
    is_int = "int32_" in host_name.split("sort_")[1][:6]
    x = (RNG.integers(-20, 20, (rows, axis)).astype(np.int32) if is_int
         else RNG.standard_normal((rows, axis)).astype(np.float32))
    arg = "arg" in host_name
    out = np.zeros((rows, axis), dtype=np.uint32 if arg else x.dtype)
    mlx_library("sort.metal").launch(
        host_name, buffers=[x, out, scalar(axis, np.int32), scalar(1, np.int32), scalar(1, np.int32),
                            scalar(axis, np.int32), scalar(axis, np.int32)],
        threadgroups=(1, rows, 1), threads_per_threadgroup=(threads, 1, 1), check_memory=(axis == 500))
    if arg:
        np.testing.assert_array_equal(out, np.argsort(x, axis=1, kind="stable"))
    else:
        np.testing.assert_array_equal(out, np.sort(x, axis=1))


# ---- gemv.metal: out = mat @ vec (and alpha * out + beta * bias), MLX's kernel choice ----
# Bound as MLX's gemv_axbpy (matmul.cpp) binds them: bias (2), alpha (7), beta (8) and the
# bias strides (13, 14) only for axpby. gemv names them in code that `if constexpr` drops
# for axpby0, so they are inactive after specialization and stay unbound, as in Metal.

@pytest.mark.parametrize("m,k,host_name,group", [
    (100, 300, "gemv_float32_bm4_bn1_sm1_sn32_tm4_tn4_nc0_axpby0", (32, 1, 4)),  # a partial last threadgroup
    (70, 64, "gemv_float32_bm1_bn1_sm8_sn4_tm4_tn4_nc0_axpby0", (32, 1, 1)),     # K <= 64: 8 rows per simdgroup
    (10, 2000, "gemv_float32_bm1_bn8_sm1_sn32_tm4_tn4_nc0_axpby0", (32, 8, 1)),  # K >= 16 M: 8 simdgroups split K
    (100, 300, "gemv_float32_bm4_bn1_sm1_sn32_tm4_tn4_nc0_axpby1", (32, 1, 4)),  # alpha * mat @ vec + beta * bias
])
def test_mlx_gemv(m, k, host_name, group):
    mat = RNG.standard_normal((m, k)).astype(np.float32)
    vec = RNG.standard_normal(k).astype(np.float32)
    bias = RNG.standard_normal(m).astype(np.float32)
    out = np.zeros(m, dtype=np.float32)
    bm, bn, sm_, tm = group[2], group[1], int(host_name.split("_sm")[1].split("_")[0]), 4
    per_tgp = bm * sm_ * tm
    axpby = host_name.endswith("axpby1")
    alpha, beta = (0.5, 2.0) if axpby else (1.0, 0.0)
    buffers = {0: mat, 1: vec, 3: out, 4: scalar(k, np.int32), 5: scalar(m, np.int32), 6: scalar(k, np.int32),
               9: scalar(1, np.int32), 10: np.array([1], np.int32), 11: np.array([0], np.int64),
               12: np.array([0], np.int64)}
    if axpby:
        buffers.update({2: bias, 7: scalar(alpha, np.float32), 8: scalar(beta, np.float32),
                        13: np.array([0], np.int64), 14: scalar(1, np.int32)})
    mlx_library("gemv.metal").launch(
        host_name, buffers=buffers,
        threadgroups=(-(-m // per_tgp), 1, 1), threads_per_threadgroup=group,
        check_memory=(k == 300 and alpha == 1.0))
    expected = alpha * (mat.astype(np.float64) @ vec) + beta * bias
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_mlx_gemv_overlapping_tail_rows_race():
    """Found by the memory check in unmodified code: when the row count is not a multiple of
    TM, gemv's last simdgroup moves its rows back (`out_row = out_vec_size - TM`, gemv.h) and
    recomputes rows another threadgroup also writes: the same values, so the result is right,
    but two threadgroups write one location with nothing ordering them."""
    m, k = 10, 2000
    mat = RNG.standard_normal((m, k)).astype(np.float32)
    vec = RNG.standard_normal(k).astype(np.float32)
    out = np.zeros(m, dtype=np.float32)
    with pytest.raises(sm.RaceError, match=r"gemv\.h line \d+.*threadgroups of one dispatch are not ordered"):
        mlx_library("gemv.metal").launch(
            "gemv_float32_bm1_bn8_sm1_sn32_tm4_tn4_nc0_axpby0",
            buffers={0: mat, 1: vec, 3: out, 4: scalar(k, np.int32), 5: scalar(m, np.int32), 6: scalar(k, np.int32),
                     9: scalar(1, np.int32), 10: np.array([1], np.int32), 11: np.array([0], np.int64),
                     12: np.array([0], np.int64)},
            threadgroups=(3, 1, 1), threads_per_threadgroup=(32, 8, 1), check_memory=True)


# ---- reduce.metal: all_reduce (each threadgroup reduces one chunk) and row_reduce_simple
# (each threadgroup reduces N_WRITES = 4 contiguous rows) ----

REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


@pytest.mark.parametrize("op", sorted(REDUCE))
def test_mlx_all_reduce(op):
    in_size, row_size, threads = 10_000, 4096, 256  # 3 chunks, the last partial
    x = (RNG.uniform(0.999, 1.001, in_size) if op == "prod" else RNG.standard_normal(in_size)).astype(np.float32)
    chunks = -(-in_size // row_size)
    out = np.zeros(chunks, dtype=np.float32)
    mlx_library("reduce.metal").launch(
        f"all_reduce_{op}float32", buffers=[x, out, scalar(in_size, np.uint64), scalar(row_size, np.uint64)],
        threadgroups=(1, chunks, 1), threads_per_threadgroup=(threads, 1, 1), check_memory=(op == "sum"))
    expected = [REDUCE[op](x[i * row_size:(i + 1) * row_size].astype(np.float64)) for i in range(chunks)]
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("op,dtype", [("sum", np.float32), ("max", np.float32), ("sum", np.int32)])
def test_mlx_row_reduce_simple(op, dtype):
    rows, cols, threads = 8, 700, 128  # 2 threadgroups of 4 rows
    x = (RNG.standard_normal((rows, cols)) * (50 if dtype == np.int32 else 1)).astype(dtype)
    out = np.zeros(rows, dtype=dtype)
    tname = "float32" if dtype == np.float32 else "int32"
    mlx_library("reduce.metal").launch(
        f"row_reduce_simple_{op}{tname}", buffers=[x, out, scalar(cols, np.uint64), scalar(rows, np.int64)],
        threadgroups=(1, rows // 4, 1), threads_per_threadgroup=(threads, 1, 1), check_memory=(dtype == np.int32))
    expected = REDUCE[op](x.astype(np.float64), axis=1)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


# ---- complex64 (complex.h's complex_t: the address-space overloads SoftMetal folds) ----

def test_mlx_complex64_binary_and_unary():
    n = 100
    a = (RNG.standard_normal(n) + 1j * RNG.standard_normal(n)).astype(np.complex64)
    b = (RNG.standard_normal(n) + 1j * RNG.standard_normal(n)).astype(np.complex64)
    for op, ref in [("Add", a + b), ("Multiply", a * b), ("Divide", a / b)]:
        c = np.zeros_like(a)
        mlx_library("binary.metal").launch(f"vv_{op}complex64", buffers=[a, b, c, scalar(n, np.uint32)],
                                           grid=(n, 1, 1), threads_per_threadgroup=(32, 1, 1),
                                           check_memory=(op == "Multiply"))
        np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-6)
    for op, ref in [("Exp", np.exp(a)), ("Sqrt", np.sqrt(a)), ("Log", np.log(a))]:
        o = np.zeros_like(a)
        mlx_library("unary.metal").launch(f"v_{op}complex64complex64", buffers=[a, o, scalar(n, np.uint32)],
                                          grid=(n, 1, 1), threads_per_threadgroup=(32, 1, 1))
        np.testing.assert_allclose(o, ref, rtol=1e-5, atol=1e-6)


# ---- quantized.metal: affine-quantized mat-vec (quantized.h, which includes steel's
# integral_constant.h with its `noexcept` members), launched as MLX's qmv (quantized.cpp):
# threadgroups (M, ceil(N / 8), B) of (32, 2, 1); w, scales, biases, x, y, K, N bound, and
# for an unbatched call (B = 1) nothing else: the batch shapes and strides (7-14) are named
# only in code that the `batched = false` instance drops. ----

def affine_quantize(w, group_size, bits):
    """MLX's affine quantization: per group, scale = (max - min) / (2^bits - 1), bias = min;
    values packed little-end first into uint32 (32 / bits per word)."""
    n, k = w.shape
    g = w.reshape(n, k // group_size, group_size).astype(np.float64)
    lo, hi = g.min(axis=2), g.max(axis=2)
    scale = np.maximum((hi - lo) / (2 ** bits - 1), 1e-8).astype(np.float32)
    bias = lo.astype(np.float32)
    q = np.clip(np.rint((g - bias[..., None]) / scale[..., None]), 0, 2 ** bits - 1).astype(np.uint32).reshape(n, k)
    per = 32 // bits
    words = np.zeros((n, k // per), np.uint32)
    for j in range(per):
        words |= q[:, j::per] << np.uint32(bits * j)
    deq = (scale[..., None] * q.reshape(n, k // group_size, group_size).astype(np.float64) + bias[..., None]).reshape(n, k)
    return words, scale, bias, deq


@pytest.mark.parametrize("kernel,n,k,group_size,bits", [
    ("affine_qmv_fast", 16, 512, 64, 4),   # N % 8 == 0 and K % 512 == 0: MLX's fast path
    ("affine_qmv_fast", 8, 256, 32, 8),
    ("affine_qmv", 20, 320, 64, 4),        # otherwise qmv: a partial last row block and K tail
])
def test_mlx_affine_qmv(kernel, n, k, group_size, bits):
    w = RNG.standard_normal((n, k)).astype(np.float32)
    words, scales, biases, deq = affine_quantize(w, group_size, bits)
    x = RNG.standard_normal(k).astype(np.float32)
    y = np.zeros(n, np.float32)
    host_name = f"{kernel}_float_gs_{group_size}_b_{bits}_batch_0"
    mlx_library("quantized.metal").launch(
        host_name, buffers={0: words, 1: scales, 2: biases, 3: x, 4: y, 5: scalar(k, np.int32), 6: scalar(n, np.int32)},
        threadgroups=(1, -(-n // 8), 1), threads_per_threadgroup=(32, 2, 1), check_memory=(kernel == "affine_qmv"))
    np.testing.assert_allclose(y, deq @ x.astype(np.float64), rtol=1e-4, atol=1e-4)


# ---- fp_quantized.metal: mxfp4 mat-vec (fp4 e2m1 values, one e8m0 scale per 32), launched as
# MLX's qmv launches mode "mxfp4": w, scales, x, y, K, N; no global scale (buffer 2, used
# only by the `_hgs` instances) and no batch strides. ----

FP4_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


@pytest.mark.parametrize("kernel,n,k", [("qmv_fast", 16, 512), ("qmv", 20, 320)])
def test_mlx_mxfp4_qmv(kernel, n, k):
    codes = RNG.integers(0, 16, (n, k)).astype(np.uint32)
    exps = RNG.integers(122, 130, (n, k // 32)).astype(np.uint8)  # 2^(e - 127)
    words = np.zeros((n, k // 8), np.uint32)
    for j in range(8):
        words |= codes[:, j::8] << np.uint32(4 * j)
    w = FP4_E2M1[codes] * np.repeat(2.0 ** (exps.astype(np.float64) - 127), 32, axis=1)
    x = RNG.standard_normal(k).astype(np.float32)
    y = np.zeros(n, np.float32)
    mlx_library("fp_quantized.metal").launch(
        f"mxfp4_{kernel}_float_gs_32_b_4_batch_0",
        buffers={0: words, 1: exps, 3: x, 4: y, 5: scalar(k, np.int32), 6: scalar(n, np.int32)},
        threadgroups=(1, -(-n // 8), 1), threads_per_threadgroup=(32, 2, 1), check_memory=(kernel == "qmv"))
    np.testing.assert_allclose(y, w @ x.astype(np.float64), rtol=1e-4, atol=1e-4)


# ---- steel_gemm_fused.metal: MLX's steel GEMM (simdgroup matrices, threadgroup tiles),
# launched as steel_matmul_regular_axpby launches it: threadgroups (ceil(N / bn), ceil(M / bm), 1)
# of (32, wn, wm); A, B, D and GEMMParams bound; function constants has_batch (10),
# use_out_source (100), do_axpby (110), align_M/N/K (200-202). The C source, its params and
# the batch arrays are bound only when those constants are true. ----

GEMM_PARAMS = np.dtype([("M", np.int32), ("N", np.int32), ("K", np.int32), ("lda", np.int32), ("ldb", np.int32),
                        ("ldd", np.int32), ("tiles_n", np.int32), ("tiles_m", np.int32),
                        ("batch_stride_a", np.int64), ("batch_stride_b", np.int64), ("batch_stride_d", np.int64),
                        ("swizzle_log", np.int32), ("gemm_k_iterations_aligned", np.int32), ("batch_ndim", np.int32)],
                       align=True)


@pytest.mark.parametrize("m,n,k,trans,dtype,tile", [
    (70, 50, 40, "nn", np.float32, (64, 64, 16, 2, 2)),   # no dimension aligned: edge tiles and a K tail
    (64, 64, 32, "nn", np.float32, (64, 64, 16, 2, 2)),   # every dimension aligned
    (40, 48, 96, "nt", np.float16, (64, 32, 32, 2, 2)),   # MLX's nt tile on small devices, half
])
def test_mlx_steel_gemm(m, n, k, trans, dtype, tile):
    bm, bn, bk, wm, wn = tile
    a = RNG.standard_normal((m, k)).astype(dtype)
    b = RNG.standard_normal((n, k) if trans == "nt" else (k, n)).astype(dtype)
    d = np.zeros((m, n), dtype)
    tn, tm = -(-n // bn), -(-m // bm)
    params = np.zeros((), GEMM_PARAMS)
    for key, value in dict(M=m, N=n, K=k, lda=k, ldb=k if trans == "nt" else n, ldd=n, tiles_n=tn, tiles_m=tm,
                           batch_stride_a=m * k, batch_stride_b=n * k, batch_stride_d=m * n, swizzle_log=0,
                           gemm_k_iterations_aligned=k // bk, batch_ndim=1).items():
        params[key] = value
    name = {np.float32: "float32", np.float16: "float16"}[dtype]
    mlx_library("steel/gemm/kernels/steel_gemm_fused.metal").launch(
        f"steel_gemm_fused_{trans}_{name}_{name}_bm{bm}_bn{bn}_bk{bk}_wm{wm}_wn{wn}",
        buffers={0: a, 1: b, 3: d, 4: params.tobytes()}, threadgroups=(tn, tm, 1), threads_per_threadgroup=(32, wn, wm),
        constants={10: False, 100: False, 110: False, 200: m % bm == 0, 201: n % bn == 0, 202: k % bk == 0},
        check_memory=(m == 70))
    ref = a.astype(np.float64) @ (b.T if trans == "nt" else b).astype(np.float64)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == np.float16 else dict(rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(d.astype(np.float64), ref, **tol)


def _qmm_t(m, n, k, pad_rows=0):
    group_size, bits = 64, 4
    w = RNG.standard_normal((n + pad_rows, k)).astype(np.float32)
    words, scales, biases, deq = affine_quantize(w, group_size, bits)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    y = np.zeros((m, n), np.float32)
    aligned = "true" if n % 32 == 0 else "false"
    mlx_library("quantized.metal").launch(
        f"affine_qmm_t_float_gs_{group_size}_b_{bits}_alN_{aligned}_batch_0",
        buffers={0: words, 1: scales, 2: biases, 3: x, 4: y, 5: scalar(k, np.int32), 6: scalar(n, np.int32),
                 7: scalar(m, np.int32)},
        threadgroups=(-(-n // 32), -(-m // 32), 1), threads_per_threadgroup=(32, 2, 2))
    np.testing.assert_allclose(y, x.astype(np.float64) @ deq[:n].T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m,n,k,pad_rows", [(40, 64, 128, 0), (33, 40, 256, 24)])
def test_mlx_affine_qmm_t(m, n, k, pad_rows):
    """x (M, K) @ dequantized w (N, K)^T through steel's tiles (quantized.h's QuantizedBlockLoader
    into threadgroup memory, BlockMMA), launched as MLX's qmm: (32, 2, 2) threads, 32 x 32 tiles.
    N % 32 != 0 (alN_false) reads whole 32-row tiles of w, scales and biases (see below), so
    that case gets rows up to the next tile, as MLX's page-rounded allocations have them."""
    _qmm_t(m, n, k, pad_rows)


def test_mlx_affine_qmm_t_reads_rows_past_n():
    """A finding in unmodified code: with N % 32 != 0 the last tile's QuantizedBlockLoader::load_safe
    is called with short2(BK, num_outs) and, for reduction_dim 1, checks the row `bi` against
    `src_tile_dim.x` (BK), not the row count, so it reads scales, biases and weights of rows
    past N (the results for them are not stored). On a GPU the read lands in the rest of the
    allocation; SoftMetal's guard page stops it."""
    with pytest.raises(sm.OutOfBoundsError, match=r"affine_qmm_t_float_gs_64_b_4_alN_false_batch_0: out-of-bounds .*buffer\((0|1|2)\)"):
        _qmm_t(33, 40, 256)


@pytest.mark.own_checks  # SoftMetal's own kernels: each launch names its check
def test_memory_check_sees_a_32_byte_struct_copy():
    """clang copies a struct of 32 bytes or more with llvm.memcpy, which sanitizer coverage does
    not trace: the checked build calls the runtime's checked copy instead (steel's BlockLoader
    fills its threadgroup tiles so), so the tile counts as written and the copy's bytes are checked."""
    lib = sm.compile("""
using namespace metal;
struct alignas(32) V8 { float v[8]; };
kernel void k(device const float* x [[buffer(0)]], device float* y [[buffer(1)]], uint i [[thread_index_in_threadgroup]]) {
    threadgroup float t[256];
    *((threadgroup V8*)(&t[i * 8])) = *((const device V8*)(&x[i * 8]));
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[i] = t[(i * 8 + 13) % 256];
}
""")
    x, y = np.arange(256, dtype=np.float32), np.zeros(32, np.float32)
    lib.launch("k", [x, y], threadgroups=(1,), threads_per_threadgroup=(32,), check_memory=True)
    np.testing.assert_array_equal(y, (np.arange(32) * 8 + 13) % 256)
    # The copy's stores are seen: without the barrier, another thread's read of them races.
    racing = sm.compile(lib_source := """
using namespace metal;
struct alignas(32) V8 { float v[8]; };
kernel void k(device const float* x [[buffer(0)]], device float* y [[buffer(1)]], uint i [[thread_index_in_threadgroup]]) {
    threadgroup float t[256];
    *((threadgroup V8*)(&t[i * 8])) = *((const device V8*)(&x[i * 8]));  // the copy
    y[i] = t[(i * 8 + 13) % 256];  // another thread's copy
}
""")
    with pytest.raises(sm.RaceError, match="data race") as e:
        racing.launch("k", [x, y], threadgroups=(1,), threads_per_threadgroup=(32,), check_races=True)
    lines = lib_source.split("\n")
    copy = next(n for n, t in enumerate(lines, 1) if "// the copy" in t)
    assert f"MSL line {copy}" in str(e.value), str(e.value)
