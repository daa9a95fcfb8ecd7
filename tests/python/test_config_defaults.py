"""Every optional key of config.json that the loader reads, left out: the layer must be the
one that transformers' default for that family gives (a config in the wild often omits
keys). DEFAULTS is checked against transformers' configuration classes where transformers
is installed, MODELING_DEFAULTS (keys those classes lack) against its modeling code's
behaviour, written down; each case compares a folder without the key to the same folder with the key
set to that default: same MoE layers, same outputs, or the same error. The keys the loader
requires are errors that name them."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import moe_swift

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_checkpoints as fixtures  # noqa: E402

# transformers 5's defaults for the keys the loader treats as optional.
DEFAULTS = {
    "mixtral": {"hidden_act": "silu"},
    "qwen2_moe": {"hidden_act": "silu", "norm_topk_prob": False, "shared_expert_intermediate_size": 5632,
                  "decoder_sparse_step": 1, "mlp_only_layers": []},
    "qwen3_moe": {"hidden_act": "silu", "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": []},
    "olmoe": {"hidden_act": "silu", "norm_topk_prob": False},
    "deepseek_v2": {"hidden_act": "silu", "norm_topk_prob": False, "routed_scaling_factor": 1.0, "n_group": None,
                    "topk_group": None, "topk_method": "greedy", "n_shared_experts": 2, "first_k_dense_replace": 0},
    "deepseek_v3": {"hidden_act": "silu", "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 8,
                    "topk_group": 4, "n_shared_experts": 1, "first_k_dense_replace": 3},
    "glm4_moe": {"hidden_act": "silu", "norm_topk_prob": True, "routed_scaling_factor": 1.0, "n_group": 1,
                 "topk_group": 1, "n_shared_experts": 1, "first_k_dense_replace": 1},
    "gpt_oss": {"hidden_act": "silu", "swiglu_limit": 7.0},
    "granitemoe": {"hidden_act": "silu"},
}
# Keys the loader reads that transformers' configuration classes lack (the original
# DeepSeek configs write them): absent, they mean what transformers' modeling code does
# without them. DeepseekV2's router scores by softmax; DeepseekV3's and Glm4Moe's by sigmoid
# with noaux_tc's group selection; every layer from first_k_dense_replace on is MoE
# (moe_layer_freq 1).
MODELING_DEFAULTS = {
    "deepseek_v2": {"scoring_func": "softmax", "moe_layer_freq": 1},
    "deepseek_v3": {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1},
    "glm4_moe": {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1},
}
# Keys the loader requires: sizes and top_k (deepseek_v2's num_experts_per_tok has no
# default in transformers either). A config without one is an error naming it, never a
# layer routed by a guess.
REQUIRED = ["hidden_size", "num_experts_per_tok"]
# One fixture of each model_type (tests/fixtures/make_checkpoints.py).
CASES = {"mixtral": "mixtral", "qwen2_moe": "qwen2_moe", "qwen3_moe": "qwen3_moe", "olmoe": "olmoe",
         "deepseek_v2": "deepseek_v2", "deepseek_v3": "deepseek_v3", "glm4_moe": "glm4_moe", "gpt_oss": "gpt_oss",
         "granitemoe": "granitemoe"}


def test_defaults_are_transformers_defaults():
    transformers = pytest.importorskip("transformers")
    for model_type, defaults in DEFAULTS.items():
        config = transformers.AutoConfig.for_model(model_type)
        for key, value in defaults.items():
            assert getattr(config, key) == value, f"{model_type}.{key}"
        # Should a configuration class gain one of these keys, its default must agree.
        for key, value in MODELING_DEFAULTS.get(model_type, {}).items():
            assert getattr(config, key, value) == value, f"{model_type}.{key}"


def outcome(folder):
    """What the loader makes of a folder: {layer: outputs} or the error's message."""
    try:
        layers = moe_swift.from_pretrained(folder, backend="cpu")
    except ValueError as error:
        return str(error).replace(str(folder), "<folder>")
    x = np.random.default_rng(0).standard_normal((5, fixtures.H)).astype(np.float32)
    result = {}
    for index, layer in layers.items():
        result[index] = layer(x)
        layer.close()
    return result


ALL_DEFAULTS = {m: {**DEFAULTS[m], **MODELING_DEFAULTS.get(m, {})} for m in DEFAULTS}


@pytest.mark.parametrize("model_type,key", [(m, k) for m, keys in ALL_DEFAULTS.items() for k in keys])
def test_an_omitted_key_is_the_family_default(tmp_path, model_type, key):
    source = fixtures.make(CASES[model_type], tmp_path / "source")
    config = json.loads((source / "config.json").read_text())
    folders = {}
    default = ALL_DEFAULTS[model_type][key]
    for name, change in (("omitted", lambda c: c.pop(key, None)), ("default", lambda c: c.update({key: default}))):
        folder = tmp_path / name
        shutil.copytree(source, folder)
        edited = dict(config)
        change(edited)
        (folder / "config.json").write_text(json.dumps(edited))
        folders[name] = outcome(folder)
    omitted, default = folders["omitted"], folders["default"]
    assert type(omitted) is type(default), (omitted, default)
    if isinstance(omitted, str):
        assert omitted == default
    else:
        assert omitted.keys() == default.keys()
        for index in omitted:
            np.testing.assert_array_equal(omitted[index], default[index], err_msg=f"layer {index}")


@pytest.mark.parametrize("model_type,key", [(m, k) for m in CASES for k in REQUIRED])
def test_a_required_key_omitted_is_an_error_naming_it(tmp_path, model_type, key):
    folder = fixtures.make(CASES[model_type], tmp_path / "source")
    config = json.loads((folder / "config.json").read_text())
    assert key in config, key
    del config[key]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f'has no "{key}"'):
        moe_swift.from_pretrained(folder, backend="cpu")
