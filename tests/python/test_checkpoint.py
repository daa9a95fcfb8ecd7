"""moe_swift.from_pretrained against the NumPy reference run on the same tensors, read here
independently from the safetensors files (tests/fixtures/make_checkpoints.py writes them
into a temporary folder: every model_type, each tensor layout, one sharded checkpoint)."""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import moe_swift
from moe_swift import Quantized, reference
from moe_swift.options import HIDDEN_ACT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_checkpoints as fixtures  # noqa: E402

_NUMPY = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "U32": np.uint32, "U8": np.uint8}


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: fixtures.make(name, root / name) for name in fixtures.CASES}


def read_tensors(folder):
    """Every tensor of the folder's safetensors files, as NumPy arrays in their dtype."""
    tensors = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        raw = path.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        for name, entry in json.loads(raw[8 : 8 + n]).items():
            begin, end = entry["data_offsets"]
            data = raw[8 + n + begin : 8 + n + end]
            tensors[name] = np.frombuffer(data, dtype=_NUMPY[entry["dtype"]]).reshape(entry["shape"])
    return tensors


def reference_layer(folder, layer, **overrides):
    """(weights, options) of moe_swift.reference.moe_forward for one layer, from the files
    and config.json, following transformers' and mlx-lm's modeling code."""
    config = json.loads((Path(folder) / "config.json").read_text())
    t = read_tensors(folder)
    mt = config["model_type"]
    E = config.get("num_local_experts") or config.get("n_routed_experts") or config["num_experts"]
    I = config["intermediate_size"] if mt in ("mixtral", "gpt_oss", "olmoe", "granitemoe") \
        else config["moe_intermediate_size"]
    P = f"model.layers.{layer}.block_sparse_moe"
    if f"{P}.gate.weight" not in t and mt != "granitemoe":
        P = f"model.layers.{layer}.mlp"
    quant = config.get("quantization", {})

    def linear(module):
        if f"{module}.scales" not in t:
            return t[f"{module}.weight"]
        q = {**quant, **quant.get(module, {})}
        return Quantized(t[f"{module}.weight"], t[f"{module}.scales"], t[f"{module}.biases"],
                         bits=q["bits"], group_size=q["group_size"])

    opts = dict(top_k=config["num_experts_per_tok"])
    router = linear({"gpt_oss": f"{P}.router", "granitemoe": f"{P}.router.layer"}.get(mt, f"{P}.gate"))
    if mt == "granitemoe":  # softmax over the k best logits: renormalised
        opts["norm_topk_prob"] = True
    if f"{P}.switch_mlp.gate_proj.weight" in t:
        gate, up, down = (linear(f"{P}.switch_mlp.{n}") for n in ("gate_proj", "up_proj", "down_proj"))
    elif f"{P}.experts.gate_proj.weight" in t:  # mlx-lm's gpt-oss
        gate, up, down = (linear(f"{P}.experts.{n}") for n in ("gate_proj", "up_proj", "down_proj"))
        opts.update(gate_bias=t[f"{P}.experts.gate_proj.bias"], up_bias=t[f"{P}.experts.up_proj.bias"],
                    down_bias=t[f"{P}.experts.down_proj.bias"], router_bias=t[f"{P}.router.bias"],
                    activation="swiglu_oai", swiglu_limit=config.get("swiglu_limit", 7.0))
    elif mt == "gpt_oss":
        if f"{P}.experts.gate_up_proj_blocks" in t:
            def mxfp4(name, rows=slice(None)):
                blocks, scales = t[f"{P}.experts.{name}_blocks"], t[f"{P}.experts.{name}_scales"]
                words = np.ascontiguousarray(blocks).view(np.uint32).reshape(blocks.shape[:2] + (-1,))
                return Quantized(words[:, rows], scales[:, rows], mode="mxfp4")
            gate, up = mxfp4("gate_up_proj", slice(0, None, 2)), mxfp4("gate_up_proj", slice(1, None, 2))
            down = mxfp4("down_proj")
        else:
            gu = t[f"{P}.experts.gate_up_proj"]  # (E, H, 2I): even columns gate, odd up
            gate, up = gu[..., ::2].transpose(0, 2, 1), gu[..., 1::2].transpose(0, 2, 1)
            down = t[f"{P}.experts.down_proj"].transpose(0, 2, 1)
        bias = t[f"{P}.experts.gate_up_proj_bias"]
        opts.update(gate_bias=bias[:, ::2], up_bias=bias[:, 1::2], down_bias=t[f"{P}.experts.down_proj_bias"],
                    router_bias=t[f"{P}.router.bias"], activation="swiglu_oai",
                    swiglu_limit=config.get("swiglu_limit", 7.0))
    elif f"{P}.experts.gate_up_proj" in t or f"{P}.input_linear.weight" in t:
        fused = "experts.gate_up_proj" if f"{P}.experts.gate_up_proj" in t else "input_linear.weight"
        gu = t[f"{P}.{fused}"]
        down_name = "experts.down_proj" if fused == "experts.gate_up_proj" else "output_linear.weight"
        gate, up, down = gu[:, :I], gu[:, I:], t[f"{P}.{down_name}"]
    else:
        names = ("w1", "w3", "w2") if mt == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        gate, up, down = (np.stack([t[f"{P}.experts.{e}.{n}.weight"] for e in range(E)]) for n in names)

    if mt in ("qwen2_moe", "qwen3_moe", "olmoe"):
        opts["norm_topk_prob"] = config.get("norm_topk_prob", False)
    if mt != "gpt_oss":
        opts["activation"] = HIDDEN_ACT[config.get("hidden_act", "silu")]
    if mt in ("deepseek_v2", "deepseek_v3", "glm4_moe"):
        v2 = mt == "deepseek_v2"
        opts.update(scoring=config.get("scoring_func", "softmax" if v2 else "sigmoid"),
                    norm_topk_prob=config.get("norm_topk_prob", not v2),
                    routed_scaling_factor=config.get("routed_scaling_factor", 1.0))
        if not v2:
            opts.update(selection_bias=t[f"{P}.gate.e_score_correction_bias"])
            # "greedy" picks the k best of all experts: no groups (DeepSeek-V2's method).
            if config.get("topk_method", "noaux_tc") != "greedy":
                opts.update(n_group=config.get("n_group", 1), topk_group=config.get("topk_group", 1))
        if config.get("n_shared_experts"):
            opts["shared_expert"] = {n: linear(f"{P}.shared_experts.{n}") for n in ("gate_proj", "up_proj", "down_proj")}
    if mt == "qwen2_moe":
        opts["shared_expert"] = {n: linear(f"{P}.shared_expert.{n}") for n in ("gate_proj", "up_proj", "down_proj")}
        g = linear(f"{P}.shared_expert_gate")
        opts["shared_expert"]["sigmoid_gate"] = (moe_swift.formats.dequantize(g) if isinstance(g, Quantized)
                                                 else np.asarray(g, np.float32))[0]
    opts.update(overrides)
    return (router, gate, up, down), opts


