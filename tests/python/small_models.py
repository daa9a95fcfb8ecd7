"""Tiny stand-ins for the small MoE models the README names for a first run: the same
model_type and tensor layout, written by the framework the named command runs (mlx-lm's
converter recipe: `quantize_model` at 4 bits with the model's own rule for what stays at 8;
transformers' `save_pretrained` in bfloat16, as the Hub's originals are stored), with a
tokenizer of the model's kind: byte-level BPE trained here on a few sentences, carrying
the model's special tokens and a chat template of the model's form."""

from __future__ import annotations

import json
import pathlib

# model_type -> (the Hub id the README names, its chat template's form, its end-of-text token,
# the special tokens that template uses).
MODELS = {
    "granitemoe": ("ibm-granite/granite-3.1-1b-a400m-instruct",
                   "{% for m in messages %}<|start_of_role|>{{ m['role'] }}<|end_of_role|>{{ m['content'] }}"
                   "<|end_of_text|>\n{% endfor %}{% if add_generation_prompt %}<|start_of_role|>assistant"
                   "<|end_of_role|>{% endif %}",
                   "<|end_of_text|>", ["<|start_of_role|>", "<|end_of_role|>"]),
    "olmoe": ("allenai/OLMoE-1B-7B-0125-Instruct",
              "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
              "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
              "<|endoftext|>", []),
    "qwen2_moe": ("Qwen/Qwen1.5-MoE-A2.7B-Chat",
                  "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
                  "<|im_end|>", ["<|im_start|>", "<|endoftext|>"]),
    "gpt_oss": ("openai/gpt-oss-20b",
                "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
                "{% if add_generation_prompt %}<|start|>assistant{% endif %}",
                "<|return|>", ["<|start|>", "<|message|>", "<|end|>"]),
}
VOCAB = 320
# Sizes every family's configuration accepts (a key a family lacks is ignored by it); widths
# of 64 so that mlx-lm's 4-bit groups of 64 divide every expert matrix.
CONFIG = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, vocab_size=VOCAB, rope_theta=10000.0,
              max_position_embeddings=256, tie_word_embeddings=False, num_experts=8, num_local_experts=8,
              num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
              decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False, embedding_multiplier=12.0,
              attention_multiplier=0.25, residual_multiplier=0.22, logits_scaling=4.0, sliding_window=16)
# How mlx-lm's files of each are quantized: gpt-oss as OpenAI ships it (MXFP4 experts, which
# mlx-lm reads as they are), the others as `mlx_lm convert -q` writes them.
MLX_QUANTIZATION = {"gpt_oss": dict(mode="mxfp4", group_size=32, bits=4)}
# What one family needs besides (layer_types is also a field of other families, with other values).
FAMILY_CONFIG = {"gpt_oss": dict(layer_types=["sliding_attention", "full_attention"])}
TEXT = ["The capital of France is Paris.", "Mixture of experts models route each token to a few experts.",
        "A small model runs on a laptop.", "Hello, how are you today?", "Write a short poem about the sea."]


def save_tokenizer(folder, model_type):
    """A byte-level BPE tokenizer of VOCAB entries at most, with the model's special tokens,
    end-of-text token and chat template, written as transformers writes tokenizers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    _, template, eos, specials = MODELS[model_type]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 8, special_tokens=[eos, *specials],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT * 4, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos,
                            chat_template=template).save_pretrained(folder)
    assert len(tok.get_vocab()) <= VOCAB


def eos_id(folder):
    return json.loads((pathlib.Path(folder) / "tokenizer.json").read_text())["added_tokens"][0]["id"]


def mlx_checkpoint(folder, model_type, quantize=True):
    """The tiny model as mlx-lm's converter writes a quantized one (mlx-community's files)."""
    import importlib

    import mlx.core as mx
    from mlx_lm.utils import quantize_model, save_config, save_model

    folder = pathlib.Path(folder)
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    save_tokenizer(folder, model_type)
    config = dict(CONFIG, **FAMILY_CONFIG.get(model_type, {}), model_type=model_type, eos_token_id=eos_id(folder))
    mx.random.seed(0)
    model = module.Model(module.ModelArgs.from_dict(config))
    # Weights of the scale real ones have: the default init gives logits too flat to pick tokens.
    model.update(_scaled(model.parameters(), mx))
    if quantize:
        model, config = quantize_model(model, config, **MLX_QUANTIZATION.get(model_type, dict(group_size=64, bits=4)))
    save_model(folder, model)
    save_config(config, config_path=folder / "config.json")
    return folder


def _scaled(tree, mx):
    if isinstance(tree, dict):
        return {k: _scaled(v, mx) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_scaled(v, mx) for v in tree]
    if tree.ndim >= 2:
        return mx.random.normal(tree.shape, dtype=tree.dtype) * 0.2
    return tree


def transformers_checkpoint(folder, model_type):
    """The tiny model as transformers' save_pretrained writes it, in bfloat16."""
    import torch
    import transformers

    folder = pathlib.Path(folder)
    save_tokenizer(folder, model_type)
    known = transformers.AutoConfig.for_model(model_type).to_dict()  # the family's fields
    config = transformers.AutoConfig.for_model(model_type, **{
        k: v for k, v in dict(CONFIG, **FAMILY_CONFIG.get(model_type, {}), eos_token_id=eos_id(folder),
                              pad_token_id=eos_id(folder)).items()
        if k in known or k in ("eos_token_id", "pad_token_id")})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
    model.to(torch.bfloat16).save_pretrained(folder)
    return folder
