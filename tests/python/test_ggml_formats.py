"""ggml's block quantizations (q4_0 ... q6_K, iq4_nl, iq4_xs, mxfp4_ggml) as weights:
our dequantization against ggml's own (the `gguf` package's NumPy code) bit for bit,
whole layers against the float64 reference on every backend, blocks as `GGUFReader`
gives them, and bad inputs."""

import os

import numpy as np
import pytest

import moe_swift
from moe_swift import GGMLQuantized, options, reference
from moe_swift.formats import GGML_FORMATS, dequantize
from moe_swift.ggml_blocks import random_blocks
from families import selected_backends, spec_tolerance

BACKENDS = selected_backends()
NAMES = sorted(GGML_FORMATS)
# float16 bit patterns a scale may hold: sub-normals, negatives, zeros, the largest, and
# the ones whose products are infinite or NaN.
SPECIAL_HALVES = [0x0001, 0x03FF, 0x0400, 0x8001, 0x83FF, 0xBC00, 0x0000, 0x8000, 0x7BFF, 0xFBFF,
                  0x7C00, 0xFC00, 0x7E00, 0xFE01]
# Byte offsets of each format's float16 fields (scale, and min where it has one).
HALF_FIELDS = {"q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q8_0": (0,), "q2_K": (80, 82),
               "q3_K": (108,), "q4_K": (0, 2), "q5_K": (0, 2), "q6_K": (208,), "iq4_nl": (0,), "iq4_xs": (0,),
               "mxfp4_ggml": ()}


def _gguf_dequantize(blocks, name):
    gguf = pytest.importorskip("gguf")
    qtype = gguf.GGMLQuantizationType(GGML_FORMATS[name][0])
    with np.errstate(all="ignore"):
        return gguf.quants.dequantize(blocks.reshape(-1), qtype).astype(np.float32).reshape(len(blocks), -1)


def _same_bits(ours, theirs):
    """Equal float32 bit patterns, any NaN matching any NaN (ggml does not fix payloads)."""
    ours, theirs = ours.astype(np.float32), theirs.astype(np.float32)
    same = (ours.view(np.uint32) == theirs.view(np.uint32)) | (np.isnan(ours) & np.isnan(theirs))
    return bool(same.all()), int((~same).sum())


def _counting_blocks(size):
    """256 blocks in which every byte position takes every value 0-255 once, and any two
    positions every pair of (low nibble, top two bits): so every 6-bit sub-scale and min
    field, however it is split across bytes (Q3_K, Q4_K, Q5_K, IQ4_XS), takes every value."""
    i = np.arange(256)[:, None]
    p = np.arange(size)[None, :]
    return ((i + 29 * p) % 256).astype(np.uint8)


@pytest.mark.parametrize("name", NAMES)
def test_dequantize_is_ggmls_bit_for_bit(name):
    elems, size = GGML_FORMATS[name][1:]
    rng = np.random.default_rng(GGML_FORMATS[name][0])
    blocks = [rng.integers(0, 256, (2048, size), dtype=np.uint8), _counting_blocks(size),
              random_blocks(rng, name, (64, 4 * elems)).reshape(-1, size)]
    special = rng.integers(0, 256, (len(SPECIAL_HALVES) * 4, size), dtype=np.uint8)
    for at in HALF_FIELDS[name]:
        halves = np.array(SPECIAL_HALVES * 4, dtype="<u2")
        special[:, at:at + 2] = rng.permutation(halves).view(np.uint8).reshape(-1, 2)
    if name == "mxfp4_ggml":  # every E8M0 scale, 0 (sub-normal) to 255 (2^127 in ggml)
        special = np.repeat(special[:1], 256, axis=0)
        special[:, 0] = np.arange(256)
    blocks.append(special)
    b = np.concatenate(blocks)
    ours = dequantize(GGMLQuantized(b, type=name))
    assert ours.dtype == np.float64 and ours.shape == (len(b), elems)
    same, differing = _same_bits(ours, _gguf_dequantize(b, name))
    assert same, f"{differing} elements differ from ggml's"
    # float64 holding float32 values exactly: nothing lost in the cast back.
    finite = np.isfinite(ours)
    assert np.array_equal(ours[finite], ours[finite].astype(np.float32).astype(np.float64))


