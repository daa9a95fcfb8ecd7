"""Nothing a user passes may crash the interpreter: each mistake gets a clear exception."""

import os
import re

import numpy as np
import pytest

import moe_swift
from families import make_layer_args

H, I, E, K = 16, 8, 4, 2


@pytest.fixture
def args():
    return make_layer_args("mixtral", H=H, I=I, E=E, k=K, seed=0)


def expect(exc, match, **changes):
    def run(args):
        a = dict(args)
        for k, v in changes.items():
            if v is DELETE:
                a.pop(k, None)
            else:
                a[k] = v
        with pytest.raises(exc, match=match):
            moe_swift.MoELayer(**a)
    return run


DELETE = object()
rng = np.random.default_rng(0)
f32 = lambda *s: rng.standard_normal(s).astype(np.float32)

CASES = {
    "router 1-D": expect(ValueError, r"router_weight must have shape \(\?, \?\)", router_weight=f32(E * H)),
    "gate wrong H": expect(ValueError, r"gate_proj must have shape \(4, \?, 16\)", gate_proj=f32(E, I, H + 1)),
    "up wrong I": expect(ValueError, r"up_proj must have shape \(4, 8, 16\)", up_proj=f32(E, I + 1, H)),
    "down wrong": expect(ValueError, r"down_proj must have shape \(4, 16, 8\)", down_proj=f32(E, I, H)),
    "down missing": expect(ValueError, r"down_proj .* is required", down_proj=None),
    "up missing": expect(ValueError, r"gate_proj and up_proj", up_proj=None),
    "both gate forms": expect(ValueError, r"either gate_proj and up_proj, or gate_up_proj",
                              gate_up_proj=f32(E, 2 * I, H)),
    "odd gate_up": expect(ValueError, r"gate_up_proj must have shape", gate_proj=None, up_proj=None,
                          gate_up_proj=f32(E, 2 * I + 1, H)),
    "top_k 0": expect(ValueError, r"top_k must be in 1\.\.\.num_experts \(4\), got 0", top_k=0),
    "top_k -1": expect(ValueError, r"top_k must be in 1\.\.\.num_experts \(4\), got -1", top_k=-1),
    "top_k > E": expect(ValueError, r"top_k must be in 1\.\.\.num_experts \(4\), got 5", top_k=5),
    "top_k float": expect(TypeError, r"top_k must be an integer", top_k=2.0),
    "top_k str": expect(TypeError, r"top_k must be an integer", top_k="2"),
    "top_k bool": expect(TypeError, r"top_k must be an integer", top_k=True),
    "n_group beyond int32": expect(ValueError, r"n_group = 4294967296 is out of range", n_group=1 << 32),
    "groups not dividing": expect(ValueError, r"n_group \(3\) must divide", n_group=3),
    "topk_group > n_group": expect(ValueError, r"topk_group must be in 1\.\.\.n_group \(2\), got 3", n_group=2, topk_group=3),
    "groups too small": expect(ValueError, r"cannot hold top_k", n_group=4, topk_group=1),
    "n_group 0": expect(ValueError, r"n_group must be at least 1, got 0", n_group=0),
    "scoring": expect(ValueError, r"scoring must be one of", scoring="relu"),
    "activation": expect(ValueError, r"activation must be one of", activation="relu2"),
    "backend": expect(ValueError, r"backend must be one of", backend="cuda"),
    "scale nan": expect(ValueError, r"routed_scaling_factor must be finite", routed_scaling_factor=float("nan")),
    "scale str": expect(TypeError, r"routed_scaling_factor must be a real number", routed_scaling_factor="1"),
    "router_bias shape": expect(ValueError, r"router_bias must have shape \(4\)", router_bias=f32(E + 1)),
    "selection_bias shape": expect(ValueError, r"selection_bias must have shape \(4\)", selection_bias=f32(2, E)),
    "per_expert_scale shape": expect(ValueError, r"per_expert_scale must have shape \(4\)", per_expert_scale=f32(3)),
    "gate_up_bias shape": expect(ValueError, r"gate_up_bias must have shape \(4, 16\)", gate_up_bias=f32(E, I)),
    "down_bias shape": expect(ValueError, r"down_bias must have shape \(4, 16\)", down_bias=f32(E, I)),
    "gate_bias alone": expect(ValueError, r"gate_bias and up_bias", gate_bias=f32(E, I)),
    "complex weights": expect(TypeError, r"router_weight must be an array of real numbers",
                              router_weight=f32(E, H).astype(np.complex64)),
    "string weights": expect(TypeError, r"gate_proj must be an array of real numbers", gate_proj="weights"),
    "object weights": expect(TypeError, r"up_proj must be an array of real numbers",
                             up_proj=np.array([None] * (E * I * H), dtype=object).reshape(E, I, H)),
    "ragged": expect(TypeError, r"router_weight must be an array of real numbers", router_weight=[[1.0], [1.0, 2.0]]),
    "empty H": expect(ValueError, r"must have shape|positive", router_weight=np.zeros((E, 0), np.float32)),
    "shared not mapping": expect(TypeError, r"shared_expert must be a mapping", shared_expert=[1, 2]),
    "shared missing key": expect(ValueError, r"lacks \['down_proj'\]",
                                 shared_expert=dict(gate_proj=f32(5, H), up_proj=f32(5, H))),
    "shared unknown key": expect(ValueError, r"unknown keys \['bias'\]",
                                 shared_expert=dict(gate_proj=f32(5, H), up_proj=f32(5, H),
                                                    down_proj=f32(H, 5), bias=f32(H))),
    "shared with zero rows": expect(ValueError, r"shared_expert\['gate_proj'\] must have at least one row",
                                    shared_expert=dict(gate_proj=f32(0, H), up_proj=f32(0, H), down_proj=f32(H, 0))),
    "shared down shape": expect(ValueError, r"shared_expert\['down_proj'\] must have shape \(16, 5\)",
                                shared_expert=dict(gate_proj=f32(5, H), up_proj=f32(5, H), down_proj=f32(5, H))),
    "shared gate shape": expect(ValueError, r"shared_expert\['sigmoid_gate'\] must have shape \(16\)",
                                shared_expert=dict(gate_proj=f32(5, H), up_proj=f32(5, H), down_proj=f32(H, 5),
                                                   sigmoid_gate=f32(5))),
    "norm_topk_prob a string": expect(TypeError, r"norm_topk_prob must be True or False, got 'False'",
                                      norm_topk_prob="False"),
    "scaling beyond float": expect(ValueError, r"routed_scaling_factor must be within float32's range",
                                   routed_scaling_factor=10**400),
    "scaling beyond float32": expect(ValueError, r"routed_scaling_factor must be within float32's range",
                                     routed_scaling_factor=1e39),
    "alpha nan": expect(ValueError, r"swiglu_alpha must be finite", swiglu_alpha=float("nan")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_layer_arguments(args, case):
    CASES[case](args)


# The other side of each boundary above: the nearest legal value builds a layer whose
# output is the reference's (so a check that refused too much, or accepted the value and
# then mishandled it, fails here).
LEGAL = {
    "top_k = num_experts": dict(top_k=E),
    "top_k 1": dict(top_k=1),
    "n_group 1": dict(n_group=1, topk_group=1),
    "n_group dividing": dict(n_group=2, topk_group=1),
    "n_group = num_experts": dict(n_group=E, topk_group=2),
    "topk_group = n_group": dict(n_group=2, topk_group=2),
    "scaling large within float32": dict(routed_scaling_factor=1e30),
    "shared with one row": dict(shared_expert=dict(gate_proj=f32(1, H), up_proj=f32(1, H), down_proj=f32(H, 1))),
    "norm_topk_prob False": dict(norm_topk_prob=False),
    "swiglu_limit just positive": dict(activation="swiglu_oai", swiglu_limit=1e-3),
}


@pytest.mark.parametrize("case", sorted(LEGAL))
def test_nearest_legal_layer_arguments(args, case):
    from families import spec_tolerance
    from moe_swift import reference

    a = dict(args, **LEGAL[case])
    x = f32(3, H)
    with moe_swift.MoELayer(**a, backend="cpu") as layer:
        y = layer(x)
    ref = reference.moe_forward(x, **a)
    assert np.abs(y - ref).max() <= spec_tolerance(ref)


def test_swiglu_limit_must_be_positive(args):
    # Checked by the native library (its message comes through as ValueError).
    with pytest.raises(ValueError, match="swiglu_limit must be finite and positive"):
        moe_swift.MoELayer(**args, swiglu_limit=-1.0)


def test_unavailable_backend(args):
    for name in {"metal", "softmetal"} - set(moe_swift.available_backends()):
        with pytest.raises(moe_swift.BackendUnavailableError, match=name):
            moe_swift.MoELayer(**args, backend=name)


def test_bad_call_arguments(args):
    with moe_swift.MoELayer(**args) as layer:
        with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 16\), got \(3, 15\)"):
            layer(f32(3, H - 1))
        with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 16\), got \(\)"):
            layer(np.float32(1.0))
        with pytest.raises(ValueError, match=r"residual must have x's shape \(3, 16\), got \(3, 1\)"):
            layer(f32(3, H), residual=f32(3, 1))
        # Same size, other shape: a transposed residual is a mistake, not a reshape.
        with pytest.raises(ValueError, match=r"residual must have x's shape \(3, 16\), got \(16, 3\)"):
            layer(f32(3, H), residual=f32(H, 3))
        with pytest.raises(TypeError, match="x must be an array of real numbers"):
            layer(np.array(["a"] * H))
        with pytest.raises(TypeError, match="residual must be an array of real numbers"):
            layer(f32(1, H), residual=np.zeros((1, H), np.complex128))
        with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 16\)"):
            layer.route(f32(2, 3))
        assert layer(f32(3, H)).shape == (3, H)  # still usable after errors


