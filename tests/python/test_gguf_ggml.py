"""Whole layers from GGUF files against ggml's own graph: the committed fixtures of
tests/fixtures/gguf_ggml/ (one tiny file per llama.cpp MoE architecture, blocks quantized
by ggml in Q4_K_M's per-tensor mix, MXFP4 for gpt-oss) with the outputs ggml computed for
them (tests/fixtures/make_gguf_ggml.py, which regenerates them: llama.cpp's
build_moe_ffn as ggml ops). No ggml is needed here.

Two outputs per input: ggml's graph on ggml's float32 dequantization of the blocks, which
every backend and the float64 reference must match to the reference tolerance; and the
same graph on the blocks themselves, as llama.cpp runs it, whose quantized mul_mat_id
rounds the activations to 8-bit blocks (Q8_K / Q8_0) first, so it is matched loosely."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import moe_swift
from moe_swift import reference

from families import selected_backends, spec_tolerance

pytest.importorskip("gguf")
from test_gguf import read_tensors, reference_layer  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_ggml"
CASES = sorted(p.stem for p in FIXTURES.glob("*.gguf"))
# ggml's 8-bit activations alone set its output on the blocks apart from the exact layer:
# a relative RMS error near 0.01-0.02 on these fixtures; a wrong expert or weight is ~1.
ACTIVATIONS_8BIT_REL_RMS = 0.05


def rel_rms(got, want):
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)))


def fixture(case):
    z = np.load(FIXTURES / f"{case}.npz")
    tokens = sorted(int(k[1:]) for k in z.files if k.startswith("x"))
    return FIXTURES / f"{case}.gguf", json.loads(str(z["options"])), {T: (z[f"x{T}"], z[f"f32_{T}"], z[f"blocks{T}"])
                                                                        for T in tokens}


def test_every_architecture_has_a_fixture():
    assert CASES == sorted(["deepseek2", "glm4moe", "gpt-oss", "mixtral", "olmoe", "qwen2moe", "qwen3moe"])


@pytest.mark.parametrize("backend", ["cpu", "softmetal", "metal"])
@pytest.mark.parametrize("case", CASES)
def test_layer_matches_ggml(case, backend):
    if backend not in selected_backends():
        pytest.skip(f"{backend} is not available here (or not in MOE_TEST_BACKENDS)")
    path, _, outputs = fixture(case)
    layer = moe_swift.from_pretrained(path, 0, backend=backend)
    assert layer.backend == backend
    for T, (x, ggml_f32, ggml_blocks) in outputs.items():
        got = layer(x)
        err = np.abs(got - ggml_f32).max()
        assert err <= spec_tolerance(ggml_f32), f"{case} T={T}: max |ours - ggml| {err:.3e} > {spec_tolerance(ggml_f32):.3e}"
        assert rel_rms(got, ggml_blocks) <= ACTIVATIONS_8BIT_REL_RMS, f"{case} T={T}"


@pytest.mark.parametrize("case", CASES)
def test_reference_matches_ggml(case):
    path, opts, outputs = fixture(case)
    (router, gate, up, down), kw = reference_layer(read_tensors(path), 0, opts)
    for T, (x, ggml_f32, ggml_blocks) in outputs.items():
        want = reference.moe_forward(x, router, gate, up, down, **kw)
        assert np.abs(want - ggml_f32).max() <= spec_tolerance(ggml_f32), f"{case} T={T}"
        assert rel_rms(want, ggml_blocks) <= ACTIVATIONS_8BIT_REL_RMS, f"{case} T={T}"
