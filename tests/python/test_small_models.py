"""The small MoE models the README names for a first run ("Small models to start with"),
each run offline as a tiny checkpoint of the same model_type and layout with a tokenizer of
its kind (tests/python/small_models.py), through the very commands the README gives:
`python -m moe_swift.mlx_lm chat|generate` on mlx-lm's 4-bit files (needs mlx-lm) and
`python -m moe_swift.transformers chat` on transformers' bf16 files (needs torch). Each must
give the text of the framework's own path, and from_pretrained must load its layers."""

import pathlib
import re

import numpy as np
import pytest

import moe_swift
from small_models import MODELS, mlx_checkpoint, transformers_checkpoint
from test_commands import TIMING, run

README = pathlib.Path(__file__).parents[2] / "README.md"


def readme_models():
    """(Hub id, model_type) of each row of the README's table of small models."""
    text = README.read_text()
    table = text[text.index("## Small models to start with"):]
    table = table[:table.index("\n## ", 1)]
    return re.findall(r"^\| \[`?([\w.-]+/[\w.-]+)`?\]\([^)]*\) \| `(\w+)` \|", table, re.M)


def test_the_readme_names_these_models():
    """Both sides: every model the README names is tested here, and every one tested is named."""
    named = readme_models()
    assert sorted(t for _, t in named) == sorted(MODELS), named
    assert sorted(named) == sorted((hub, t) for t, (hub, *_) in MODELS.items())


@pytest.mark.parametrize("model_type", sorted(MODELS))
def test_mlx_lm_command(tmp_path, model_type):
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    folder = mlx_checkpoint(tmp_path / model_type, model_type)
    args = ["generate", "--model", str(folder), "--prompt", "The capital of France is", "--max-tokens", "12"]
    ours = run("-m", "moe_swift.mlx_lm", *args)
    theirs = run("-m", "mlx_lm", *args)
    assert "2 SwitchGLU layer(s) run on moe_swift" in ours.stderr
    text = lambda out: out.stdout.split("==========")[1].strip()
    assert text(ours) == text(theirs) and len(text(ours)) > 0
    assert re.search(r"Generation: \d+ tokens, [\d.]+ tokens-per-sec", ours.stdout), ours.stdout
    layers = moe_swift.from_pretrained(folder)
    assert sorted(layers) == [0, 1]
    x = np.random.default_rng(0).standard_normal((3, 64), dtype=np.float32)
    assert np.all(np.isfinite(layers[0](x)))


@pytest.mark.parametrize("model_type", sorted(MODELS))
def test_transformers_command(tmp_path, model_type):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    folder = transformers_checkpoint(tmp_path / model_type, model_type)
    args = ["-m", "moe_swift.transformers", "chat", "--model", str(folder), "--max-new-tokens", "10"]
    messages = "The capital of France is\nWrite a short poem about the sea.\n"
    # In float32 the text is eager's token for token; in the stored bfloat16 ("auto") each
    # path rounds differently (eager every op, ours once), so greedy picks may part at a near-tie.
    ours = run(*args, "--dtype", "float32", input=messages)
    eager = run(*args, "--dtype", "float32", "--experts-implementation", "eager", input=messages)
    assert ours.stdout == eager.stdout and ours.stdout.count("\n") == 2, (ours.stdout, eager.stdout)
    stored = run(*args, input=messages)
    for out in (ours, stored):
        timing = [TIMING.match(line) for line in out.stderr.splitlines() if line.startswith("python -m")]
        assert len(timing) == 2 and all(timing), out.stderr
    layers = moe_swift.from_pretrained(folder)
    assert sorted(layers) == [0, 1]