def test_use_after_close(args):
    layer = moe_swift.MoELayer(**args)
    layer.close()
    layer.close()  # idempotent
    for call in (lambda: layer(f32(1, H)), lambda: layer.route(f32(1, H))):
        with pytest.raises(ValueError, match="closed"):
            call()
    assert "closed" in repr(layer)


def test_native_errors_have_messages():
    # The C ABI directly, bypassing the facade's own checks: nothing crashes.
    from moe_swift import _native
    ffi, lib, _ = _native.load()
    desc = ffi.new("moe_layer_desc *")
    lib.moe_layer_desc_init(desc)
    out = ffi.new("moe_layer **")
    assert lib.moe_layer_create(desc, out) == _native.INVALID_ARGUMENT
    assert re.search(r"hidden_size must be positive", ffi.string(lib.moe_last_error()).decode())
    assert lib.moe_layer_create(ffi.NULL, out) == _native.INVALID_ARGUMENT
    assert lib.moe_layer_create(desc, ffi.NULL) == _native.INVALID_ARGUMENT
    forged = ffi.cast("moe_layer *", 0x1234)
    assert lib.moe_layer_forward(forged, ffi.NULL, 1, ffi.NULL, ffi.NULL) == _native.INVALID_ARGUMENT
    assert b"not a live layer" in ffi.string(lib.moe_last_error())
    lib.moe_layer_destroy(forged)  # ignored
    assert lib.moe_layer_backend(forged) == -1


