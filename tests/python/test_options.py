"""Every row of moe_options.h's tables has an implementation: each backend either runs or
says it is unavailable here, each scoring, activation, dtype and weight format (every
affine width and group size) runs on every available backend and matches the reference,
each specialisation has its Metal kernels, each hidden_act alias loads a checkpoint.
A row added to the header without its code fails here."""

import re

import numpy as np
import pytest

import moe_swift
from moe_swift import options, reference
from moe_swift.formats import GGML_FORMATS, GGMLQuantized, quantize
from moe_swift.ggml_blocks import random_blocks
from families import selected_backends, spec_tolerance

BACKENDS = selected_backends()
H, I, E, K, T = 64, 32, 8, 2, 5


def _args(seed=0, **overrides):
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) * s[-1] ** -0.5).astype(np.float32)
    args = dict(router_weight=w(E, H) * 4, gate_proj=w(E, I, H), up_proj=w(E, I, H), down_proj=w(E, H, I),
                top_k=K)
    args.update(overrides)
    return args, np.random.default_rng(seed + 1).standard_normal((T, H)).astype(np.float32)


def _check(args, x, backend):
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        y = layer(x)
        ids, _ = layer.route(x)
    ref = reference.moe_forward(x, **args, ids=ids)
    assert np.abs(y - ref).max() <= spec_tolerance(ref)


