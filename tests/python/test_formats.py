"""Weight formats: float16 / bfloat16 dense and MLX's affine and mxfp4 quantizations,
against the float64 reference on every backend and family, MLX's packing checked by hand
(no mlx needed) and by mx.quantize where mlx is installed, mixed formats, activations in
other dtypes, arrays of other frameworks, memory, and bad inputs."""

import os

import numpy as np
import pytest

import moe_swift
from moe_swift import formats, reference
from moe_swift.formats import Quantized, quantize, dequantize
from families import FAMILIES, make_layer_args, selected_backends, spec_tolerance

BACKENDS = selected_backends()
MATRICES = ("router_weight", "gate_proj", "up_proj", "gate_up_proj", "down_proj")

# name -> how a float32 matrix is turned into that format
FORMATS = {
    "f16": lambda w: w.astype(np.float16),
    "bf16": lambda w: formats.float32_to_bf16(w).view(_bf16()),
    "q8": lambda w: quantize(w, bits=8, group_size=32),
    "q4": lambda w: quantize(w, bits=4, group_size=64, scale_dtype="float16"),
    "q3": lambda w: quantize(w, bits=3, group_size=32, scale_dtype="bfloat16"),
    "q5": lambda w: quantize(w, bits=5, group_size=128),
    "q6": lambda w: quantize(w, bits=6, group_size=64),
    "q2": lambda w: quantize(w, bits=2, group_size=32),
    "mxfp4": lambda w: quantize(w, mode="mxfp4"),
}


def _bf16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return ml_dtypes.bfloat16


def convert(args, fmt, which=MATRICES, shared=True):
    """`args` with its weight matrices in format `fmt` (vectors stay float32)."""
    out = dict(args)
    for name in which:
        if name in out:
            out[name] = FORMATS[fmt](out[name])
    if shared and "shared_expert" in out:
        out["shared_expert"] = {k: (FORMATS[fmt](v) if k != "sigmoid_gate" else v)
                                for k, v in out["shared_expert"].items()}
    return out


def check(layer, args, x):
    """Output vs the reference (which reads the same formats exactly) on the layer's
    own ids, and the routing itself vs the reference's."""
    y = layer(x)
    ids, weights = layer.route(x)
    ref = reference.moe_forward(x, **args, ids=ids)
    err = float(np.abs(y - ref).max()) if y.size else 0.0
    assert err <= spec_tolerance(ref), (err, spec_tolerance(ref))
    router_args = {k: v for k, v in args.items() if k in ROUTER_KEYS}
    ref_ids, ref_w = reference.route(x, **router_args)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(weights, ref_w, rtol=1e-5, atol=1e-6)


ROUTER_KEYS = {"router_weight", "top_k", "scoring", "norm_topk_prob", "routed_scaling_factor",
               "router_bias", "selection_bias", "n_group", "topk_group", "per_expert_scale"}


# --- MLX's packing, by hand -------------------------------------------------------------


def hand_packed(codes, bits):
    """Codes -> uint32 words through one Python integer per row: bit i * bits + b of the
    row is bit b of code i (little-endian stream), the definition in MLX's layout."""
    rows = []
    for row in codes:
        n = 0
        for i, c in enumerate(row):
            n |= int(c) << (i * bits)
        nbytes = len(row) * bits // 8
        rows.append(np.frombuffer(n.to_bytes(nbytes, "little"), dtype="<u4"))
    return np.stack(rows).astype(np.uint32)


@pytest.mark.parametrize("bits", formats.AFFINE_BITS)
def test_packing_is_a_little_endian_bit_stream(bits):
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, size=(3, 128))
    words = hand_packed(codes, bits)
    np.testing.assert_array_equal(formats._pack(codes, bits), words)
    scales = rng.random((3, 2)).astype(np.float32) + 0.5
    biases = rng.standard_normal((3, 2)).astype(np.float32)
    q = Quantized(words, scales, biases, bits=bits, group_size=64)
    expected = codes.reshape(3, 2, 64) * scales.astype(np.float64)[..., None] + biases.astype(np.float64)[..., None]
    np.testing.assert_array_equal(dequantize(q), expected.reshape(3, 128))


def test_mxfp4_meaning():
    codes = np.arange(32) % 16
    words = hand_packed(codes[None], 4)
    scales = np.array([[127 + 3]], dtype=np.uint8)  # 2^3
    q = Quantized(words, scales, mode="mxfp4")
    np.testing.assert_array_equal(dequantize(q)[0], formats.E2M1[codes] * 8)
    nan = Quantized(words, np.array([[255]], dtype=np.uint8), mode="mxfp4")
    assert np.isnan(dequantize(nan)).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bits", formats.AFFINE_BITS)
