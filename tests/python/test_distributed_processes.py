"""Expert parallelism across processes on this machine, over the engines users run it on:
MLX distributed's ring backend over TCP on 127.0.0.1 (as mlx.launch starts it) and
torch.distributed with gloo (as torchrun starts it). 2 and 4 ranks give the one-process
result within the spec's tolerance; a rank that dies, or ranks that loaded the shares of a
different group size, end every rank with a clear error, never a hang (each rank has a
time limit here). Each rank is tests/python/distributed_rank.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import moe_swift
import moe_swift.distributed
from bench_distributed import rank_environments  # benchmarks/ is on pytest's path

HERE = Path(__file__).resolve().parent
RANK = HERE / "distributed_rank.py"
CHECKPOINTS = HERE.parents[0] / "fixtures" / "checkpoints"
# Each rank ends itself with a traceback after RANK_TIME_LIMIT s (distributed_rank.py: MLX's
# collectives have no time limit of their own); the test kills a group still running later.
RANK_TIME_LIMIT, TIME_LIMIT = 90, 150


def engines():
    found = []
    try:
        import mlx.core as mx  # noqa: F401

        found.append("mlx")
    except ImportError:
        pass
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_gloo_available():
            found.append("torch")
    except ImportError:
        pass
    return found


ENGINES = [pytest.param(e) for e in engines()] or [pytest.param("none", marks=pytest.mark.skip(
    reason="neither mlx nor torch (with gloo) is installed"))]


def launch(engine, size, checkpoint, out, mode="ok", interleave=False):
    """Starts `size` ranks of distributed_rank.py as the engine's launcher would; returns
    [(returncode, stderr)]."""
    return launch_script(engine, size, [str(RANK), engine, str(checkpoint), str(out), "--mode", mode]
                         + (["--interleave"] if interleave else []), out)


def launch_script(engine, size, argv, out):
    """Starts `size` ranks of `python argv` as the engine's launcher would."""
    env = dict(os.environ)
    # The package as this test process imports it (a checkout's python/ or the installed one).
    env["PYTHONPATH"] = os.pathsep.join([str(Path(moe_swift.__file__).parents[1]), env.get("PYTHONPATH", "")])
    env["MOE_RANK_TIME_LIMIT"] = str(RANK_TIME_LIMIT)
    envs = rank_environments(engine, size, out, env)
    procs = [subprocess.Popen([sys.executable, *argv], env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for e in envs]
    results = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=TIME_LIMIT)
            results.append((p.returncode, err))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{engine}: a rank of {size} was still running after {TIME_LIMIT} s (a hang)")
    return results


def inputs(out, H):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, H)).astype(np.float32)
    data = dict(x=x, residual=rng.standard_normal(x.shape).astype(np.float32),
                norm=(rng.random(H) + 0.5).astype(np.float32))
    np.savez(out / "inputs.npz", **data)
    return data


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("size,family,interleave", [(2, "deepseek_v3", False), (4, "deepseek_v3", True),
                                                    (2, "qwen3_moe_mlx_4bit", False)])
def test_ranks_give_the_one_process_result(engine, size, family, interleave, tmp_path):
    path = CHECKPOINTS / family
    whole = moe_swift.from_pretrained(path, backend="cpu", progress=False)
    data = inputs(tmp_path, next(iter(whole.values())).hidden_size)
    results = launch(engine, size, path, tmp_path, interleave=interleave)
    for r, (code, err) in enumerate(results):
        assert code == 0, f"{engine} rank {r} of {size} failed:\n{err[-3000:]}"
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(size)]
    for index, layer in whole.items():
        h, normed = layer(data["x"], data["residual"], next_norm=(data["norm"], 1e-5))
        shares = [list(rank[f"share{index}"]) for rank in ranks]
        assert shares == [list(moe_swift.distributed.expert_share(r, size, layer.num_experts, interleave))
                          for r in range(size)]
        for r, rank in enumerate(ranks):
            for name, got, want in (("h", rank[f"h{index}"], h), ("normed", rank[f"normed{index}"], normed)):
                bound = 1e-5 * float(np.abs(want).max()) + 1e-6
                err = float(np.abs(got - want).max())
                assert err <= bound, f"{engine}, {size} ranks, layer {index}, rank {r}: {name} off by {err:.3g}"
            np.testing.assert_array_equal(rank[f"h{index}"], ranks[0][f"h{index}"])  # the same bits on every rank
    print(f"{engine} {family}, {size} ranks: peak RSS per rank (MiB)",
          [round(int(rank["peak_kib"]) / 1024) for rank in ranks])


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rank_that_dies_ends_the_others_with_an_error(engine, tmp_path):
    path = CHECKPOINTS / "deepseek_v3"
    inputs(tmp_path, moe_swift.from_pretrained(path, layer=1, progress=False).hidden_size)
    results = launch(engine, 3, path, tmp_path, mode="die")
    assert results[2][0] == 3
    for r in (0, 1):
        code, err = results[r]
        assert code != 0, f"{engine}: rank {r} went on without its partner"
        # torch's gloo raises ("Connection closed by peer"); MLX's ring returns a partial
        # sum, which the wrapper's count of ranks finds.
        assert "moe_swift: the group's all-reduce" in err, err[-2000:]


