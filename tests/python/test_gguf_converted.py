"""GGUF files written by llama.cpp's own converter (convert_hf_to_gguf.py), not by hand:
the committed fixtures of tests/fixtures/gguf_converted/ (tests/fixtures/make_gguf_converted.py
made them from tiny random transformers models of every family, written plain and in the
converter's Q8_0, and in Q4_0 by ggml's own quantizer from the converter's f32 file) with
the NumPy reference's outputs beside them. Neither torch nor the converter is needed here.

Two expected outputs per input and MoE layer: `deq`, the reference on the file's weights
as gguf-py dequantizes them, which every backend must match to the spec's tolerance; and
`ref`, the reference on the original model's weights (itself checked against
transformers' MoE block when the fixtures were made). The plain files (f32, f16, bf16)
hold the original weights exactly (they are bfloat16 values), so they match `ref` to the
same tolerance; a quantized file's rounding of the weights moves its output, so it
matches `ref` only loosely (QUANTIZED_REL_RMS)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import moe_swift

from families import selected_backends, spec_tolerance

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_converted"
CASES = sorted(p.stem for p in FIXTURES.glob("*.gguf"))
FAMILIES = ["deepseek_v3", "glm4_moe", "gpt_oss", "mixtral", "olmoe", "qwen2_moe", "qwen3_moe"]
TYPES = ["bf16", "f16", "f32", "q4_0", "q8_0"]
# Quantized weights against the original ones, as a relative RMS error of the output: the
# rounding of each weight (a step of 1/127 of its block's largest in Q8_0, 1/8 in Q4_0),
# through the gate, up and down products, gives up to 1.4% (Q8_0) and 22% (Q4_0) on these
# fixtures; a wrong expert or a misread tensor gives ~100% or more. The exact check of a
# quantized file is against `deq`, to the spec's tolerance.
QUANTIZED_REL_RMS = {"q8_0": 0.03, "q4_0": 0.4}


def rel_rms(got, want):
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)))


def fixture(case):
    z = np.load(FIXTURES / f"{case}.npz")
    layers = sorted(int(L) for L in json.loads(str(z["options"])))
    tokens = sorted(int(k[1:]) for k in z.files if k.startswith("x"))
    return {(L, T): (z[f"x{T}"], z[f"deq{L}_{T}"], z[f"ref{L}_{T}"]) for L in layers for T in tokens}


def test_every_family_and_type_has_a_fixture():
    assert CASES == sorted(f"{f}-{t}" for f in FAMILIES for t in TYPES)


@pytest.mark.parametrize("case", CASES)
def test_plain_files_hold_the_original_weights(case):
    """The reference on the file's weights is the reference on the model's own (checks
    the fixtures themselves: a plain file that rounded a weight would show here)."""
    for (L, T), (_, deq, ref) in fixture(case).items():
        quantized = QUANTIZED_REL_RMS.get(case.rsplit("-", 1)[1])
        if quantized:
            assert rel_rms(deq, ref) <= quantized, f"{case} layer {L} T={T}: {rel_rms(deq, ref):.3f}"
        else:
            assert np.abs(deq - ref).max() <= spec_tolerance(ref), f"{case} layer {L} T={T}"


@pytest.mark.parametrize("backend", ["cpu", "softmetal", "metal"])
@pytest.mark.parametrize("case", CASES)
def test_converted_file_matches_reference(case, backend):
    if backend not in selected_backends():
        pytest.skip(f"{backend} is not available here (or not in MOE_TEST_BACKENDS)")
    expected = fixture(case)
    layers = moe_swift.from_pretrained(FIXTURES / f"{case}.gguf", backend=backend)
    assert sorted(layers) == sorted({L for L, _ in expected})
    for (L, T), (x, deq, ref) in expected.items():
        got = layers[L](x)
        err = np.abs(got - deq).max()
        assert err <= spec_tolerance(deq), f"{case} layer {L} T={T}: max |ours - reference| {err:.3e}"
        quantized = QUANTIZED_REL_RMS.get(case.rsplit("-", 1)[1])
        if quantized:
            assert rel_rms(got, ref) <= quantized, f"{case} layer {L} T={T}: {rel_rms(got, ref):.3f}"
        else:
            err = np.abs(got - ref).max()
            assert err <= spec_tolerance(ref), f"{case} layer {L} T={T}: max |ours - original| {err:.3e}"
    for layer in layers.values():
        layer.close()


# --- llama.cpp's loader rules, on edited copies of converted files -------------------

def _tensor_info(raw: bytes, name: str) -> int:
    """The offset of `name`'s tensor info (just after its name) in a GGUF file's header."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = raw.find(key)
    assert at >= 0 and raw.find(key, at + 1) < 0, name
    return at + len(key)


