"""moe_swift inside mlx-lm models (skipped without mlx and mlx-lm): patched tiny random
models agree with unpatched ones, in float32, bfloat16 and quantized (4-bit experts with
an 8-bit router, as mlx-lm writes Qwen3-MoE)."""

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")
import mlx.nn as nn  # noqa: E402

import moe_swift.integrations.mlx_lm as moe_mlx  # noqa: E402
from mlx_lm_models import tiny  # noqa: E402


def logits(model):
    return np.array(model(mx.array([[1, 5, 9, 2, 7, 3, 11]])).astype(mx.float32))


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_patched_model_matches(family):
    model = tiny(family)
    ref = logits(model)
    assert moe_mlx.patch(model, backend="cpu") == 2
    np.testing.assert_allclose(logits(model), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss", "deepseek_v3"])
def test_non_default_activation_knobs(family):
    """Every number an experts module's activation holds (gpt-oss's alpha and limit),
    found on the modules rather than named here, set to a value no model ships with and
    small enough to bind (the tiny models' gates are about 1): the patched model must give
    the unpatched one's logits, which differ from the defaults' (issue 46: the patch
    dropping a knob passed while every test used the defaults)."""
    from mlx_lm.models.switch_layers import SwitchGLU
    model = tiny(family)
    default = logits(model)
    knobs = set()
    for _, module in model.named_modules():
        if isinstance(module, SwitchGLU):
            for name, value in vars(module.activation).items():
                if isinstance(value, float):
                    setattr(module.activation, name, value * 0.05)
                    knobs.add(name)
    if not knobs:
        pytest.skip(f"{family}: its experts' activation has no knob (mlx-lm's SwiGLU)")
    ref = logits(model)
    assert np.abs(ref - default).max() > 1e-2, f"{sorted(knobs)} at these values change nothing"
    moe_mlx.patch(model, backend="cpu")
    np.testing.assert_allclose(logits(model), ref, rtol=1e-4, atol=1e-4)


def test_quantized_model_keeps_its_format():
    model = tiny("qwen3_moe")
    nn.quantize(model, group_size=64, bits=4,
                class_predicate=lambda path, m: hasattr(m, "to_quantized") and not path.endswith("gate"))
    nn.quantize(model, group_size=64, bits=8,
                class_predicate=lambda path, m: hasattr(m, "to_quantized") and path.endswith("mlp.gate"))
    ref = logits(model)
    moe_mlx.patch(model, backend="cpu")
    # MLX's quantized matmuls round differently from the exact dequantized values ours use.
    np.testing.assert_allclose(logits(model), ref, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("quantized", [False, True])
def test_gradients_are_switch_glu_ones(quantized):
    """mx.grad and nn.value_and_grad through the patch: SwitchGLU's own gradients, for the
    experts' weights (unless quantized: frozen), everything below them and the block's
    input (0 before)."""
    from mlx.utils import tree_flatten

    ids = mx.array([[1, 5, 9, 2, 7, 3, 11]])

    def loss(model):
        return model(ids).astype(mx.float32).square().mean()

    reference, patched = tiny("qwen3_moe"), tiny("qwen3_moe")
    if quantized:
        for model in (reference, patched):
            nn.quantize(model, group_size=64, bits=4,
                        class_predicate=lambda path, m: hasattr(m, "to_quantized") and not path.endswith("gate"))
    assert moe_mlx.patch(patched, backend="cpu") == 2
    ref_loss, ref_grads = nn.value_and_grad(reference, loss)(reference)
    our_loss, our_grads = nn.value_and_grad(patched, loss)(patched)
    np.testing.assert_allclose(np.array(our_loss), np.array(ref_loss), rtol=1e-5)
    ref_grads, our_grads = dict(tree_flatten(ref_grads)), dict(tree_flatten(our_grads))
    assert ref_grads.keys() == our_grads.keys() and any("switch_mlp" in n for n in our_grads) != quantized
    for name in ref_grads:
        np.testing.assert_allclose(np.array(our_grads[name]), np.array(ref_grads[name]), rtol=1e-4, atol=1e-6,
                                   err_msg=name)

    x = mx.random.normal((5, 64), key=mx.random.key(3))
    block = lambda m: (lambda v: m.model.layers[1].mlp(v).square().sum())  # noqa: E731
    expected = np.array(mx.grad(block(reference))(x))
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(np.array(mx.grad(block(patched))(x)), expected, rtol=1e-4, atol=1e-5)


def test_activation_quantization_reaches_the_layers_and_their_copies():
    """patch(..., activation_quantization="q8"): 8-bit activations for the quantized experts,
    close to the float-exact patch, kept by copies."""
    import copy

    def quantized():
        model = tiny("qwen3_moe")
        nn.quantize(model, group_size=64, bits=4,
                    class_predicate=lambda path, m: hasattr(m, "to_quantized") and not path.endswith("gate"))
        return model

    exact, q8 = quantized(), quantized()
    moe_mlx.patch(exact, backend="cpu")
    moe_mlx.patch(q8, backend="cpu", activation_quantization="q8")
    ref, got = logits(exact), logits(q8)
    assert not np.array_equal(got, ref)
    np.testing.assert_allclose(got, ref, rtol=0.05, atol=0.05 * np.abs(ref).max())
    np.testing.assert_array_equal(logits(copy.deepcopy(q8)), got)


def test_updated_weights_are_seen_and_models_copy():
    import copy
    import pickle

    from mlx.utils import tree_map

    reference, patched = tiny("qwen3_moe"), tiny("qwen3_moe")
    moe_mlx.patch(patched, backend="cpu")
    logits(patched)
    for model in (reference, patched):  # what an optimizer step does: new arrays in the tree
        model.update(tree_map(lambda p: p * 1.25, model.parameters()))
    np.testing.assert_allclose(logits(patched), logits(reference), rtol=1e-4, atol=1e-4)
    for clone in (copy.deepcopy(patched), pickle.loads(pickle.dumps(patched))):
        np.testing.assert_array_equal(logits(clone), logits(patched))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_half_precision_experts_read_and_write_their_dtype(family, dtype):
    """A bfloat16 / float16 SwitchGLU, patched, returns its dtype and what the float32
    SwitchGLU computes on the same (rounded) weights and inputs, to the output's rounding;
    mlx's own CPU SwitchGLU runs only float32, so that is the reference."""
    from mlx_lm.models.switch_layers import SwitchGLU

    dtype = getattr(mx, dtype)
    glu = next(m for _, m in tiny(family).named_modules() if isinstance(m, SwitchGLU))
    mx.random.seed(3)
    for linear in (glu.gate_proj, glu.up_proj, glu.down_proj):  # weights the half dtype holds exactly
        linear.weight = (mx.random.normal(linear.weight.shape) * 0.3).astype(dtype).astype(mx.float32)
    x = (mx.random.normal((3, 5, 64)) * 2).astype(dtype)
    indices = mx.array(np.random.default_rng(4).integers(0, 8, (3, 5, 2)).astype(np.uint32))
    reference = np.array(glu(x.astype(mx.float32), indices))
    glu.set_dtype(dtype)
    y = moe_mlx.FusedSwitchGLU(glu, backend="cpu")(x, indices)
    assert y.dtype == dtype and y.shape == (3, 5, 2, 64)
    np.testing.assert_allclose(np.array(y.astype(mx.float32)), reference, rtol=1e-2,
                               atol=1e-2 * np.abs(reference).max())
    assert np.abs(reference).max() > 1  # outputs large enough that a rounding slip shows


@pytest.mark.parametrize("bad", [8, 2**31 + 1, 2**32 - 1])
def test_out_of_range_ids_are_refused(bad):
    """uint32 ids (mlx-lm's argpartition gives them) past the experts, including those that
    read negative as int32, raise instead of reading another expert's weights."""
    from mlx_lm.models.switch_layers import SwitchGLU

    glu = next(m for _, m in tiny("qwen3_moe").named_modules() if isinstance(m, SwitchGLU))
    glu.set_dtype(mx.bfloat16)
    fused = moe_mlx.FusedSwitchGLU(glu, backend="cpu")
    x = mx.random.normal((1, 2, 64)).astype(mx.bfloat16)
    good = mx.array(np.array([[[0, 1], [2, 3]]], np.uint32))
    assert fused(x, good).shape == (1, 2, 2, 64)
    with pytest.raises(ValueError, match="not an expert id"):
        mx.eval(fused(x, mx.array(np.array([[[0, 1], [2, bad]]], np.uint32))))


@pytest.mark.parametrize("limit", [0.5, 0.0])
def test_deepseek_v41_clamped_swiglu(limit):
    """DeepSeek-V4.1's experts (mlx-lm's DeepseekV41SwiGLU: SwiGLU with gate and up clamped at
    its limit, none where the limit is 0) run as swiglu_clamped (silu where unclamped)."""
    v41 = pytest.importorskip("mlx_lm.models.deepseek_v41", reason="mlx-lm without DeepSeek-V4.1")
    from mlx_lm.models.switch_layers import SwitchGLU

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.switch_mlp = SwitchGLU(64, 32, 8, activation=v41.DeepseekV41SwiGLU(limit))

        def __call__(self, x, indices):
            return self.switch_mlp(x, indices)

    mx.random.seed(3)
    block = Block()
    mx.eval(block.parameters())
    x = mx.random.normal((5, 64)) * 2
    indices = mx.array(np.random.default_rng(0).integers(0, 8, (5, 2)).astype(np.int32))
    ref = np.array(block(x, indices))
    gate = np.einsum("th,tkih->tki", np.array(x), np.array(block.switch_mlp.gate_proj.weight)[np.array(indices)])
    assert limit == 0 or np.abs(gate).max() > 2 * limit  # the clamp binds
    assert moe_mlx.patch(block, backend="cpu") == 1
    np.testing.assert_allclose(np.array(block(x, indices)), ref, rtol=1e-4, atol=1e-5)
