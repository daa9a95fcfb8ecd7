"""Tiny mlx-lm models with random weights (the same on every process for one seed), for
the mlx-lm integration's tests and its sharded runs (mlx_lm_shard_rank.py)."""

import mlx.core as mx


def tiny(family, seed=0):
    """An mlx-lm Model of `family` (qwen3_moe, gpt_oss, deepseek_v3) at toy sizes whose
    head and expert counts divide by 2 and 4 (mlx-lm's shard() splits them)."""
    mx.random.seed(seed)
    if family == "qwen3_moe":
        from mlx_lm.models import qwen3_moe as m
        args = m.ModelArgs(model_type="qwen3_moe", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
                           num_attention_heads=4, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
                           mlp_only_layers=[], moe_intermediate_size=64, rms_norm_eps=1e-6, vocab_size=97,
                           num_key_value_heads=4, head_dim=16, rope_theta=10000.0, tie_word_embeddings=False,
                           max_position_embeddings=64, norm_topk_prob=True)
    elif family == "gpt_oss":
        from mlx_lm.models import gpt_oss as m
        args = m.ModelArgs(model_type="gpt_oss", hidden_size=64, num_hidden_layers=2, intermediate_size=64,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
                           num_experts_per_tok=2, vocab_size=97, sliding_window=8,
                           layer_types=["sliding_attention", "full_attention"], rms_norm_eps=1e-5)
    elif family == "deepseek_v3":
        from mlx_lm.models import deepseek_v3 as m
        args = m.ModelArgs(model_type="deepseek_v3", vocab_size=97, hidden_size=64, intermediate_size=96,
                           moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=2.5,
                           kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16,
                           n_group=2, topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1,
                           max_position_embeddings=64)
    else:
        raise KeyError(family)
    model = m.Model(args)
    mx.eval(model.parameters())
    return model


TOKENS = [[1, 5, 9, 2, 7, 3, 11]]
