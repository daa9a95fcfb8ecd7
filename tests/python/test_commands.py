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


def _fails(*args):
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, HF_HUB_OFFLINE="1"))
    return out.returncode, out.stderr.strip().splitlines()


@pytest.mark.parametrize("extra, message", [
    (["--prompt", ""], "error: --prompt is empty"),
    (["--model", "/nonexistent/model"], "error: --model /nonexistent/model: no such folder"),
    (["--temperature", "nan"], "argument --temperature: must be a finite number >= 0"),
    (["--temperature", "-1"], "argument --temperature: must be a finite number >= 0"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: must be at least 1"),
    (["--backend", "gpu"], "argument --backend: invalid choice: 'gpu'"),
    (["--dtype", "float64"], "argument --dtype: invalid choice: 'float64'"),
])
def test_transformers_command_usage_errors(tmp_path, extra, message):
    """Bad arguments: one line on stderr naming the argument, exit code 2, before torch or
    the model is touched."""
    base = {"--model": "org/name", "--prompt": "w1"}
    for flag, value in zip(extra[::2], extra[1::2]):
        base[flag] = value
    args = [a for pair in base.items() for a in pair]
    code, lines = _fails("-m", "moe_swift.transformers", "generate", *args)
    assert code == 2 and message in lines[-1], lines
    assert not any(line.startswith("Traceback") for line in lines), lines


def test_transformers_command_folder_checks(tmp_path):
    code, lines = _fails("-m", "moe_swift.transformers", "generate", "--model", str(tmp_path), "--prompt", "w1")
    assert code == 2 and lines == [f"python -m moe_swift.transformers: error: --model {tmp_path}: the folder has no "
                                   "config.json (a transformers model's folder has)"]
    (tmp_path / "config.json").write_text("{}")
    code, lines = _fails("-m", "moe_swift.transformers", "generate", "--model", str(tmp_path), "--prompt", "w1")
    assert code == 2 and len(lines) == 1 and "the folder has no tokenizer (tokenizer.json" in lines[0]


def test_commands_answer_help():
    for module in ("moe_swift", "moe_swift.mlx_lm", "moe_swift.transformers"):
        out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "usage:" in out.stdout, (module, out.stderr)
    code, lines = _fails("-m", "moe_swift.mlx_lm", "serve")
    assert code == 2 and lines[0] == "unknown command 'serve'"
