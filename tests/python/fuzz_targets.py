"""Hypothesis fuzz targets over the public surface: the layer API, the C ABI's descriptor
and the SoftMetal launch API. Not collected by pytest directly (no test_ prefix):
test_fuzz.py runs this file in a child process, so a crash is a failing test with the
child's output, not a dead runner. MOE_FUZZ_EXAMPLES sets the examples per target
(default 150) for longer runs by hand:

    MOE_FUZZ_EXAMPLES=5000 python -m pytest -q -p no:cacheprovider tests/python/fuzz_targets.py
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import moe_swift
from moe_swift import _native, reference
from moe_swift.formats import quantize
from families import FAMILIES, family_options, selected_backends, spec_tolerance

EXAMPLES = int(os.environ.get("MOE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
EXPECTED = (ValueError, TypeError, MemoryError, moe_swift.BackendUnavailableError)
BACKENDS = selected_backends()
FORMATS = ["f32", "f16", "q8", "q4", "mxfp4"]


def as_format(w, fmt):
    if fmt == "f16":
        return w.astype(np.float16)
    if fmt == "q8":
        return quantize(w, bits=8, group_size=32)
    if fmt == "q4":
        return quantize(w, bits=4, group_size=32, scale_dtype="float16")
    if fmt == "mxfp4":
        return quantize(w, mode="mxfp4")
    return w


@st.composite
def layers(draw):
    E = draw(st.integers(1, 12))
    k = draw(st.integers(1, E))
    H = 32 * draw(st.integers(1, 3))
    I = 32 * draw(st.integers(1, 2))
    family = draw(st.sampled_from(FAMILIES))
    opts = family_options(family, E)
    if opts.get("n_group", 1) > 1:
        opts["n_group"], opts["topk_group"] = 1, 1
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    fmt = draw(st.sampled_from(FORMATS))
    args = dict(router_weight=rng.standard_normal((E, H)).astype(np.float32), top_k=k, **opts,
                gate_proj=as_format((rng.standard_normal((E, I, H)) * 0.2).astype(np.float32), fmt),
                up_proj=as_format((rng.standard_normal((E, I, H)) * 0.2).astype(np.float32), fmt),
                down_proj=as_format((rng.standard_normal((E, H, I)) * 0.2).astype(np.float32), fmt))
    T = draw(st.sampled_from([0, 1, 2, 5, 9, 33]))
    x = rng.standard_normal((T, H)).astype(np.float32) * draw(st.sampled_from([1.0, 1e-3, 30.0]))
    if T and draw(st.booleans()):  # non-finite inputs must give valid ids, never a crash
        x[rng.integers(T), rng.integers(H)] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    return args, x, draw(st.sampled_from(BACKENDS))


@FUZZ
@given(layers())
def test_layer_api(case):
    args, x, backend = case
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        y = layer(x)
        ids, weights = layer.route(x)
        assert y.shape == x.shape and ids.shape == (x.shape[0], args["top_k"])
        assert ((ids >= 0) & (ids < args["router_weight"].shape[0])).all()
        for row in ids:
            assert len(set(row.tolist())) == len(row)
        if np.isfinite(x).all() and x.size:
            ref = reference.moe_forward(x, **args, ids=ids)
            assert np.abs(y - ref).max() <= spec_tolerance(ref) * 10


BAD_VALUES = [None, -1, 0, 2**31, 2**63 - 1, 1.5, "x", float("nan"), float("inf"), True, [], np.zeros((2, 2, 2, 2))]


@FUZZ
@given(layers(), st.sampled_from(["router_weight", "gate_proj", "up_proj", "down_proj", "top_k", "scoring",
                                  "norm_topk_prob", "routed_scaling_factor", "n_group", "topk_group", "activation",
                                  "swiglu_alpha", "swiglu_limit", "router_bias", "shared_expert", "backend"]),
       st.sampled_from(BAD_VALUES))
def test_layer_api_bad_arguments(case, name, value):
    args, x, backend = case
    args = dict(args, backend=backend)
    args[name] = value
    try:
        with moe_swift.MoELayer(**args) as layer:
            layer(x)
    except EXPECTED:
        pass


@FUZZ
@given(st.data())
def test_c_abi_descriptor(data):
    """Any values in the descriptor's numeric fields, with arrays of the claimed sizes
    (C cannot check a pointer's size): a status, never a crash."""
    ffi, lib, _ = _native.load()
    desc = ffi.new("moe_layer_desc *")
    lib.moe_layer_desc_init(desc)
    small = st.integers(-3, 6)
    E, H, I, Is = (data.draw(small) for _ in range(4))
    desc.num_experts, desc.hidden_size, desc.intermediate_size = E, H, I
    desc.shared_intermediate_size = Is
    desc.top_k = data.draw(st.integers(-2, 8))
    for field in ("backend", "scoring", "activation", "n_group", "topk_group", "norm_topk_prob"):
        setattr(desc, field, data.draw(st.integers(-2**31, 2**31 - 1) | st.integers(-2, 4)))
    for field in ("routed_scaling_factor", "swiglu_alpha", "swiglu_limit"):
        setattr(desc, field, data.draw(st.floats(width=32)))
    desc.struct_size = data.draw(st.sampled_from([0, 8, int(ffi.sizeof("moe_layer_desc")), 1 << 20]))
    keep = []

    def array(n):
        a = np.ones(max(n, 1), np.float32)
        keep.append(a)
        return ffi.cast("const float *", a.ctypes.data)

    e, h, i, s = (max(v, 0) for v in (E, H, I, Is))
    fields = {"router_weight": e * h, "gate_proj": e * i * h, "up_proj": e * i * h, "gate_up_proj": 2 * e * i * h,
              "down_proj": e * h * i, "router_bias": e, "selection_bias": e, "per_expert_scale": e,
              "gate_up_bias": 2 * e * i, "down_bias": e * h, "shared_gate_proj": s * h, "shared_up_proj": s * h,
              "shared_down_proj": h * s, "shared_sigmoid_gate": h}
    for field, n in fields.items():
        if data.draw(st.booleans()):
            setattr(desc, field, array(n))
    if data.draw(st.booleans()):
        t = desc.gate_proj_tensor
        t.format = data.draw(st.integers(-1, 6))
        t.bits = data.draw(st.sampled_from([0, 2, 3, 4, 7, 8, 32]))
        t.group_size = data.draw(st.sampled_from([0, 16, 32, 64, 48]))
        t.scale_dtype = data.draw(st.integers(-1, 3))
        big = np.zeros(max(e * i * h * 4, 16), np.uint8)
        keep.append(big)
        t.data = ffi.cast("const void *", big.ctypes.data)
        t.scales = ffi.cast("const void *", big.ctypes.data) if data.draw(st.booleans()) else ffi.NULL
        t.biases = ffi.cast("const void *", big.ctypes.data) if data.draw(st.booleans()) else ffi.NULL
    out = ffi.new("moe_layer **")
    status = lib.moe_layer_create(desc, out)
    assert status in (_native.OK, _native.INVALID_ARGUMENT, _native.UNAVAILABLE, _native.OUT_OF_MEMORY)
    if status == _native.OK:
        T = data.draw(st.integers(0, 3))
        x = np.ones(max(T * h, 1), np.float32)
        y = np.empty_like(x)
        assert lib.moe_layer_forward(out[0], ffi.cast("const float *", x.ctypes.data), T, ffi.NULL,
                                     ffi.cast("float *", y.ctypes.data)) == _native.OK
        lib.moe_layer_destroy(out[0])


LAUNCH_SOURCE = """
#include <metal_stdlib>
using namespace metal;
kernel void copy(device const float* a [[buffer(0)]], device float* b [[buffer(1)]],
                 threadgroup float* t [[threadgroup(0)]], uint i [[thread_position_in_grid]],
                 uint l [[thread_index_in_threadgroup]]) {
    t[l] = a[i];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    b[i] = t[l] * 2;
}
"""


@pytest.mark.skipif("softmetal" not in moe_swift.available_backends(), reason="SoftMetal runs on Linux")
@FUZZ
@given(st.data())
def test_softmetal_launch(data):
    from moe_swift import softmetal
    lib = softmetal.compile(LAUNCH_SOURCE)
    sizes = st.integers(0, 70) | st.sampled_from([2**31, 2**32 - 1, 2**32])
    n = data.draw(st.integers(0, 300))
    a = np.arange(max(n, 1), dtype=np.float32)
    b = np.zeros(data.draw(st.integers(1, 300)), np.float32)
    kwargs = dict(threads_per_threadgroup=tuple(data.draw(sizes) for _ in range(data.draw(st.integers(1, 3)))),
                  threadgroup_memory={data.draw(st.integers(0, 3)): data.draw(st.integers(0, 40000) | sizes)})
    mode = data.draw(st.sampled_from(["threadgroups", "grid", "indirect"]))
    if mode == "indirect":
        words = st.integers(0, 70) | st.sampled_from([2**31, 2**32 - 1])
        kwargs["indirect"] = (np.array([data.draw(words) for _ in range(3)], np.uint32), data.draw(st.integers(0, 8)))
    else:
        kwargs[mode] = tuple(data.draw(sizes) for _ in range(data.draw(st.integers(1, 3))))
    try:
        lib.launch("copy", [a, b], check_races=data.draw(st.booleans()), **kwargs)
    except (softmetal.SoftMetalError, TypeError, ValueError, OverflowError):
        pass
