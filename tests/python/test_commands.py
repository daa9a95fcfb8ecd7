"""The commands a user runs: `python -m moe_swift` (what is here), `python -m moe_swift.mlx_lm
generate` and `python -m moe_swift.transformers generate` on tiny random models with a
word-level tokenizer, made offline: the same greedy text as the framework's own path."""

import json
import os
import subprocess
import sys

import pytest


def run(*args, timeout=600):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def save_tokenizer(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(95)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>").save_pretrained(folder)


SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=97, max_position_embeddings=64, norm_topk_prob=True)


def test_listing():
    out = run("-m", "moe_swift").stdout
    assert "backends:" in out and "python -m moe_swift.mlx_lm" in out and "python -m moe_swift.transformers" in out
    assert run("-m", "moe_swift", "--library").stdout.strip().endswith((".so", ".dylib"))


def test_mlx_lm_generate(tmp_path):
    mx = pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    pytest.importorskip("transformers")  # the tokenizer's files
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3_moe
    config = dict(SIZES, model_type="qwen3_moe", intermediate_size=96, num_experts=8, num_experts_per_tok=2,
                  decoder_sparse_step=1, mlp_only_layers=[], moe_intermediate_size=64, rms_norm_eps=1e-6,
                  rope_theta=10000.0, tie_word_embeddings=False)
    mx.random.seed(0)
    model = qwen3_moe.Model(qwen3_moe.ModelArgs(**config))
    mx.save_safetensors(str(tmp_path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_tokenizer(tmp_path)
    args = ["generate", "--model", str(tmp_path), "--prompt", "w1 w2 w3", "--max-tokens", "8",
            "--ignore-chat-template"]
    ours = run("-m", "moe_swift.mlx_lm", *args)
    theirs = run("-m", "mlx_lm", *args)
    assert "2 SwitchGLU layer(s) run on moe_swift" in ours.stderr
    text = lambda out: out.stdout.split("==========")[1].strip()
    assert text(ours) == text(theirs) and len(text(ours).split()) == 8


def test_mlx_lm_usage():
    out = subprocess.run([sys.executable, "-m", "moe_swift.mlx_lm"], capture_output=True, text=True)
    assert out.returncode == 2 and "generate,chat,server" in out.stderr


def test_transformers_generate(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(**SIZES, intermediate_size=96, num_experts=8, num_experts_per_tok=2,
                                         moe_intermediate_size=64)
    transformers.Qwen3MoeForCausalLM(config).save_pretrained(tmp_path)
    save_tokenizer(tmp_path)
    args = ["-m", "moe_swift.transformers", "generate", "--model", str(tmp_path), "--prompt", "w1 w2 w3",
            "--max-new-tokens", "8"]
    ours = run(*args).stdout.strip()
    eager = run(*args, "--experts-implementation", "eager").stdout.strip()
    assert ours == eager and len(ours.split()) == 8