def check_close(layer, folder, index, T, **overrides):
    (router, gate, up, down), opts = reference_layer(folder, index, **overrides)
    x = np.random.default_rng(T + 10 * index).standard_normal((T, fixtures.H)).astype(np.float32)
    want = reference.moe_forward(x, router, gate, up, down, **opts)
    got = layer(x)
    assert got.shape == x.shape
    tol = 1e-4 * np.abs(want).max() + 1e-5
    assert np.abs(got - want).max() <= tol, f"max error {np.abs(got - want).max()} > {tol}"


@pytest.mark.parametrize("T", [1, 7])
@pytest.mark.parametrize("case", list(fixtures.CASES))
def test_every_family_and_layout_matches_reference(checkpoints, case, T):
    layers = moe_swift.from_pretrained(checkpoints[case], backend="cpu")
    assert layers, case
    for index, layer in layers.items():
        assert layer.backend == "cpu"
        check_close(layer, checkpoints[case], index, T)


@pytest.mark.parametrize("case", ["qwen2_moe", "gpt_oss_mxfp4"])
def test_softmetal(checkpoints, case):
    if "softmetal" not in moe_swift.available_backends():
        pytest.skip("softmetal is not available here")
    layer = moe_swift.from_pretrained(checkpoints[case], 2, backend="softmetal")
    assert layer.backend == "softmetal"
    for T in (1, 7):
        check_close(layer, checkpoints[case], 2, T)


def test_layer_none_gives_every_moe_layer(checkpoints):
    assert list(moe_swift.from_pretrained(checkpoints["qwen3_moe"], backend="cpu")) == [1]   # decoder_sparse_step 2
    assert list(moe_swift.from_pretrained(checkpoints["qwen2_moe"], backend="cpu")) == [1, 2]  # mlp_only_layers [0]
    layers = moe_swift.from_pretrained(checkpoints["deepseek_v3"], backend="cpu")
    assert list(layers) == [1, 2] and all(isinstance(v, moe_swift.MoELayer) for v in layers.values())
    one = layers[1]
    assert (one.hidden_size, one.intermediate_size, one.num_experts, one.top_k, one.shared_intermediate_size) == (
        64, 32, 8, 2, 32)


