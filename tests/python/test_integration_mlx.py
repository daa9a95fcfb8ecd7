"""moe_swift inside mlx-lm models (skipped without mlx and mlx-lm): patched tiny random
models agree with unpatched ones, in float32, bfloat16 and quantized (4-bit experts with
an 8-bit router, as mlx-lm writes Qwen3-MoE)."""

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")
import mlx.nn as nn  # noqa: E402

import moe_swift.integrations.mlx_lm as moe_mlx  # noqa: E402


def tiny(family):
    mx.random.seed(0)
    if family == "qwen3_moe":
        from mlx_lm.models import qwen3_moe as m
        args = m.ModelArgs(model_type="qwen3_moe", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
                           num_attention_heads=4, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
                           mlp_only_layers=[], moe_intermediate_size=64, rms_norm_eps=1e-6, vocab_size=97,
                           num_key_value_heads=2, head_dim=16, rope_theta=10000.0, tie_word_embeddings=False,
                           max_position_embeddings=64, norm_topk_prob=True)
    else:
        from mlx_lm.models import gpt_oss as m
        args = m.ModelArgs(model_type="gpt_oss", hidden_size=64, num_hidden_layers=2, intermediate_size=64,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
                           num_experts_per_tok=2, vocab_size=97, sliding_window=8,
                           layer_types=["sliding_attention", "full_attention"], rms_norm_eps=1e-5)
    model = m.Model(args)
    return model


def logits(model):
    return np.array(model(mx.array([[1, 5, 9, 2, 7, 3, 11]])).astype(mx.float32))


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_patched_model_matches(family):
    model = tiny(family)
    ref = logits(model)
    assert moe_mlx.patch(model, backend="cpu") == 2
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
