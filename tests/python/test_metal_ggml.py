"""ggml's block quantizations as the Metal kernels read them (moe_formats.h): every loader,
and the `any` loader on every block format, turns rows of random blocks into exactly the
floats of ggml's own dequantization (the `gguf` package's NumPy code), bit for bit, through
load8 and load1 and through moe_row's row_bytes, under SoftMetal's memory check.

Random bytes make random scales: negative, subnormal, infinite and NaN halves come up in
every run, and so does every packing of the K-quants' 6-bit scales; MXFP4's E8M0 bytes 0, 1
and 255 are planted."""

import numpy as np
import pytest

from moe_swift import options, softmetal
from metal_kernels import library_include_dirs, params

pytestmark = pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++")
gguf = pytest.importorskip("gguf")
from gguf import quants  # noqa: E402

# ggml's block formats; each one's loader is moe_fmt_<name>.
GGML_FORMATS = sorted(fmt for fmt, _, _ in options.GGML_TYPES.values() if options.FORMATS[fmt] >= 100)

# A test kernel per loader (and the `any` loader): thread t of load8 reads elements
# 8 (t % (cols / 8)) ... + 7 of row t / (cols / 8), row r being row r % rows_per_expert of
# expert r / rows_per_expert; load1 reads one element per thread.
SOURCE = """
#include "moe_formats.h"

template <typename L>
kernel void ggml_load8(constant moe_weight_desc& d [[buffer(0)]], device const uchar* w [[buffer(1)]],
                       device float* out [[buffer(2)]], constant uint& cols [[buffer(3)]],
                       uint gid [[thread_position_in_grid]]) {
    const uint r = gid / (cols / 8), k = gid % (cols / 8) * 8;
    const moe_wrow row = moe_row(d, w, w, w, nullptr, r / d.rows_per_expert, r % d.rows_per_expert, cols);
    float v[8];
    L::load8(row, k, v);
    for (uint i = 0; i < 8; i++) out[(ulong)r * cols + k + i] = v[i];
}

template <typename L>
kernel void ggml_load1(constant moe_weight_desc& d [[buffer(0)]], device const uchar* w [[buffer(1)]],
                       device float* out [[buffer(2)]], constant uint& cols [[buffer(3)]],
                       uint gid [[thread_position_in_grid]]) {
    const uint r = gid / cols, k = gid % cols;
    out[gid] = L::load1(moe_row(d, w, w, w, nullptr, r / d.rows_per_expert, r % d.rows_per_expert, cols), k);
}

#define INSTANCE(suffix) \\
    template [[host_name("ggml_load8_" #suffix)]] [[kernel]] decltype(ggml_load8<moe_fmt_##suffix>) ggml_load8<moe_fmt_##suffix>; \\
    template [[host_name("ggml_load1_" #suffix)]] [[kernel]] decltype(ggml_load1<moe_fmt_##suffix>) ggml_load1<moe_fmt_##suffix>;
""" + "".join(f"INSTANCE({suffix})\n" for suffix in GGML_FORMATS + ["any"])

EXPERTS, ROWS = 2, 3


@pytest.fixture(scope="module")
def lib():
    return softmetal.compile(SOURCE, include_dirs=library_include_dirs())


def _ggml_type(fmt):
    return next(t for t, (name, _, _) in options.GGML_TYPES.items() if name == fmt)