def test_the_types_are_the_header_rows():
    assert {name for name, _, _ in options.GGML_TYPES.values()} - set(options.DTYPES) == set(GGML_FORMATS)
    for name, (ggml_type, elems, size) in GGML_FORMATS.items():
        assert options.FORMATS[name] == 100 + ggml_type
        for t in (name, ggml_type):
            q = GGMLQuantized(np.zeros((3, 2 * size), np.uint8), type=t)
            assert q.shape == (3, 2 * elems) and q.format == name


def test_gguf_quantization_types_go_in_unchanged():
    gguf = pytest.importorskip("gguf")
    w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    data = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    q = GGMLQuantized(data, type=gguf.GGMLQuantizationType.Q8_0)
    assert q.shape == (4, 64)
    np.testing.assert_array_equal(dequantize(q), gguf.quants.dequantize(data, gguf.GGMLQuantizationType.Q8_0))
    # The same bytes flat, with the logical shape given.
    flat = GGMLQuantized(data.reshape(-1), type="q8_0", shape=(2, 2, 64))
    assert flat.shape == (2, 2, 64) and flat.blocks.shape == (2, 2, 68)


def test_gguf_reader_tensors_go_in_unchanged(tmp_path):
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(1)
    E, I, H = 4, 32, 256
    writer = gguf.GGUFWriter(str(tmp_path / "w.gguf"), "test")
    gate = random_blocks(rng, "q4_K", (E, I, H), 0.1)
    writer.add_tensor("gate", gate, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensor = gguf.GGUFReader(str(tmp_path / "w.gguf")).tensors[0]
    q = GGMLQuantized(tensor.data, type=tensor.tensor_type)
    assert q.shape == (E, I, H)
    np.testing.assert_array_equal(q.blocks, gate)


def _layer_args(name, rng, E, H, I, K):
    def matrix(*shape):
        return GGMLQuantized(random_blocks(rng, name, shape, 3 * shape[-1] ** -0.5), type=name)
    return dict(router_weight=matrix(E, H), gate_proj=matrix(E, I, H), up_proj=matrix(E, I, H),
                down_proj=matrix(E, H, I), top_k=K)


def _check(args, x, backend):
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        y = layer(x)
        ids, _ = layer.route(x)
    ref = reference.moe_forward(x, **args, ids=ids)
    err = float(np.abs(y - ref).max())
    assert err <= spec_tolerance(ref), (err, spec_tolerance(ref))


@pytest.mark.parametrize("name", NAMES)
def test_every_type_on_the_cpu_backend(name):
    """Small layers of each type, decode (1 to 4 rows: every activation-row count of the
    vector products) and prefill (64 tokens on 6 experts: dequantized tiles);
    test_cpu_isa.py runs this on each instruction set."""
    if "cpu" not in BACKENDS:
        pytest.skip("the cpu backend is not selected")
    rng = np.random.default_rng(GGML_FORMATS[name][0] + 1)
    args = _layer_args(name, rng, 6, 512, 256, 2)
    for T in (1, 2, 3, 4, 9, 64):
        _check(args, rng.standard_normal((T, 512)).astype(np.float32), "cpu")


@pytest.mark.parametrize("name", NAMES)
def test_a_layer_at_model_width_matches_the_reference_on_cpu(name):
    """H = 2048, I = 768 (a down projection's row is three K-quant super-blocks): decode
    (the product from the blocks) and prefill (dequantized tiles) rows."""
    if "cpu" not in BACKENDS:
        pytest.skip("the cpu backend is not selected")
    rng = np.random.default_rng(GGML_FORMATS[name][0])
    args = _layer_args(name, rng, 4, 2048, 768, 2)
    for T in (1, 3, 9):
        _check(args, rng.standard_normal((T, 2048)).astype(np.float32), "cpu")
    if GGML_FORMATS[name][1] == 32:  # gpt-oss's 2880 = 11 eights of blocks + 2; 288 = 1 + 1
        args = _layer_args(name, rng, 4, 2880, 288, 2)
        for T in (1, 3):
            _check(args, rng.standard_normal((T, 2880)).astype(np.float32), "cpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_ggml_formats_in_one_layer(backend):
    """A Q4_K_M-like mix: each matrix in its own type, the router dense."""
    rng = np.random.default_rng(5)
    E, H, I = 8, 256, 512
    def matrix(name, *shape):
        return GGMLQuantized(random_blocks(rng, name, shape, 3 * shape[-1] ** -0.5), type=name)
    args = dict(router_weight=rng.standard_normal((E, H)).astype(np.float32), gate_proj=matrix("q4_K", E, I, H),
                up_proj=matrix("q5_0", E, I, H), down_proj=matrix("q6_K", E, H, I), top_k=2)
    _check(args, rng.standard_normal((5, H)).astype(np.float32), backend)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_a_ggml_layer_holds_its_blocks():
    """Kept as blocks: the layer grows by about the blocks' bytes, far below float32."""
    E, H, I = 64, 1024, 512
    rng = np.random.default_rng(2)
    qs = {name: GGMLQuantized(random_blocks(rng, "q4_K", shape), type="q4_K")
          for name, shape in (("gate_proj", (E, I, H)), ("up_proj", (E, I, H)), ("down_proj", (E, H, I)))}
    block_bytes = sum(q.nbytes for q in qs.values())
    router = rng.standard_normal((E, H)).astype(np.float32)

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    before = rss()
    with moe_swift.MoELayer(router, **qs, top_k=4, backend="cpu"):
        grown = rss() - before
    assert grown <= 1.1 * (block_bytes + router.nbytes) + (64 << 20), (grown, block_bytes)
    assert grown < 3 * E * I * H * 4 / 3


def test_bad_ggml_arguments_name_what_is_wrong():
    size = GGML_FORMATS["q4_K"][2]
    with pytest.raises(ValueError, match=r"gate: rows of q4_K blocks must be a multiple of 144 bytes"):
        GGMLQuantized(np.zeros((4, size + 1), np.uint8), type="q4_K", name="gate")
    with pytest.raises(ValueError, match=r"type must be one of .*q4_K.*got 'q4_k'"):
        GGMLQuantized(np.zeros((4, size), np.uint8), type="q4_k")
    with pytest.raises(ValueError, match=r"ggml type 1 is dense"):
        GGMLQuantized(np.zeros((4, size), np.uint8), type=1)
    with pytest.raises(ValueError, match=r"ggml type 9 is not one the layer reads"):
        GGMLQuantized(np.zeros((4, size), np.uint8), type=9)
    with pytest.raises(TypeError, match=r"type must be a format name"):
        GGMLQuantized(np.zeros((4, size), np.uint8), type=4.0)
    with pytest.raises(TypeError, match=r"uint8 array of bytes"):
        GGMLQuantized(np.zeros((4, size), np.float32), type="q4_K")
    with pytest.raises(ValueError, match=r"a \(4, 512\) tensor in q4_K has 1152 bytes \(288 per row\), got 576"):
        GGMLQuantized(np.zeros((4, size), np.uint8), type="q4_K", shape=(4, 512))
    with pytest.raises(ValueError, match=r"last dimension \(100\) must be a multiple of q4_K's block of 256"):
        GGMLQuantized(np.zeros(400, np.uint8), type="q4_K", shape=(4, 100))
    q = GGMLQuantized(np.zeros((4, size), np.uint8), type="q4_K")
    with pytest.raises(AttributeError, match="immutable"):
        q.blocks = np.zeros((4, size), np.uint8)
    with pytest.raises(TypeError, match="router_bias must be a dense array"):
        rng = np.random.default_rng(0)
        args = _layer_args("q8_0", rng, 4, 64, 64, 2)
        moe_swift.MoELayer(**args, router_bias=q, backend="cpu")
    # The layer checks shapes against the configuration like any weight's.
    rng = np.random.default_rng(0)
    args = _layer_args("q8_0", rng, 4, 64, 64, 2)
    args["down_proj"] = GGMLQuantized(random_blocks(rng, "q8_0", (4, 64, 32)), type="q8_0")
    with pytest.raises(ValueError, match="down_proj"):
        moe_swift.MoELayer(**args, backend="cpu")