def _renamed(tmp_path, case, old, new):
    """A copy of `case` whose tensor `old` is called `new` (same length): `old` is absent."""
    assert len(old) == len(new)
    raw = bytearray((FIXTURES / f"{case}.gguf").read_bytes())
    at = _tensor_info(raw, old)
    raw[at - len(old):at] = new.encode()
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(raw)
    return path


def test_trailing_unit_dimension_is_absent_as_in_llama_cpp(tmp_path):
    """The converter writes Qwen2-MoE's shared-expert gate (a (1, H) Linear) as ne [H, 1];
    llama.cpp asks for [H] and compares dimensions with absent ones as 1. Any other
    shape of the same size stays an error naming the tensor."""
    name = "blk.0.ffn_gate_inp_shexp.weight"
    raw = bytearray((FIXTURES / "qwen2_moe-f32.gguf").read_bytes())
    at = _tensor_info(raw, name)
    dims, h, one = struct.unpack_from("<IQQ", raw, at)
    assert (dims, one) == (2, 1), "the converter's layout changed: this test no longer tests the rule"
    moe_swift.from_pretrained(FIXTURES / "qwen2_moe-f32.gguf", 0, backend="cpu").close()
    struct.pack_into("<IQQ", raw, at, 2, h // 2, 2)
    path = tmp_path / "m.gguf"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=f"{name} has shape \\(2, {h // 2}\\)"):
        moe_swift.from_pretrained(path, 0, backend="cpu")


@pytest.mark.parametrize("case, tensor", [
    ("qwen2_moe-f32", "blk.0.ffn_gate_inp_shexp.weight"),
    ("qwen2_moe-f32", "blk.0.ffn_down_shexp.weight"),
    ("glm4_moe-f32", "blk.1.exp_probs_b.bias"),
    ("gpt_oss-f32", "blk.0.ffn_gate_inp.bias"),
    ("gpt_oss-f32", "blk.0.ffn_up_exps.bias"),
    ("gpt_oss-f32", "blk.0.ffn_down_exps.bias"),
    ("mixtral-f32", "blk.0.ffn_up_exps.weight"),
])
def test_a_required_tensor_is_refused_by_name(tmp_path, case, tensor):
    path = _renamed(tmp_path, case, tensor, tensor[:-1] + "X")
    layer = int(tensor.split(".")[1])
    with pytest.raises(ValueError, match=f"no tensor {tensor.replace('.', '[.]')} in .*requires it"):
        moe_swift.from_pretrained(path, layer, backend="cpu")


def test_ungated_llama_experts_are_refused_as_such(tmp_path):
    """llama.cpp's llama loader makes ffn_gate_exps optional (its experts then run
    ungated); this layer computes gated experts only, and says so."""
    path = _renamed(tmp_path, "mixtral-f32", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_gate_exps.weighX")
    with pytest.raises(ValueError, match="no blk[.]0[.]ffn_gate_exps[.]weight: llama.cpp runs such llama experts "
                                         "ungated"):
        moe_swift.from_pretrained(path, 0, backend="cpu")


def test_an_optional_tensor_may_be_absent(tmp_path):
    """deepseek2's selection bias is TENSOR_NOT_REQUIRED in llama.cpp (DeepSeek-V2 has none)."""
    path = _renamed(tmp_path, "deepseek_v3-f32", "blk.1.exp_probs_b.bias", "blk.1.exp_probs_b.biaX")
    moe_swift.from_pretrained(path, 1, backend="cpu").close()
