"""Every optional metadata key the GGUF reader reads, left out of a fixture file
(tests/fixtures/make_gguf.py): the layer must be the one llama.cpp runs for that
architecture without the key, against the float64 reference on the file's own tensors,
and the same, bit for bit, as a file that writes llama.cpp's default out. A key llama.cpp
requires is a clear error instead. Files in the wild often omit keys (older converters,
DeepSeek-V2's files have no gating key), and a wrong default routes silently.

Where the defaults come from (llama.cpp, src/models/<arch>.cpp `load_arch_hparams` and
`load_arch_tensors`, src/llama-graph.cpp `build_moe_ffn`, src/llama-hparams.h):
- deepseek2: expert_feed_forward_length and expert_shared_count are read with get_key
  (required); leading_dense_block_count (0), expert_weights_scale (0), expert_weights_norm
  (false), expert_gating_func (NONE) and nextn_predict_layers (0) are optional. NONE
  becomes softmax ("for compatibility with existing DeepSeek V2 and V2.5 GGUFs"), except
  sigmoid where n_layer() (block_count - nextn_predict_layers) is 47 or 48 and the
  vocabulary (deepseek2.vocab_size, else the length of tokenizer.ggml.tokens) is 154880:
  GLM-4.7 Lite.
- glm4moe: the same keys optional with the same defaults, but NONE becomes sigmoid.
- build_moe_ffn scales the weights only where w_scale is neither 0 nor 1, so an absent
  (0) expert_weights_scale is no scaling.
- expert_group_count / expert_group_used_count (llama_model::load_hparams, optional, 0):
  no groups; with more than one group, expert_group_used_count must be > 0 (an assert).
- qwen2moe / qwen3moe: expert_feed_forward_length optional, n_ff_exp = n_ff /
  n_expert_used without it; qwen2moe's expert_shared_feed_forward_length optional,
  n_ff_shexp = n_ff without it.
- expert_count / expert_used_count: optional in load_hparams but every MoE architecture
  asserts them non-zero; gpt-oss reads expert_feed_forward_length with get_key.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import moe_swift
from moe_swift import reference

pytest.importorskip("gguf")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_gguf as fixtures  # noqa: E402
from test_gguf import check_close, read_tensors, reference_layer  # noqa: E402

I, K = fixtures.I, fixtures.K
GLM_LITE_VOCAB = 154880

# (fixture, metadata changes (None: left out), llama.cpp's meaning as changes to the
# fixture's options, the same file with the default written out).
OMITTED = {
    "qwen3moe: no expert_feed_forward_length, I = feed_forward_length / expert_used_count":
        ("qwen3moe", {"expert_feed_forward_length": None, "feed_forward_length": I * K}, {},
         {"feed_forward_length": I * K}),
    "qwen2moe: no expert_shared_feed_forward_length, the shared expert is feed_forward_length wide":
        ("qwen2moe", {"expert_shared_feed_forward_length": None}, {},
         {"expert_shared_feed_forward_length": I * K}),
    "deepseek2: no expert_gating_func is softmax (DeepSeek-V2)":
        ("deepseek2", {"expert_gating_func": None}, {"scoring": "softmax"}, {"expert_gating_func": 1}),
    "deepseek2: no expert_gating_func, 47 layers, vocab_size 154880 is sigmoid (GLM-4.7 Lite)":
        ("deepseek2", {"expert_gating_func": None, "block_count": 47, "vocab_size": GLM_LITE_VOCAB}, {},
         {"expert_gating_func": 2, "block_count": 47, "vocab_size": GLM_LITE_VOCAB}),
    "deepseek2: GLM-4.7 Lite's 48 layers after its next-token layer, vocabulary from the tokens":
        ("deepseek2", {"expert_gating_func": None, "block_count": 49, "nextn_predict_layers": 1,
                       "tokenizer.ggml.tokens": [f"t{i}" for i in range(GLM_LITE_VOCAB)]}, {},
         {"expert_gating_func": 2, "block_count": 49, "nextn_predict_layers": 1}),
    "deepseek2: 47 layers with another vocabulary is softmax":
        ("deepseek2", {"expert_gating_func": None, "block_count": 47, "vocab_size": GLM_LITE_VOCAB + 1},
         {"scoring": "softmax"}, {"expert_gating_func": 1, "block_count": 47}),
    "deepseek2: 47 blocks, the last the next-token layer (46 layers), is softmax":
        ("deepseek2", {"expert_gating_func": None, "block_count": 47, "nextn_predict_layers": 1,
                       "vocab_size": GLM_LITE_VOCAB}, {"scoring": "softmax"},
         {"expert_gating_func": 1, "block_count": 47, "nextn_predict_layers": 1}),
    "deepseek2: no expert_weights_norm does not renormalise":
        ("deepseek2", {"expert_weights_norm": None}, {"norm_topk_prob": False}, {"expert_weights_norm": False}),
    "deepseek2: no expert_weights_scale does not scale":
        ("deepseek2", {"expert_weights_scale": None}, {"routed_scaling_factor": 1.0}, {"expert_weights_scale": 1.0}),
    "deepseek2: expert_weights_scale 0 does not scale":
        ("deepseek2", {"expert_weights_scale": 0.0}, {"routed_scaling_factor": 1.0}, {"expert_weights_scale": 1.0}),
    "deepseek2: no expert groups":
        ("deepseek2", {"expert_group_count": None, "expert_group_used_count": None},
         {"n_group": 1, "topk_group": 1}, {"expert_group_count": 0, "expert_group_used_count": 0}),
    "deepseek2: no leading_dense_block_count, the layers with a router":
        ("deepseek2", {"leading_dense_block_count": None}, {}, {"leading_dense_block_count": 0}),
    "glm4moe reads expert_gating_func: a written 1 is softmax":
        ("glm4moe", {"expert_gating_func": 1}, {"scoring": "softmax"}, None),
    "glm4moe: no expert_weights_norm does not renormalise":
        ("glm4moe", {"expert_weights_norm": None}, {"norm_topk_prob": False}, {"expert_weights_norm": False}),
    "glm4moe: no expert_weights_scale does not scale":
        ("glm4moe", {"expert_weights_scale": None}, {"routed_scaling_factor": 1.0}, {"expert_weights_scale": 0.0}),
    "glm4moe: no nextn_predict_layers, every block is a layer":
        ("glm4moe", {"nextn_predict_layers": None}, {}, {"nextn_predict_layers": 0}),
    "glm4moe: no leading_dense_block_count":
        ("glm4moe", {"leading_dense_block_count": None}, {}, {"leading_dense_block_count": 0}),
}

# Keys llama.cpp requires (or asserts on): a ValueError naming the key.
REQUIRED = {
    "deepseek2 expert_shared_count": ("deepseek2", {"expert_shared_count": None}, "has no deepseek2.expert_shared_count"),
    "deepseek2 expert_feed_forward_length": ("deepseek2", {"expert_feed_forward_length": None},
                                             "has no deepseek2.expert_feed_forward_length"),
    "deepseek2 expert_group_used_count": ("deepseek2", {"expert_group_used_count": None},
                                          "has no deepseek2.expert_group_used_count"),
    "glm4moe expert_shared_count": ("glm4moe", {"expert_shared_count": None}, "has no glm4moe.expert_shared_count"),
    "gpt-oss expert_feed_forward_length": ("gpt-oss", {"expert_feed_forward_length": None},
                                           "has no gpt-oss.expert_feed_forward_length"),
    "qwen3moe expert_used_count": ("qwen3moe", {"expert_used_count": None}, "has no qwen3moe.expert_used_count"),
    "olmoe expert_count": ("olmoe", {"expert_count": None}, "has no olmoe.expert_count"),
    "llama expert_count": ("mixtral", {"expert_count": None}, r"llama model without experts"),
}


def _layers(case, meta):
    """The MoE layers llama.cpp runs in `case`'s file with `meta`: routers at or above the
    dense lead, below block_count - nextn_predict_layers."""
    layers = {"deepseek2": [1, 2], "glm4moe": [1, 2], "qwen3moe": [1, 2]}.get(case, [0, 1])
    if case == "glm4moe" and "nextn_predict_layers" in meta and not meta["nextn_predict_layers"]:
        layers = [1, 2, 3]
    return layers


def _outputs(layers):
    x = np.random.default_rng(3).standard_normal((5, fixtures.H)).astype(np.float32)
    return {i: layer(x) for i, layer in layers.items()}


@pytest.mark.parametrize("name", list(OMITTED))
def test_an_omitted_key_is_llama_cpps_default(tmp_path, name):
    case, meta, meaning, written = OMITTED[name]
    path, written_opts = fixtures.make(case, tmp_path / "omitted", meta=meta)
    base = next(iter(written_opts.values()))
    opts = {**base, **meaning}
    loaded = moe_swift.from_pretrained(path, backend="cpu")
    assert sorted(loaded) == _layers(case, meta), name
    if written is not None:
        default_path, _ = fixtures.make(case, tmp_path / "written", meta=written)
        explicit = _outputs(moe_swift.from_pretrained(default_path, backend="cpu"))
        omitted = _outputs(loaded)
        assert omitted.keys() == explicit.keys()
        for index in omitted:
            np.testing.assert_array_equal(omitted[index], explicit[index], err_msg=f"{name}: layer {index}")
    # Metadata draws nothing from the fixture's random numbers: both files hold the same
    # tensors, and the gguf package reads a file without a tokenizer far faster.
    tensors = read_tensors(path if written is None else default_path)
    for index, layer in loaded.items():
        check_close(layer, tensors, index, opts, 4)
    if meaning:
        # The omission must matter: the fixture's own value gives another layer.
        (router, gate, up, down), kw = reference_layer(tensors, min(loaded), base)
        _, kw_default = reference_layer(tensors, min(loaded), opts)
        x = np.random.default_rng(4).standard_normal((4, fixtures.H)).astype(np.float32)
        mine = reference.moe_forward(x, router, gate, up, down, **kw)
        theirs = reference.moe_forward(x, router, gate, up, down, **kw_default)
        assert np.abs(mine - theirs).max() > 1e-3 * np.abs(theirs).max(), name


@pytest.mark.parametrize("name", list(REQUIRED))
def test_a_key_llama_cpp_requires_is_a_clear_error(tmp_path, name):
    case, meta, message = REQUIRED[name]
    path, _ = fixtures.make(case, tmp_path, meta=meta)
    with pytest.raises(ValueError, match=message):
        moe_swift.from_pretrained(path, backend="cpu")