@pytest.mark.skipif("softmetal" not in moe_swift.available_backends(), reason="SoftMetal runs on Linux")
def test_softmetal_harness_argument_types():
    from moe_swift import softmetal
    with pytest.raises(TypeError, match="source must be a str"):
        softmetal.compile(123)
    with pytest.raises(TypeError, match="source must be a str"):
        softmetal.compile(b"kernel void k() {}")
    with pytest.raises(ValueError, match="NUL"):
        softmetal.compile("kernel void k() {}\0 garbage")
    lib = softmetal.compile("kernel void k(device float* a [[buffer(0)]]) { a[0] = 1; }")
    a = np.zeros(1, np.float32)
    with pytest.raises(TypeError, match="kernel must be a str"):
        lib.launch(5, [a], threadgroups=1)
    with pytest.raises(ValueError, match="NUL"):
        lib.launch("k\0x", [a], threadgroups=1)
    with pytest.raises(TypeError, match="threadgroups must be 1 to 3 integers"):
        lib.launch("k", [a], threadgroups=(1.7,))
    with pytest.raises(softmetal.InvalidUsageError, match=r"in \[0, 2\*\*32\)"):
        lib.launch("k", [a], threadgroups=(2**32, 1, 1))
    with pytest.raises(softmetal.InvalidUsageError, match="0 bytes: Metal has no empty buffers"):
        lib.launch("k", [np.zeros(0, np.float32)], threadgroups=1)
    lib.launch("k", [a], threadgroups=(1,))
    assert a[0] == 1


@pytest.mark.skipif("softmetal" not in moe_swift.available_backends(), reason="SoftMetal runs on Linux")
def test_softmetal_sizes_whose_products_overflow_are_usage_errors():
    """Each of these trapped (SIGILL) in the launch path's size arithmetic."""
    from moe_swift import softmetal
    lib = softmetal.compile("kernel void k(device float* a [[buffer(0)]], threadgroup float* t [[threadgroup(0)]],"
                            " uint i [[thread_position_in_grid]]) { if (i == 0) a[0] = 1; }")
    a = np.zeros(1, np.float32)
    big = 2**32 - 1
    cases = [dict(threadgroups=(big, big, 1), threadgroup_memory={0: 16}),
             dict(threadgroups=1, threads_per_threadgroup=(big, big, 1), threadgroup_memory={0: 16}),
             dict(threadgroups=1, threadgroup_memory={0: 2**62, 1: 2**62}),
             dict(indirect=np.array([big, big, big], np.uint32), threadgroup_memory={0: 16})]
    for case in cases:
        with pytest.raises(softmetal.InvalidUsageError):
            lib.launch("k", [a], **case)
    lib.launch("k", [a], threadgroups=1, threadgroup_memory={0: 16})
    assert a[0] == 1