def test_every_backend_runs_or_is_unavailable():
    args, x = _args()
    for name in options.BACKENDS:
        try:
            layer = moe_swift.MoELayer(**args, backend=name)
        except moe_swift.BackendUnavailableError:
            assert name not in moe_swift.available_backends()
            continue
        with layer:
            assert name == "auto" or layer.backend == name
            assert layer(x).shape == x.shape


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scoring", list(options.SCORINGS))
def test_every_scoring(backend, scoring):
    args, x = _args(scoring=scoring)
    _check(args, x, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", list(options.ACTIVATIONS))
def test_every_activation(backend, activation):
    args, x = _args(activation=activation)
    args["gate_proj"] = args["gate_proj"] * 6  # reaches swiglu_oai's clamp
    _check(args, x, backend)
    assert activation in reference.ACTIVATIONS


def _formats():
    yield "float32", lambda w: w
    yield "float16", lambda w: w.astype(np.float16)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from moe_swift.formats import float32_to_bf16
    yield "bfloat16", lambda w: float32_to_bf16(w).view(ml_dtypes.bfloat16)
    for bits in options.AFFINE_BITS:
        for group in options.AFFINE_GROUP_SIZES:
            for scale_dtype in options.DTYPES:
                yield (f"affine/{bits}/{group}/{scale_dtype}",
                       lambda w, b=bits, g=group, s=scale_dtype: quantize(w, bits=b, group_size=g, scale_dtype=s))
    yield "mxfp4", lambda w: quantize(w, mode="mxfp4")
    for name in GGML_FORMATS:
        # Random blocks of the weight's magnitude: the reference reads the same blocks.
        yield name, lambda w, n=name: GGMLQuantized(
            random_blocks(np.random.default_rng(w.size), n, w.shape, float(np.abs(w).max())), type=n)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", list(options.ACTIVATION_QUANTIZATIONS))
def test_every_activation_quantization(backend, mode):
    rng = np.random.default_rng(4)
    H2, I2 = 256, 128
    q = lambda *s: GGMLQuantized(random_blocks(rng, "q4_0", s, 2 * s[-1] ** -0.5), type="q4_0")
    args = dict(router_weight=rng.standard_normal((E, H2)).astype(np.float32), gate_proj=q(E, I2, H2),
                up_proj=q(E, I2, H2), down_proj=q(E, H2, I2), top_k=K)
    x = rng.standard_normal((T, H2)).astype(np.float32)
    with moe_swift.MoELayer(**args, backend=backend, activation_quantization=mode) as layer:
        y = layer(x)
        ids, _ = layer.route(x)
    ref = reference.moe_forward(x, **args, ids=ids, activation_quantization=mode)
    # q8: a's codes may round the other way where float32 and float64 a differ in the last bit.
    assert np.abs(y - ref).max() <= (spec_tolerance(ref) if mode == "none" else 2e-3 * np.abs(ref).max())
    # ...and the backend took the mode: nearer its own reference than the other mode's.
    other = reference.moe_forward(x, **args, ids=ids, activation_quantization="q8" if mode == "none" else "none")
    assert np.sqrt(np.mean((y - ref) ** 2)) < 0.3 * np.sqrt(np.mean((y - other) ** 2))


def test_the_formats_cover_every_row():
    names = {name.split("/")[0] for name, _ in _formats()}
    assert names == set(options.FORMATS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_format(backend):
    rng = np.random.default_rng(3)
    w = lambda *s: (rng.standard_normal(s) * s[-1] ** -0.5).astype(np.float32)
    shapes = {}
    for H2, I2 in ((128, 128), (256, 256)):  # a multiple of every group size; of ggml's blocks
        shapes[H2] = (dict(router_weight=w(E, H2) * 4, gate_proj=w(E, I2, H2), up_proj=w(E, I2, H2),
                           down_proj=w(E, H2, I2), top_k=K), rng.standard_normal((T, H2)).astype(np.float32))
    for name, convert in _formats():
        base, x = shapes[256 if name in GGML_FORMATS else 128]
        args = {k: (convert(v) if k.endswith("_proj") or k == "router_weight" else v) for k, v in base.items()}
        try:
            _check(args, x, backend)
        except AssertionError as e:
            raise AssertionError(f"{name} on {backend}") from e


def test_every_specialisation_has_its_metal_kernels():
    """Each row's loader exists and every weight-reading kernel is instantiated from the rows
    (test_every_format then runs each row's kernels on the softmetal backend); the encode
    API's activation conversions are instantiated from the dtype rows."""
    from metal_kernels import METAL_DIR
    source = "\n".join(path.read_text() for path in sorted(METAL_DIR.glob("*.h")) + sorted(METAL_DIR.glob("*.metal")))
    for suffix, _, _ in options.SPECIALISATIONS:
        assert re.search(rf"\bmoe_fmt_{suffix}\b", source), suffix
    instantiations = re.findall(r"^(\w+)\((MOE_INSTANTIATE_\w+)\)", source, re.M)
    assert set(instantiations) == {("MOE_SPECIALISATION_ROWS", "MOE_INSTANTIATE_ROUTER"),
                                   ("MOE_SPECIALISATION_ROWS", "MOE_INSTANTIATE_ROUTER_GEMV"),
                                   ("MOE_SPECIALISATION_ROWS", "MOE_INSTANTIATE_EXPERTS"),
                                   ("MOE_DTYPE_ROWS", "MOE_INSTANTIATE_CONVERT")}


def _mixtral_with(tmp_path, hidden_act):
    import json
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
    import make_checkpoints as fixtures
    folder = fixtures.make("mixtral", tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    config["hidden_act"] = hidden_act
    (folder / "config.json").write_text(json.dumps(config))
    return folder, fixtures.H


@pytest.mark.parametrize("hidden_act", sorted(options.HIDDEN_ACT))
def test_every_hidden_act_alias_loads_as_its_activation(tmp_path, hidden_act):
    folder, H = _mixtral_with(tmp_path, hidden_act)
    x = np.random.default_rng(0).standard_normal((3, H)).astype(np.float32)
    for name in options.ACTIVATIONS:
        # A clamp that binds (the default 7 is past every value here: clamped SiLU would be SiLU).
        clamp = {"swiglu_limit": 0.01} if "swiglu_limit" in reference.ACTIVATION_OPTIONS.get(name, ()) else {}
        loaded = moe_swift.from_pretrained(folder, backend="cpu", activation=name, **clamp)
        same = all(np.array_equal(loaded[i](x), layer(x))
                   for i, layer in moe_swift.from_pretrained(folder, backend="cpu").items())
        assert same == (name == options.HIDDEN_ACT[hidden_act]), name


def test_an_unknown_hidden_act_names_the_known_ones(tmp_path):
    folder, _ = _mixtral_with(tmp_path, "relu2")
    with pytest.raises(ValueError, match="hidden_act \"relu2\" is not supported") as info:
        moe_swift.from_pretrained(folder, backend="cpu")
    assert all(alias in str(info.value) for alias in options.HIDDEN_ACT)


def test_defaults_are_the_headers_in_every_signature():
    import inspect
    for fn in (moe_swift.MoELayer.__init__, reference.moe_forward):
        params = inspect.signature(fn).parameters
        for name, value in options.DEFAULTS.items():
            if name in params:
                assert params[name].default == value, (fn, name)


# Every combination of the routing options that scale or choose experts: a per-expert
# scale, the routed scaling factor, the scoring, group-limited choice and renormalisation
# (DeepSeek's, Gemma's and the rest's rules compose; one applied twice, or in the wrong
# order with another, shows only in some combination).
ROUTING = dict(per_expert_scale=(False, True), routed_scaling_factor=(1.0, 2.5), scoring=tuple(options.SCORINGS),
               groups=((1, 1), (4, 2)), norm_topk_prob=(False, True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_routing_options_in_every_combination(backend):
    import itertools

    combos = list(itertools.product(*ROUTING.values()))
    for per_expert, scaling, scoring, (n_group, topk_group), renormalise in combos:
        args, x = _args(seed=3, routed_scaling_factor=scaling, scoring=scoring, n_group=n_group,
                        topk_group=topk_group, norm_topk_prob=renormalise,
                        selection_bias=np.linspace(-0.3, 0.3, E, dtype=np.float32))
        if per_expert:
            args["per_expert_scale"] = np.linspace(0.5, 1.7, E, dtype=np.float32)
        _check(args, x, backend)
    assert len(combos) == 2 ** 4 * len(options.SCORINGS)