def test_single_layer_and_sizes(checkpoints):
    layer = moe_swift.from_pretrained(checkpoints["mixtral"], layer=1, backend="cpu")
    assert isinstance(layer, moe_swift.MoELayer)
    assert (layer.num_experts, layer.top_k, layer.intermediate_size) == (8, 2, 32)
    layer.close()
    with pytest.raises(ValueError, match="closed"):
        layer(np.zeros((1, 64), np.float32))


@pytest.mark.parametrize("case, index, why", [
    ("deepseek_v3", 0, "first_k_dense_replace"),
    ("qwen2_moe", 0, "mlp_only_layers"),
    ("qwen3_moe", 0, "decoder_sparse_step"),
])
def test_dense_layer_is_a_clear_error(checkpoints, case, index, why):
    with pytest.raises(ValueError, match=f"layer {index} .*dense.*{why}"):
        moe_swift.from_pretrained(checkpoints[case], index, backend="cpu")


def test_layer_out_of_range(checkpoints):
    with pytest.raises(ValueError, match="out of range"):
        moe_swift.from_pretrained(checkpoints["olmoe"], 3, backend="cpu")


def _copy(checkpoints, case, tmp_path):
    folder = tmp_path / case
    shutil.copytree(checkpoints[case], folder)
    return folder


def _edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_unknown_model_type_lists_supported(checkpoints, tmp_path):
    folder = _copy(checkpoints, "olmoe", tmp_path)
    _edit_config(folder, model_type="llama4_text")
    with pytest.raises(ValueError, match="llama4_text.*supported.*mixtral.*qwen3_moe"):
        moe_swift.from_pretrained(folder)


def test_missing_tensor_is_named_with_the_files(checkpoints, tmp_path):
    folder = _copy(checkpoints, "olmoe", tmp_path)
    tensors = read_tensors(folder)
    missing = "model.layers.1.mlp.experts.3.down_proj.weight"
    del tensors[missing]
    fixtures.write_safetensors(folder / "model.safetensors", tensors)
    moe_swift.from_pretrained(folder, 0, backend="cpu")  # other layers still load
    with pytest.raises(ValueError, match=rf"'{missing}'.*model\.safetensors"):
        moe_swift.from_pretrained(folder, 1, backend="cpu")


def test_missing_router_in_sharded_checkpoint(checkpoints, tmp_path):
    folder = _copy(checkpoints, "mixtral", tmp_path)
    name = "model.layers.2.block_sparse_moe.gate.weight"
    for shard in folder.glob("*.safetensors"):
        tensors = read_tensors_file(shard)
        if name in tensors:
            del tensors[name]
            fixtures.write_safetensors(shard, tensors)
    with pytest.raises(ValueError, match=rf"{name}.*model-00001-of-00002.safetensors, model-00002-of-00002"):
        moe_swift.from_pretrained(folder, 2, backend="cpu")


def read_tensors_file(path):
    folder = path.parent / "single"
    folder.mkdir(exist_ok=True)
    shutil.copy(path, folder / path.name)
    return read_tensors(folder)


def test_group_limited_greedy_is_refused(checkpoints, tmp_path):
    folder = _copy(checkpoints, "deepseek_v2", tmp_path)
    _edit_config(folder, topk_method="group_limited_greedy")
    with pytest.raises(ValueError, match="group_limited_greedy"):
        moe_swift.from_pretrained(folder, 1)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        moe_swift.from_pretrained(tmp_path)


def test_overrides(checkpoints):
    folder = checkpoints["qwen3_moe"]
    layer = moe_swift.from_pretrained(folder, 1, backend="cpu", top_k=3, norm_topk_prob=False)
    assert layer.top_k == 3
    check_close(layer, folder, 1, 7, top_k=3, norm_topk_prob=False)
    folder = checkpoints["deepseek_v3"]
    layer = moe_swift.from_pretrained(folder, 2, backend="cpu", routed_scaling_factor=1.0, n_group=1, topk_group=1,
                                      scoring="softmax")
    check_close(layer, folder, 2, 7, routed_scaling_factor=1.0, n_group=1, topk_group=1, scoring="softmax")
    with pytest.raises(TypeError, match="unknown options.*bogus"):
        moe_swift.from_pretrained(folder, 2, bogus=1)
    with pytest.raises(ValueError, match="top_k"):
        moe_swift.from_pretrained(folder, 2, top_k=100)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
def test_files_are_unmapped_after_loading_copies(checkpoints):
    folder = str(checkpoints["gpt_oss_mxfp4"])
    layers = moe_swift.from_pretrained(folder, backend="cpu", copy_weights=True)
    assert folder not in Path("/proc/self/maps").read_text()  # the layers hold the only copy
    check_close(layers[0], folder, 0, 1)
