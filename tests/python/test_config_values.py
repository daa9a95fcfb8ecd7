"""Every key of config.json that the loader reads with a default (the tables of
test_config_defaults, per model_type), in turn set to a value other than that default: the
layers must then be the ones the float64 reference computes from the edited config
(test_checkpoint.reference_layer, which reads config.json as the families' modeling code
does), and must differ from the layers of the default value — so a key the loader ignored,
read under another name or applied twice fails here, where fixtures holding defaults pass.

The cases are generated: one per (model_type, key) of those tables, the value the fixture's
own when it is not the default, else NON_DEFAULT's for that key (written once per key, not
per family); a key added to the tables is covered without editing this file. A value the
files cannot hold (a shared expert wider than the one stored) must be an error naming the
shapes."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import moe_swift
from moe_swift import reference
from test_checkpoint import reference_layer
from test_config_defaults import ALL_DEFAULTS, CASES, fixtures

# A value other than the default, per key: a function of (default, fixture's value).
NON_DEFAULT = {
    "hidden_act": lambda d, f: "gelu_pytorch_tanh",
    "norm_topk_prob": lambda d, f: not d,
    "routed_scaling_factor": lambda d, f: 0.37,
    "swiglu_limit": lambda d, f: 2.7,
    "n_group": lambda d, f: 2,
    "topk_group": lambda d, f: 2 if d != 2 else 1,
    "topk_method": lambda d, f: "group_limited_greedy" if d == "greedy" else "greedy",
    "scoring_func": lambda d, f: "sigmoid" if d == "softmax" else "softmax",
    "n_shared_experts": lambda d, f: 2 if d != 2 else 1,
    "shared_expert_intermediate_size": lambda d, f: 48,
    "decoder_sparse_step": lambda d, f: 3,
    "mlp_only_layers": lambda d, f: [1],
    "first_k_dense_replace": lambda d, f: 2,
    "moe_layer_freq": lambda d, f: 2,
}
T = 6
# Keys whose value, by the family's own rule, changes nothing in the fixture's setting: there
# the test asserts that it changes nothing (the other side of the same rule).
INERT = {("deepseek_v2", "n_group"): "DeepSeek-V2's greedy top-k reads no groups (group_limited_greedy is refused)",
         ("deepseek_v2", "topk_group"): "DeepSeek-V2's greedy top-k reads no groups",
         ("gpt_oss", "hidden_act"): "gpt-oss's experts are its clamped SwiGLU whatever hidden_act says"}
# What must be set beside a key for its value to matter, in the default's folder and the
# value's alike: groups for a group choice or a top-k method to choose among.
COMPANIONS = {"n_group": dict(topk_group=1), "topk_group": dict(n_group=4),
              "topk_method": dict(n_group=4, topk_group=2)}


def moe_layer_indices(config):
    """The MoE layers of a config, by the families' rules (transformers' modeling code)."""
    first = config.get("first_k_dense_replace", ALL_DEFAULTS[config["model_type"]].get("first_k_dense_replace", 0))
    freq, step = config.get("moe_layer_freq", 1), config.get("decoder_sparse_step", 1)
    only = config.get("mlp_only_layers", [])
    return [i for i in range(config["num_hidden_layers"])
            if i >= first and i % freq == 0 and i not in only and (i + 1) % step == 0]


def outcome(folder):
    try:
        layers = moe_swift.from_pretrained(folder, backend="cpu")
    except ValueError as error:
        return str(error).replace(str(folder), "<folder>")
    x = np.random.default_rng(1).standard_normal((T, fixtures.H)).astype(np.float32)
    out = {i: (layer(x), layer) for i, layer in layers.items()}
    return x, out


def edited(source, folder, **changes):
    shutil.copytree(source, folder)
    config = json.loads((source / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder, config


CASES_BY_KEY = [(m, k) for m, keys in ALL_DEFAULTS.items() for k in keys if k in NON_DEFAULT]


def test_every_key_has_a_non_default_value():
    """A key in the defaults' tables without a value here would go untested."""
    missing = sorted({k for keys in ALL_DEFAULTS.values() for k in keys} - set(NON_DEFAULT))
    assert not missing, f"add NON_DEFAULT values for {missing}"


@pytest.mark.parametrize("model_type,key", CASES_BY_KEY)
def test_a_non_default_value_is_applied(tmp_path, model_type, key):
    source = fixtures.make(CASES[model_type], tmp_path / "source")
    config = json.loads((source / "config.json").read_text())
    default = ALL_DEFAULTS[model_type][key]
    value = config[key] if key in config and config[key] != default else NON_DEFAULT[key](default, config.get(key))
    assert value != default
    companions = COMPANIONS.get(key, {}) if model_type != "deepseek_v2" else {}
    with_default, _ = edited(source, tmp_path / "default", **companions, **{key: default})
    folder, config = edited(source, tmp_path / "value", **companions, **{key: value})
    before, after = outcome(with_default), outcome(folder)
    if isinstance(after, str):
        # A value the files cannot hold, or a method the loader refuses: said, not guessed.
        assert "shape" in after or "implements only" in after, after
        assert before != after
        return
    x, layers = after
    assert sorted(layers) == moe_layer_indices(config), (sorted(layers), config)
    changed = isinstance(before, str) or sorted(before[1]) != sorted(layers)
    for index, (got, layer) in layers.items():
        (router, gate, up, down), opts = reference_layer(folder, index)
        want = reference.moe_forward(x, router, gate, up, down, **opts)
        tolerance = 1e-4 * np.abs(want).max() + 1e-5
        assert np.abs(got - want).max() <= tolerance, (index, np.abs(got - want).max(), opts)
        if not changed and index in before[1]:
            changed = np.abs(before[1][index][0] - got).max() > 100 * tolerance
        layer.close()
    if not isinstance(before, str):
        for _, layer in before[1].values():
            layer.close()
    if (model_type, key) in INERT:
        assert not changed, f"{model_type}: {key} = {value!r} changed the layers: {INERT[model_type, key]}"
    else:
        assert changed, f"{model_type}: {key} = {value!r} gives the layers of its default {default!r}"
