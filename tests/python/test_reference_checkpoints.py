"""Checkpoints written by transformers and mlx-lm themselves (tests/fixtures/checkpoints/,
made by tests/fixtures/make_reference_checkpoints.py): moe_swift.from_pretrained must
give what the writers' own MoE blocks computed (expected.npz), with neither torch nor
mlx installed here."""

import pathlib

import numpy as np
import pytest

import moe_swift

ROOT = pathlib.Path(__file__).parents[1] / "fixtures" / "checkpoints"
FOLDERS = sorted(p.name for p in ROOT.iterdir() if (p / "expected.npz").exists())
BACKENDS = [b for b in ("cpu", "softmetal") if b in moe_swift.available_backends()]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("folder", FOLDERS)
def test_checkpoint_gives_the_writers_outputs(folder, backend):
    expected = np.load(ROOT / folder / "expected.npz")
    moe_layers = sorted(int(k[1:]) for k in expected.files if k.startswith("y"))
    layers = moe_swift.from_pretrained(ROOT / folder, backend=backend)
    assert sorted(layers) == moe_layers
    x = expected["x"]
    for i, layer in layers.items():
        want = expected[f"y{i}"]
        # 4-bit: MLX's quantized matmuls round their products, ours use the exact values.
        tolerance = 2e-3 if "4bit" in folder else 1e-5
        np.testing.assert_allclose(layer(x), want, rtol=tolerance, atol=tolerance * np.abs(want).max())
        layer.close()


def test_a_dense_layer_is_refused_by_name():
    with pytest.raises(ValueError, match="first_k_dense_replace"):
        moe_swift.from_pretrained(ROOT / "deepseek_v3", layer=0)