def test_layer_reads_hand_packed_codes(backend, bits):
    """A layer whose experts are hand-packed codes computes with exactly those values."""
    rng = np.random.default_rng(10 + bits)
    E, H, I = 4, 64, 32
    def q(shape):
        codes = rng.integers(0, 1 << bits, size=shape)
        rows = codes.reshape(-1, shape[-1])
        words = hand_packed(rows, bits).reshape(shape[:-1] + (-1,))
        groups = shape[:-1] + (shape[-1] // 32,)
        s = (rng.random(groups) * 0.05 / (1 << bits)).astype(np.float32)
        b = (-s * (1 << (bits - 1))).astype(np.float32)
        return Quantized(words, s, b, bits=bits, group_size=32)
    args = dict(router_weight=rng.standard_normal((E, H)).astype(np.float32), top_k=2,
                gate_proj=q((E, I, H)), up_proj=q((E, I, H)), down_proj=q((E, H, I)))
    x = rng.standard_normal((9, H)).astype(np.float32)
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        check(layer, args, x)


# --- every format, family and backend ----------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("family", FAMILIES)
def test_format_matches_reference(family, fmt, backend):
    """T = 1 and 3 (decode: dequantized in registers) and 40 (20 rows per expert: tiles)."""
    args = convert(make_layer_args(family, H=128, I=128, E=8, k=4, seed=5, shared=128), fmt)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((40, 128)).astype(np.float32)
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        for T in (1, 3, 40):
            check(layer, args, x[:T])


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_formats_in_one_layer(backend):
    """mlx-lm writes the router at 8 bits and experts at 4; any mix is one layer."""
    args = make_layer_args("qwen2_moe", H=128, I=64, E=8, k=2, seed=7, shared=64)
    args["router_weight"] = FORMATS["q8"](args["router_weight"])
    args["gate_proj"] = FORMATS["q4"](args["gate_proj"])
    args["up_proj"] = FORMATS["f16"](args["up_proj"])
    args["down_proj"] = FORMATS["mxfp4"](args["down_proj"])
    se = args["shared_expert"]
    se["gate_proj"], se["up_proj"], se["down_proj"] = (
        FORMATS["bf16"](se["gate_proj"]), FORMATS["q3"](se["up_proj"]), se["down_proj"])
    x = np.random.default_rng(8).standard_normal((33, 128)).astype(np.float32)
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        check(layer, args, x)


@pytest.mark.parametrize("fmt", ["q4", "q8"])
def test_fixed_point_activations_with_outliers(fmt):
    """The CPU's decode products of affine codes take the activations in fixed point per
    group (docs/formats.md), scaled to the group's largest value: activations with outlier
    channels 10^4 times the rest, as LLM activations have, and a stretch 10^6 times smaller
    still meet the spec's tolerance, for 1 to 4 activation rows per product."""
    args = convert(make_layer_args("qwen3_moe", H=256, I=128, E=8, k=2, seed=11), fmt)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    x[:, [3, 77, 200]] *= 1e4
    x[1, 100:140] *= 1e-6
    # (the reference's SiLU overflows exp for gates near -10^4: the value is 0 all the same)
    with moe_swift.MoELayer(**args, backend="cpu") as layer, np.errstate(over="ignore"):
        for T in (1, 2, 4):
            check(layer, args, x[:T])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("scale_dtype", ["float16", "bfloat16", "float32"])
def test_affine_group_parameters_at_real_sizes(bits, scale_dtype):
    """The CPU's factored product converts a row's group scales and biases eight at a time,
    then the rest one by one: rows of whole eights of groups and rows that end in a part of
    one (2944 / 32, / 64, / 128 = 92, 46, 23 groups; 384: 12, 6, 3), every group size and
    scale type, 1 to 4 tokens per expert."""
    for group in formats.GROUP_SIZES:
        fmt = lambda w: quantize(w, bits=bits, group_size=group, scale_dtype=scale_dtype)
        args = make_layer_args("qwen3_moe", H=2944, I=384, E=2, k=1, seed=group)
        args = {k: fmt(v) if k in ("gate_proj", "up_proj", "down_proj") else v for k, v in args.items()
                if k != "shared_expert"}
        x = np.random.default_rng(group).standard_normal((4, 2944)).astype(np.float32)
        with moe_swift.MoELayer(**args, backend="cpu") as layer:
            for T in (1, 2, 3, 4):
                check(layer, args, x[:T])


def test_odd_dense_sizes():
    """float16 / bfloat16 rows that are not a multiple of 32 elements."""
    args = convert(make_layer_args("mixtral", H=45, I=23, E=5, k=2, seed=9), "f16")
    x = np.random.default_rng(9).standard_normal((11, 45)).astype(np.float32)
    with moe_swift.MoELayer(**args, backend="cpu") as layer:
        check(layer, args, x)
    args = convert(make_layer_args("olmoe", H=45, I=23, E=5, k=2, seed=9), "bf16")
    with moe_swift.MoELayer(**args, backend="cpu") as layer:
        check(layer, args, x)


# --- activations and other frameworks ----------------------------------------------------


def test_activation_dtypes():
    args = make_layer_args("qwen3_moe", H=64, I=32, E=8, k=2, seed=11)
    x = np.random.default_rng(12).standard_normal((5, 64)).astype(np.float32)
    with moe_swift.MoELayer(**args) as layer:
        y32 = layer(x)
        x16 = x.astype(np.float16)
        y16 = layer(x16)
        assert y16.dtype == np.float16
        np.testing.assert_array_equal(y16, layer(x16.astype(np.float32)).astype(np.float16))
        bf16 = _bf16()
        xb = x.astype(bf16)
        yb = layer(xb, residual=xb)
        assert yb.dtype == bf16
        expected = layer(xb.astype(np.float32), residual=xb.astype(np.float32)).astype(bf16)
        np.testing.assert_array_equal(yb.view(np.uint16), expected.view(np.uint16))
        assert layer(x.astype(np.float64)).dtype == np.float32
        assert np.abs(y32 - layer(x)).max() == 0


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    args = make_layer_args("mixtral", H=64, I=32, E=8, k=2, seed=13)
    targs = dict(args)
    for name in ("gate_proj", "up_proj", "down_proj"):
        targs[name] = torch.nn.Parameter(torch.from_numpy(args[name]).to(torch.bfloat16))  # requires_grad
    targs["router_weight"] = torch.from_numpy(args["router_weight"])
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    with moe_swift.MoELayer(**targs) as layer:
        y = layer(x)
        assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
        ref = reference.moe_forward(x.float().numpy(), **targs, ids=layer.route(x.float().numpy())[0])
        assert np.abs(y.float().numpy() - ref).max() <= spec_tolerance(ref) + 2 ** -7 * np.abs(ref).max()


def test_mx_quantize_goes_in_unchanged():
    mx = pytest.importorskip("mlx.core")
    args = make_layer_args("qwen3_moe", H=128, I=128, E=8, k=2, seed=14)
    margs = dict(args)
    for name, bits, gs in (("gate_proj", 4, 64), ("up_proj", 8, 32), ("down_proj", 3, 128), ("router_weight", 6, 64)):
        w, s, b = mx.quantize(mx.array(args[name]).astype(mx.bfloat16), group_size=gs, bits=bits)
        margs[name] = Quantized(w, s, b, bits=bits, group_size=gs)
        np.testing.assert_allclose(
            dequantize(margs[name]),
            np.array(mx.dequantize(w, s, b, group_size=gs, bits=bits).astype(mx.float32)), rtol=0, atol=0.02)
    x = np.random.default_rng(15).standard_normal((7, 128)).astype(np.float32)
    with moe_swift.MoELayer(**margs) as layer:
        check(layer, margs, x)
    # With float32 scales mx.dequantize does not round to bf16: the values agree to float32.
    for bits in formats.AFFINE_BITS:
        w, s, b = mx.quantize(mx.array(args["gate_proj"]), group_size=32, bits=bits)
        ours = dequantize(Quantized(w, s, b, bits=bits, group_size=32))
        theirs = np.array(mx.dequantize(w, s, b, group_size=32, bits=bits))
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


# --- memory ---------------------------------------------------------------------------


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_a_quantized_layer_holds_its_quantized_bytes():
    E, H, I = 64, 1024, 512
    rng = np.random.default_rng(16)
    qs = {name: quantize(rng.standard_normal(shape).astype(np.float32), bits=4, group_size=64)
          for name, shape in (("gate_proj", (E, I, H)), ("up_proj", (E, I, H)), ("down_proj", (E, H, I)))}
    quantized_bytes = sum(q.nbytes for q in qs.values())
    router = rng.standard_normal((E, H)).astype(np.float32)
    before = _rss()
    layer = moe_swift.MoELayer(router, **qs, top_k=4, backend="cpu")
    grown = _rss() - before
    assert grown <= 1.1 * (quantized_bytes + router.nbytes) + (64 << 20), (grown, quantized_bytes)
    float32_bytes = 3 * E * I * H * 4
    assert grown < float32_bytes / 3
    layer.close()


# --- bad inputs -----------------------------------------------------------------------


def test_bad_quantized_arguments_name_what_is_wrong():
    rng = np.random.default_rng(17)
    w = rng.standard_normal((4, 8, 128)).astype(np.float32)
    q = quantize(w, bits=4, group_size=64)
    with pytest.raises(ValueError, match="bits must be one of"):
        Quantized(q.weight, q.scales, q.biases, bits=7, group_size=64)
    with pytest.raises(ValueError, match="group_size must be one of"):
        Quantized(q.weight, q.scales, q.biases, bits=4, group_size=48)
    with pytest.raises(ValueError, match="scales must have shape"):
        Quantized(q.weight, q.scales[..., :1], q.biases, bits=4, group_size=64)
    with pytest.raises(TypeError, match="scales must be float32, float16 or bfloat16"):
        Quantized(q.weight, q.scales.astype(np.int32), q.biases, bits=4, group_size=64)
    with pytest.raises(ValueError, match="biases must have the shape and dtype of scales"):
        Quantized(q.weight, q.scales, q.biases.astype(np.float16), bits=4, group_size=64)
    with pytest.raises(ValueError, match="needs biases"):
        Quantized(q.weight, q.scales, bits=4, group_size=64)
    with pytest.raises(TypeError, match="packed uint32"):
        Quantized(q.weight.astype(np.float32), q.scales, q.biases, bits=4, group_size=64)
    m = quantize(w, mode="mxfp4")
    with pytest.raises(ValueError, match="mxfp4 has no biases"):
        Quantized(m.weight, m.scales, m.scales, mode="mxfp4")
    with pytest.raises(TypeError, match="uint8"):
        Quantized(m.weight, m.scales.astype(np.float32), mode="mxfp4")
    with pytest.raises(ValueError, match="mode must be one of"):
        Quantized(m.weight, m.scales, mode="nf4")
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        Quantized(q.weight[..., :12], q.scales[..., :1], q.biases[..., :1], bits=4, group_size=64)  # 96 values
    with pytest.raises(ValueError, match="multiple of group_size"):
        quantize(w[..., :96], bits=4, group_size=64)


def test_bad_layer_arguments_with_formats():
    args = make_layer_args("mixtral", H=128, I=64, E=4, k=2, seed=18)
    q = quantize(args["gate_proj"], bits=4, group_size=64)
    with pytest.raises(ValueError, match=r"gate_proj must have shape \(4, \?, 128\)"):
        moe_swift.MoELayer(**{**args, "gate_proj": quantize(args["down_proj"], bits=4, group_size=64)})
    with pytest.raises(ValueError, match=r"up_proj must have shape \(4, 64, 128\)"):
        moe_swift.MoELayer(**{**args, "gate_proj": q, "up_proj": quantize(args["gate_proj"][:, :32], bits=4)})
    with pytest.raises(TypeError, match="router_bias must be a dense array"):
        moe_swift.MoELayer(**{**args, "router_bias": quantize(np.ones((4, 64), np.float32))})
    with pytest.raises(ValueError, match="down_proj must have shape"):
        moe_swift.MoELayer(**{**args, "down_proj": args["down_proj"].astype(np.float16)[:, :, :32]})


@pytest.mark.parametrize("backend", BACKENDS)
def test_mxfp4_scale_255_is_nan(backend):
    """E8M0 255 is NaN (docs/formats.md): an expert whose down_proj has one such group
    gives NaN in those outputs, and only there; 254 is a finite 2^127."""
    rng = np.random.default_rng(19)
    args = make_layer_args("mixtral", H=64, I=64, E=2, k=1, seed=19)
    down = quantize(args["down_proj"], mode="mxfp4")
    scales = down.scales.copy()
    scales[:, 5, 0] = 255          # output row 5 of every expert, its first group
    args["down_proj"] = Quantized(down.weight, scales, mode="mxfp4")
    x = rng.standard_normal((3, 64)).astype(np.float32)
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        y = layer(x)
    assert np.isnan(y[:, 5]).all()
    assert np.isfinite(np.delete(y, 5, axis=1)).all()
    np.testing.assert_array_equal(np.isnan(reference.moe_forward(x, **args)), np.isnan(y))