def random_blocks(fmt, rows, cols, rng):
    """(rows, cols / block_elems * block_bytes) random bytes: ggml rows of `cols` elements."""
    _, elems, size = options.GGML_TYPES[_ggml_type(fmt)]
    return rng.integers(0, 256, (rows, cols // elems * size), dtype=np.uint8)


def same_floats(got, want):
    """The same bits, or NaN in both (ggml's NaN payloads come from x86's float16 to
    float32 conversion, which MSL leaves to the hardware)."""
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_every_block_format_row_is_tested_here():
    """A format row of code >= 100 without its ggml type row would have no loader test."""
    assert set(GGML_FORMATS) == {name for name, code in options.FORMATS.items() if code >= 100}


@pytest.mark.parametrize("loader", ["own", "any"])
@pytest.mark.parametrize("fmt", GGML_FORMATS)
def test_loader_matches_ggml_dequantization(lib, fmt, loader):
    _, elems, size = options.GGML_TYPES[_ggml_type(fmt)]
    cols = 2 * max(elems, 256)  # more than one block (super-block) per row
    rng = np.random.default_rng(options.FORMATS[fmt])
    blocks = random_blocks(fmt, EXPERTS * ROWS, cols, rng)
    if fmt == "mxfp4_ggml":  # the E8M0 bytes that are not 2^(e - 127): 0, 1 (subnormal halves), 255 (not NaN)
        blocks[0, 0:4 * size:size] = [0, 1, 2, 255]
    with np.errstate(invalid="ignore", over="ignore"):  # the random infinite and NaN scales
        want = quants.dequantize(blocks, _ggml_type(fmt)).astype(np.float32).reshape(EXPERTS * ROWS, cols)
    desc = params("moe_weight_desc", format=options.FORMATS[fmt], rows_per_expert=ROWS,
                  row_bytes=cols // elems * size)
    suffix = fmt if loader == "own" else "any"
    n = EXPERTS * ROWS * cols
    for kernel, threads in ((f"ggml_load8_{suffix}", n // 8), (f"ggml_load1_{suffix}", n)):
        out = np.full((EXPERTS * ROWS, cols), 7.0, np.float32)
        lib.launch(kernel, {0: desc, 1: blocks, 2: out, 3: np.array([cols], np.uint32)},
                   threadgroups=(threads // 32,), threads_per_threadgroup=(32,), check_memory=True)
        try:
            same_floats(out, want)
        except AssertionError as e:
            raise AssertionError(f"{kernel} on {fmt}") from e



# --- whole layers on the softmetal backend ---------------------------------------------


def _layer(names, rng, E=4, H=2048, I=768, K=2):
    """A layer at model width (a down row of I = 768 is three K-quant super-blocks) whose
    gate, up and down are ggml blocks of names[0], [1], [2] (random codes, scales set for
    values of about the usual magnitude) and whose router is float32, as llama.cpp keeps
    it."""
    from moe_swift import GGMLQuantized
    from moe_swift.ggml_blocks import random_blocks

    def matrix(name, *shape):
        return GGMLQuantized(random_blocks(rng, name, shape, 3 * shape[-1] ** -0.5), type=name)
    return dict(router_weight=rng.standard_normal((E, H)).astype(np.float32), gate_proj=matrix(names[0], E, I, H),
                up_proj=matrix(names[1], E, I, H), down_proj=matrix(names[2], E, H, I), top_k=K)


def _check_layer(args, x):
    import moe_swift
    from moe_swift import reference
    from families import spec_tolerance
    with moe_swift.MoELayer(**args, backend="softmetal") as layer:
        y = layer(x)
        ids, _ = layer.route(x)
    ref = reference.moe_forward(x, **args, ids=ids)
    err = float(np.abs(y - ref).max())
    assert err <= spec_tolerance(ref), (err, spec_tolerance(ref))


def _softmetal_backend():
    import moe_swift
    if "softmetal" not in moe_swift.available_backends():
        pytest.skip("the softmetal backend is not available")


@pytest.mark.parametrize("fmt", GGML_FORMATS)
def test_a_layer_at_model_width_on_softmetal(fmt):
    """Every block format through the layer's decode path (T = 1: decode router and GEMVs)
    and prefill path (T = 64: bucketing and the GEMMs' interior and edge tiles), against
    the float64 reference of ggml's dequantization."""
    _softmetal_backend()
    rng = np.random.default_rng(options.FORMATS[fmt])
    args = _layer((fmt, fmt, fmt), rng)
    for T in (1, 64):
        _check_layer(args, rng.standard_normal((T, 2048)).astype(np.float32))


def test_a_q4_k_m_mix_on_softmetal():
    """What a Q4_K_M file holds: gate and up in q4_K, down in q6_K (each its own instance),
    then gate in q4_K with up in q5_K (one loader for both: the `any` instance)."""
    _softmetal_backend()
    rng = np.random.default_rng(7)
    for names in (("q4_K", "q4_K", "q6_K"), ("q4_K", "q5_K", "q6_K")):
        args = _layer(names, rng)
        for T in (1, 64):
            _check_layer(args, rng.standard_normal((T, 2048)).astype(np.float32))


def test_a_ggml_layer_holds_its_blocks_on_the_device():
    """Device memory is the blocks' bytes (one buffer a matrix, nothing widened, no scale
    buffers) and the router's float32."""
    import moe_swift
    _softmetal_backend()
    args = _layer(("q4_K", "q4_K", "q6_K"), np.random.default_rng(3), E=8, H=512, I=256)
    with moe_swift.MoELayer(**args, backend="softmetal"):
        created = moe_swift.last_stats()
    arrays = [args["router_weight"]] + [args[k].blocks for k in ("gate_proj", "up_proj", "down_proj")]
    assert created["allocated_bytes"] == sum((a.nbytes + 15) // 16 * 16 for a in arrays), created