@pytest.mark.skipif("softmetal" not in moe_swift.available_backends(), reason="SoftMetal runs on Linux")
def test_kernel_traps_are_errors_not_signals():
    """Integer division by zero, INT_MIN / -1 and __builtin_trap() in a kernel raised
    SIGFPE / SIGILL, which ended the process. A division does not stop a GPU: unchecked it
    gives AArch64's values (x / 0 = 0; INT_MIN / -1 = INT_MIN), and check_division=True
    makes it an error; a trap is always an error."""
    from moe_swift import softmetal
    lib = softmetal.compile("""
    kernel void div(device int* a [[buffer(0)]], device const int* b [[buffer(1)]],
                    uint i [[thread_position_in_grid]]) { a[i] = a[i] / b[i]; }
    kernel void trap(device int* a [[buffer(0)]], uint i [[thread_position_in_grid]]) {
        if (i == 3) __builtin_trap();
        a[i] = 1;
    }""")
    for b, words, values in ((np.array([1, 2, 0, 4], np.int32), "division or remainder by zero", [5, -2**30, 0, 2]),
                             (np.array([1, -1, 1, 1], np.int32), r"overflows \(INT_MIN / -1\)|division",
                              [5, -2**31, 7, 8])):
        a = np.array([5, -2**31, 7, 8], np.int32)
        lib.launch("div", [a, b], grid=(4,), threads_per_threadgroup=(4,))
        assert a.tolist() == values
        a = np.array([5, -2**31, 7, 8], np.int32)
        with pytest.raises(softmetal.SoftMetalError, match=words):
            lib.launch("div", [a, b], grid=(4,), threads_per_threadgroup=(4,), check_division=True)
    with pytest.raises(softmetal.SoftMetalError, match="trap instruction"):
        lib.launch("trap", [np.zeros(4, np.int32)], grid=(4,), threads_per_threadgroup=(4,))
    a = np.full(4, 6, np.int32)
    lib.launch("div", [a, np.full(4, 3, np.int32)], grid=(4,), threads_per_threadgroup=(4,))
    assert a.tolist() == [2, 2, 2, 2]


@pytest.mark.skipif("softmetal" not in moe_swift.available_backends() or not os.path.exists("/proc/self/statm"),
                    reason="SoftMetal and /proc (Linux)")
def test_faulting_launches_do_not_leak():
    """Each out-of-bounds launch leaked its messages (~1.2 KB)."""
    from moe_swift import softmetal
    lib = softmetal.compile("kernel void k(device float* a [[buffer(0)]], uint i [[thread_position_in_grid]])"
                            " { a[i + 4096] = 1; }")
    a = np.zeros(4, np.float32)

    def fault(n):
        for _ in range(n):
            with pytest.raises(softmetal.OutOfBoundsError):
                lib.launch("k", [a], grid=(1,), threads_per_threadgroup=(1,))

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    fault(300)  # pools and caches reach their steady state
    before = rss()
    fault(3000)
    assert rss() - before < (1 << 20), f"{(rss() - before) / 3000:.0f} bytes per faulting launch"


@pytest.mark.skipif("softmetal" not in moe_swift.available_backends(), reason="SoftMetal runs on Linux")
def test_more_threads_than_a_gpu_has_are_refused_before_anything_is_mapped():
    """[[max_total_threads_per_threadgroup(40000)]] let a launch map 40,000 fiber stacks
    (exhausting the memory-map table) before refusing: now it does not compile, as with
    Apple's compiler, and launches above 1024 threads are refused before any mapping."""
    from moe_swift import softmetal
    with pytest.raises(softmetal.CompileError, match=r"the limit is 1\.\.\.1024"):
        softmetal.compile("[[kernel, max_total_threads_per_threadgroup(40000)]] void k(device float* a [[buffer(0)]]) {}")
    lib = softmetal.compile("kernel void k(device float* a [[buffer(0)]], uint i [[thread_position_in_grid]])"
                            " { if (i == 0) a[0] = 1; }")
    a = np.zeros(1, np.float32)
    with pytest.raises(softmetal.InvalidUsageError, match="exceeds maxTotalThreadsPerThreadgroup 1024"):
        lib.launch("k", [a], threadgroups=1, threads_per_threadgroup=(40000, 1, 1))
    lib.launch("k", [a], threadgroups=1, threads_per_threadgroup=(1024, 1, 1))
    assert a[0] == 1


def test_read_bandwidth_arguments():
    import moe_swift
    assert moe_swift.read_bandwidth(64 << 20, 1) > 0.1  # GB/s: any machine reads faster
    for nbytes, repeats in [((64 << 20) - 1, 1), (True, 1), (64.0 * 2**20, 1), (64 << 20, 0), (64 << 20, 1001),
                            (64 << 20, 2.0)]:
        with pytest.raises(ValueError, match="nbytes must be|repeats must be"):
            moe_swift.read_bandwidth(nbytes, repeats)
