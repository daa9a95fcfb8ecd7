"""The commands a user runs: `python -m moe_swift` (what is here), `python -m moe_swift.mlx_lm
generate` and `python -m moe_swift.transformers generate|chat` on tiny random models with a
word-level tokenizer, made offline: the same greedy text as the framework's own path, the
timing they print, and how they end when the Hub is down."""

import json
import os
import re
import time
import subprocess
import sys

import pytest


def run(*args, timeout=600, input=None, env=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false") if env is None else env
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env,
                         input=input)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


# A chat template as models ship them, reduced to what the word-level tokenizer can spell.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w0 {% endif %}"
# The line the transformers command writes on stderr after each answer.
TIMING = re.compile(r"^python -m moe_swift\.transformers: (\d+) tokens in [\d.]+ s: the first after [\d.]+ s "
                    r"\(a prompt of \d+ tokens\), then [\d.]+ tokens/s; experts: \w+$")


def save_tokenizer(folder, chat_template=None):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(95)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>",
                            chat_template=chat_template).save_pretrained(folder)


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


def tiny_qwen3_moe(folder, chat_template=None):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(**SIZES, intermediate_size=96, num_experts=8, num_experts_per_tok=2,
                                         moe_intermediate_size=64)
    transformers.Qwen3MoeForCausalLM(config).save_pretrained(folder)
    save_tokenizer(folder, chat_template)


def test_transformers_generate(tmp_path):
    tiny_qwen3_moe(tmp_path)
    args = ["-m", "moe_swift.transformers", "generate", "--model", str(tmp_path), "--prompt", "w1 w2 w3",
            "--max-new-tokens", "8"]
    ours = run(*args)
    eager = run(*args, "--experts-implementation", "eager").stdout.strip()
    assert ours.stdout.strip() == eager and len(eager.split()) == 8
    timing = [TIMING.match(line) for line in ours.stderr.splitlines() if line.startswith("python -m")]
    assert len(timing) == 1 and timing[0] and timing[0].group(1) == "8", ours.stderr


def test_transformers_chat(tmp_path):
    """chat: a message per line of stdin, each answered with the conversation so far (the
    second answer differs from the same line asked alone), a timing line per answer."""
    tiny_qwen3_moe(tmp_path, CHAT_TEMPLATE)
    args = ["-m", "moe_swift.transformers", "chat", "--model", str(tmp_path), "--max-new-tokens", "6"]
    ours = run(*args, input="w1 w2 w3\n\nw4 w5\n")
    eager = run(*args, "--experts-implementation", "eager", input="w1 w2 w3\nw4 w5\n")
    alone = run(*args, input="w4 w5\n")
    answers = ours.stdout.strip().splitlines()
    assert answers == eager.stdout.strip().splitlines() and len(answers) == 2
    assert all(len(a.split()) == 6 for a in answers) and answers[1] != alone.stdout.strip()
    timing = [TIMING.match(line) for line in ours.stderr.splitlines() if line.startswith("python -m")]
    assert len(timing) == 2 and all(timing), ours.stderr
    generate = run("-m", "moe_swift.transformers", "generate", "--model", str(tmp_path), "--prompt", "w1 w2 w3",
                   "--max-new-tokens", "6")
    assert generate.stdout.strip() == answers[0]  # the chat template applied alike


def test_transformers_chat_needs_a_chat_model(tmp_path):
    tiny_qwen3_moe(tmp_path)
    code, lines = _fails("-m", "moe_swift.transformers", "chat", "--model", str(tmp_path))
    assert code == 2 and lines[-1].endswith("its tokenizer has no chat template, so it is not a chat model; use "
                                            "generate --no-chat-template"), lines


def _hub_env(cache, **extra):
    """The environment of a command whose Hub is down (nothing listens on 127.0.0.1:9) and
    whose cache is `cache`."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_HOME")}
    return dict(env, HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=str(cache), TOKENIZERS_PARALLELISM="false",
                **extra)


@pytest.mark.parametrize("command", [["moe_swift.transformers", "generate", "--prompt", "w1"],
                                     ["moe_swift.transformers", "chat"], ["moe_swift.mlx_lm", "generate"]])
@pytest.mark.parametrize("offline", [False, True])
def test_hub_model_missing_fails_in_seconds(tmp_path, command, offline):
    """A Hub id that is not in the cache, with the Hub down (or HF_HUB_OFFLINE=1): one line
    saying what was tried and what to do, within seconds (it used to be a minute of the
    download library's retries and a chained traceback)."""
    env = _hub_env(tmp_path, **({"HF_HUB_OFFLINE": "1"} if offline else {}))
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", command[0], command[1], "--model", "org/model", *command[2:]],
                         capture_output=True, text=True, timeout=120, env=env)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    tried = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached: 127.0.0.1:9 did not answer"
    assert f"error: --model org/model: not in the cache {tmp_path} and {tried}" in lines[0]
    assert time.monotonic() - start < 30


def test_hub_model_in_the_cache_runs_with_the_hub_down(tmp_path):
    """A Hub id whose files are in the cache runs with the Hub down, saying so."""
    snapshot = tmp_path / "cache" / "models--org--tiny" / "snapshots" / "0123456789abcdef"
    tiny_qwen3_moe(snapshot)
    (tmp_path / "cache" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "cache" / "models--org--tiny" / "refs" / "main").write_text("0123456789abcdef")
    out = run("-m", "moe_swift.transformers", "generate", "--model", "org/tiny", "--prompt", "w1 w2",
              "--max-new-tokens", "4", env=_hub_env(tmp_path / "cache"))
    assert len(out.stdout.split()) == 4
    assert "the Hub cannot be reached (127.0.0.1:9 did not answer" in out.stderr
    assert f"using org/tiny from the cache {tmp_path / 'cache'}" in out.stderr


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
    for command in (["moe_swift"], ["moe_swift.mlx_lm"], ["moe_swift.transformers"],
                    ["moe_swift.transformers", "generate"], ["moe_swift.transformers", "chat"]):
        out = subprocess.run([sys.executable, "-m", *command, "--help"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "usage:" in out.stdout, (command, out.stderr)
    code, lines = _fails("-m", "moe_swift.mlx_lm", "serve")
    assert code == 2 and lines[0] == "unknown command 'serve'"