@pytest.mark.parametrize("engine", ENGINES)
def test_shares_of_a_different_group_size_are_refused_on_every_rank(engine, tmp_path):
    path = CHECKPOINTS / "deepseek_v3"
    inputs(tmp_path, moe_swift.from_pretrained(path, layer=1, progress=False).hidden_size)
    results = launch(engine, 2, path, tmp_path, mode="mismatch")
    for r, (code, err) in enumerate(results):
        assert code != 0 and "no rank holds experts" in err, f"{engine} rank {r}:\n{err[-2000:]}"


@pytest.mark.parametrize("family,size,flags", [
    ("qwen3_moe", 4, []), ("qwen3_moe", 2, ["--quantize"]), ("gpt_oss", 2, []),
    ("gpt_oss", 2, ["--quantize", "--patch-first"]), ("deepseek_v3", 2, ["--patch-first"]), ("deepseek_v3", 4, []),
])
def test_mlx_lm_sharded_models_run_with_the_patch(family, size, flags, tmp_path):
    """mlx-lm's own Model.shard(group) splits every expert's intermediate rows across the
    ranks (and divides gpt-oss's down bias by their number) and sums after the MoE block;
    each rank's patched SwitchGLU is then a layer of I / size rows: the logits equal the
    unpatched model's in one process."""
    pytest.importorskip("mlx_lm")
    import mlx.core as mx
    import mlx.nn as nn

    from mlx_lm_models import TOKENS, tiny

    model = tiny(family)
    if "--quantize" in flags:
        nn.quantize(model, group_size=32, bits=8)
    expected = np.array(model(mx.array(TOKENS)).astype(mx.float32))
    results = launch_script("mlx", size, [str(HERE / "mlx_lm_shard_rank.py"), family, str(tmp_path), *flags], tmp_path)
    for r, (code, err) in enumerate(results):
        assert code == 0, f"rank {r} of {size} failed:\n{err[-3000:]}"
        got = np.load(tmp_path / f"rank{r}.npy")
        np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4, err_msg=f"{family} {flags}, rank {r}")


def _transformers_with_ep():
    try:
        import accelerate  # noqa: F401  (transformers' distributed loading needs it)
        import torch.distributed as dist
        import transformers  # noqa: F401
        from transformers.distributed import DistributedConfig  # noqa: F401
    except ImportError:
        return False
    return dist.is_available() and dist.is_gloo_available()


@pytest.mark.skipif(not _transformers_with_ep(), reason="needs torch (gloo), transformers 5 and accelerate")
@pytest.mark.parametrize("model_type,size,implementation", [
    ("qwen3_moe", 2, "all_reduce"), ("qwen3_moe", 4, "all_reduce"), ("qwen2_moe", 2, "all_reduce"),
    ("gpt_oss", 2, "all_reduce"), ("mixtral", 2, "all_to_all"),
])
def test_transformers_expert_parallel_models_use_the_layer(model_type, size, implementation, tmp_path):
    """transformers' own expert parallelism (DistributedConfig(ep_size=N)): each rank's
    experts module holds E / N experts and gets every slot of another rank's expert as the
    id E / N with weight 0 (all_reduce), or only its own tokens (all_to_all); the layer
    built for it holds the rank's experts and skips that id. Logits equal eager's in one
    process."""
    import torch
    import transformers

    from transformers_ep_rank import TOKENS

    config = transformers.AutoConfig.for_model(
        model_type, hidden_size=64, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=4, head_dim=16, vocab_size=97, num_experts=8, num_local_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, max_position_embeddings=64,
        **({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4} if model_type == "gpt_oss"
           else {}))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
    checkpoint = tmp_path / "model"
    model.save_pretrained(checkpoint)
    with torch.no_grad():
        expected = model(torch.tensor(TOKENS)).logits.numpy()
    results = launch_script("torch", size, [str(HERE / "transformers_ep_rank.py"), str(checkpoint), str(tmp_path),
                                            implementation], tmp_path)
    for r, (code, err) in enumerate(results):
        assert code == 0, f"rank {r} of {size} failed:\n{err[-3000:]}"
        assert f"local_experts=range(0, {8 // size})" in (tmp_path / f"layer{r}.txt").read_text()
        np.testing.assert_allclose(np.load(tmp_path / f"rank{r}.npy"), expected, rtol=1e-4, atol=1e-4,
                                   err_msg=f"{model_type}, {size} ranks, rank {r}")
