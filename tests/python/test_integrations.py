"""moe_swift as transformers' experts backend (skipped without torch and transformers):
tiny random models of each family give the same logits and the same greedy tokens with
experts_implementation="moe_swift" as with "eager"."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from moe_swift.integrations import transformers as moe_tf  # noqa: E402

COMMON = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64)
CONFIGS = {
    "qwen3_moe": dict(intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                      norm_topk_prob=True, head_dim=16),
    "qwen2_moe": dict(intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                      shared_expert_intermediate_size=48),
    "mixtral": dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2),
    "olmoe": dict(intermediate_size=32, num_experts=8, num_experts_per_tok=2),
    "gpt_oss": dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, head_dim=16,
                    layer_types=["sliding_attention", "full_attention"], sliding_window=8),
    "deepseek_v3": dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
                        n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                        kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16),
}


def tiny_model(family):
    config = transformers.AutoConfig.for_model(family, **COMMON, **CONFIGS[family])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # make the experts matter: random, not the init's near-zero values
        for name, p in model.named_parameters():
            if "experts" in name:
                p.normal_(0, 0.1)
    return model


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_experts_backend_matches_eager(family):
    name = moe_tf.register(backend="cpu")
    model = tiny_model(family)
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.set_experts_implementation("eager")
        eager = model(ids).logits
        eager_tokens = model.generate(ids[:1], max_new_tokens=8, do_sample=False)
        model.set_experts_implementation(name)
        ours = model(ids).logits
        ours_tokens = model.generate(ids[:1], max_new_tokens=8, do_sample=False)
    assert any(m.__dict__.get("_moe_swift_layer") is not None for m in model.modules()), "the backend never ran"
    np.testing.assert_allclose(ours.numpy(), eager.numpy(), rtol=1e-4, atol=1e-4)
    assert ours_tokens.tolist() == eager_tokens.tolist()
    moe_tf.reset(model)


def test_bfloat16_parameters_stay_bfloat16():
    name = moe_tf.register(backend="cpu")
    model = tiny_model("qwen3_moe").to(torch.bfloat16)
    ids = torch.randint(0, 97, (1, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model.set_experts_implementation("eager")
        eager = model(ids).logits.float()
        model.set_experts_implementation(name)
        ours = model(ids).logits
    assert ours.dtype == torch.bfloat16
    np.testing.assert_allclose(ours.float().numpy(), eager.numpy(), rtol=0.05, atol=0.05)


def test_one_line_of_glue(tmp_path):
    """The README's recipe: importing the module is all it takes before from_pretrained."""
    import moe_swift.integrations.transformers  # noqa: F401  (registers "moe_swift")

    tiny_model("mixtral").save_pretrained(tmp_path)
    ids = torch.randint(0, 97, (1, 9), generator=torch.Generator().manual_seed(3))
    eager = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation="eager").eval()
    ours = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation="moe_swift").eval()
    with torch.no_grad():
        np.testing.assert_allclose(ours(ids).logits.numpy(), eager(ids).logits.numpy(), rtol=1e-4, atol=1e-4)
    assert any(m.__dict__.get("_moe_swift_layer") is not None for m in ours.modules())
