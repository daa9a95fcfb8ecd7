"""Issue 13: a decoder's post-attention block in one call - the layer's input RMSNorm
(input_norm), the residual add (residual=array or "input") and the next layer's RMSNorm
(next_norm), fused into the layer's stages - against the float64 reference, on every
backend that runs here, with the Metal dispatch budgets unchanged."""

import numpy as np
import pytest

import moe_swift
from moe_swift import reference
from families import FAMILIES, make_layer_args, selected_backends, spec_tolerance

BACKENDS = selected_backends()
H = 48
TOKENS = (0, 1, 5, 300)


def norm(rng, offset):
    """A norm weight as a checkpoint has it: around 1, or around 0 for (1 + weight) norms."""
    w = rng.standard_normal(H).astype(np.float32) * 0.3 + (1.0 - offset)
    return w, 1e-6


def assert_close(y, ref, what):
    assert y.dtype == np.float32 and y.shape == ref.shape, what
    if y.size:
        err = float(np.abs(y - ref).max())
        assert err <= spec_tolerance(ref), (what, err, spec_tolerance(ref))


def layer_ids(layer, x, input_norm, offset):
    """The layer's own routing of the rows it routes (normalised with an input norm), so
    that float32-vs-float64 near-ties cannot make the reference pick other experts."""
    xr = x if input_norm is None else reference.rms_norm(x, *input_norm, offset=offset).astype(np.float32)
    return layer.route(xr)[0]


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    return request.param


@pytest.mark.parametrize("family", FAMILIES)
def test_block_matches_reference(family, backend):
    args = make_layer_args(family, H=H, I=40, E=16, k=4, seed=3, shared=24)
    rng = np.random.default_rng(11)
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        for T in TOKENS:
            for offset in (0.0, 1.0):
                x = rng.standard_normal((T, H)).astype(np.float32) * 3
                r = rng.standard_normal((T, H)).astype(np.float32)
                n_in, n_next = norm(rng, offset), norm(rng, offset)
                offsets = dict(input_norm_offset=offset, next_norm_offset=offset)
                what = (family, backend, T, offset)
                ids = layer_ids(layer, x, n_in, offset)

                # The whole block: h = x + moe(norm_in(x)), normed = norm_next(h).
                h, normed = layer(x, input_norm=n_in, residual="input", next_norm=n_next, **offsets)
                ref_h, ref_n = reference.moe_forward(x, **args, input_norm=n_in, residual="input",
                                                     next_norm=n_next, ids=ids, **offsets)
                assert_close(h, ref_h, what + ("h",))
                assert_close(normed, ref_n, what + ("normed",))

                # Input norm alone, with and without the residual.
                y = layer(x, input_norm=n_in, input_norm_offset=offset)
                assert_close(y, reference.moe_forward(x, **args, input_norm=n_in, input_norm_offset=offset,
                                                      ids=ids), what + ("input_norm",))
                y = layer(x, input_norm=n_in, residual=r, input_norm_offset=offset)
                assert_close(y, reference.moe_forward(x, **args, input_norm=n_in, input_norm_offset=offset,
                                                      residual=r, ids=ids), what + ("input_norm, residual",))

                # Next norm after a given residual, and without any residual (h = moe(x)).
                ids = layer_ids(layer, x, None, offset)
                for res in (r, None):
                    h, normed = layer(x, residual=res, next_norm=n_next, next_norm_offset=offset)
                    ref_h, ref_n = reference.moe_forward(x, **args, residual=res, next_norm=n_next,
                                                         next_norm_offset=offset, ids=ids)
                    assert_close(h, ref_h, what + ("next_norm h", res is None))
                    assert_close(normed, ref_n, what + ("next_norm", res is None))

                # residual="input" without a norm is residual = x.
                y = layer(x, residual="input")
                assert_close(y, reference.moe_forward(x, **args, residual=x, ids=ids), what + ("residual=input",))


def test_offsets_change_the_result(backend):
    """The offset is applied (offset 1 with weight w is the norm of weight 1 + w)."""
    args = make_layer_args("qwen3_moe", H=H, I=24, E=8, k=2, seed=5)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, H)).astype(np.float32)
    w = rng.standard_normal(H).astype(np.float32) * 0.2
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        a = layer(x, input_norm=(w, 1e-5), input_norm_offset=1.0, residual="input", next_norm=(w, 1e-5),
                  next_norm_offset=1.0)
        b = layer(x, input_norm=(1 + w, 1e-5), residual="input", next_norm=(1 + w, 1e-5))
        np.testing.assert_allclose(a[0], b[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(a[1], b[1], rtol=1e-5, atol=1e-5)
        c = layer(x, input_norm=(w, 1e-5), residual="input", next_norm=(w, 1e-5))
        assert np.abs(a[1] - c[1]).max() > 0.1


@pytest.mark.parametrize("T", [1, 5, 300])
def test_in_place(backend, T):
    """out=r writes h into the residual; out=x with residual="input" updates x in place."""
    args = make_layer_args("deepseek_v3", H=H, I=40, E=16, k=4, seed=7, shared=24)
    rng = np.random.default_rng(T)
    x = rng.standard_normal((T, H)).astype(np.float32)
    r = rng.standard_normal((T, H)).astype(np.float32)
    n_in, n_next = norm(rng, 0.0), norm(rng, 0.0)
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        ids = layer_ids(layer, x, None, 0.0)
        ref_h, ref_n = reference.moe_forward(x, **args, residual=r, next_norm=n_next, ids=ids)
        r_in = r.copy()
        h, normed = layer(x, residual=r_in, next_norm=n_next, out=r_in)
        assert h is r_in
        assert_close(r_in, ref_h, "out=r")
        assert_close(normed, ref_n, "out=r normed")

        ids = layer_ids(layer, x, n_in, 0.0)
        ref_h, ref_n = reference.moe_forward(x, **args, input_norm=n_in, residual="input", next_norm=n_next, ids=ids)
        x_in = x.copy()
        h, normed = layer(x_in, input_norm=n_in, residual="input", next_norm=n_next, out=x_in)
        assert h is x_in
        assert_close(x_in, ref_h, "out=x")
        assert_close(normed, ref_n, "out=x normed")

        y = np.full(x.shape, np.nan, np.float32)
        assert layer(x, residual=r, out=y) is y  # a plain call into a given array
        assert_close(y, reference.moe_forward(x, **args, residual=r, ids=layer_ids(layer, x, None, 0.0)), "out=y")


@pytest.mark.skipif(not {"softmetal", "metal"} & set(BACKENDS), reason="needs a Metal backend")
@pytest.mark.parametrize("shared", [False, True])
def test_dispatch_budget_unchanged(shared):
    metal = "metal" if "metal" in BACKENDS else "softmetal"
    args = make_layer_args("qwen2_moe" if shared else "mixtral", H=H, I=40, E=16, k=4, seed=1, shared=24)
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(H).astype(np.float32), 1e-6)
    variants = [dict(), dict(input_norm=w), dict(input_norm=w, residual="input"), dict(next_norm=w),
                dict(residual="input", next_norm=w), dict(input_norm=w, residual="input", next_norm=w)]
    with moe_swift.MoELayer(**args, backend=metal) as layer:
        for T, budget in ((1, 5), (4, 5), (5, 5), (300, 5)):
            x = rng.standard_normal((T, H)).astype(np.float32)
            for v in variants:
                layer(x, **v)
                stats = moe_swift.last_stats()
                assert stats["dispatches"] == budget + 2 * shared, (T, v, stats)
                assert (stats["command_buffers"], stats["cpu_waits"]) == (1, 1), (T, v, stats)


@pytest.mark.parametrize("T", [1, 5, 300])
def test_run_layers_with_input_norms(backend, T):
    """x_{i+1} = x_i + moe_i(rmsnorm_i(x_i)): a stack of decoder post-attention blocks."""
    families = ["qwen3_moe", "deepseek_v3", "gemma4"]
    argss = [make_layer_args(f, H=H, I=32, E=8, k=2, seed=20 + i, shared=16) for i, f in enumerate(families)]
    rng = np.random.default_rng(T + 1)
    norms = [norm(rng, 1.0) for _ in families]
    x = rng.standard_normal((T, H)).astype(np.float32)
    layers = [moe_swift.MoELayer(**a, backend=backend) for a in argss]
    try:
        y = moe_swift.run_layers(layers, x, input_norms=norms, input_norm_offset=1.0)
        if backend != "cpu":
            base = 5  # the plain stack's count per layer (decode or prefill), + 2 for deepseek's shared expert
            assert moe_swift.last_stats()["dispatches"] == 3 * base + 2
        ref = x.copy()
        for layer, a, n in zip(layers, argss, norms):
            # Each layer's own routing of its (float32) input, then the reference step.
            ids = layer_ids(layer, ref.astype(np.float32), n, 1.0)
            ref = reference.moe_forward(ref, **a, input_norm=n, input_norm_offset=1.0, residual="input", ids=ids)
        assert_close(y, ref, ("run_layers", backend, T))
        # Without norms it is still the plain stack.
        np.testing.assert_array_equal(moe_swift.run_layers(layers, x), moe_swift.run_layers(layers, x, input_norms=None))
    finally:
        for layer in layers:
            layer.close()


def test_bad_arguments(backend):
    args = make_layer_args("mixtral", H=H, I=16, E=4, k=2, seed=1)
    x = np.ones((3, H), np.float32)
    w = np.ones(H, np.float32)
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        for name in ("input_norm", "next_norm"):
            for bad, kind, words in [
                ((np.ones(H + 1, np.float32), 1e-6), ValueError, f"{name} weight must have shape ({H})"),
                ((np.ones((1, H), np.float32), 1e-6), ValueError, f"{name} weight must have shape ({H})"),
                ((w, 0.0), ValueError, f"{name} eps must be positive and finite"),
                ((w, -1e-6), ValueError, f"{name} eps must be positive and finite"),
                ((w, float("nan")), ValueError, f"{name} eps must be positive and finite"),
                ((w, float("inf")), ValueError, f"{name} eps must be positive and finite"),
                ((w, 1e-60), ValueError, f"{name} eps must be positive and finite"),  # 0 in float32
                ((w, "1e-6"), TypeError, f"{name} eps must be a real number"),
                (w, TypeError, f"{name} must be a (weight, eps) pair"),
                ((w, 1e-6, 0.0), TypeError, f"{name} must be a (weight, eps) pair"),
            ]:
                with pytest.raises(kind, match=words.replace("(", r"\(").replace(")", r"\)")):
                    layer(x, **{name: bad})
            with pytest.raises(ValueError, match=f"{name}_offset must be finite"):
                layer(x, **{name: (w, 1e-6), f"{name}_offset": float("nan")})
        with pytest.raises(ValueError, match='residual must be an array or "input"'):
            layer(x, residual="inputs")
        with pytest.raises(ValueError, match="residual must have x's shape"):
            layer(x, residual=np.ones((2, H), np.float32))
        for bad_out, kind, words in [
            (np.ones((3, H), np.float64), ValueError, "out must be a writeable C-contiguous float32 array"),
            (np.ones((H, 3), np.float32).T, ValueError, "out must be a writeable C-contiguous float32 array"),
            (np.ones((4, H), np.float32), ValueError, "out must have x's shape"),
            ([[0.0] * H] * 3, TypeError, "out must be a NumPy array"),
        ]:
            with pytest.raises(kind, match=words):
                layer(x, out=bad_out)
        frozen = np.ones((3, H), np.float32)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="out must be a writeable"):
            layer(x, out=frozen)
        with pytest.raises(ValueError, match="input_norms must have one"):
            moe_swift.run_layers([layer], x, input_norms=[(w, 1e-6), (w, 1e-6)])
        with pytest.raises(ValueError, match=r"input_norms\[0\] eps must be positive"):
            moe_swift.run_layers([layer], x, input_norms=[(w, 0.0)])
        with pytest.raises(ValueError, match=r"input_norms\[0\] weight must have shape"):
            moe_swift.run_layers([layer], x, input_norms=[(w[:-1], 1e-6)])
        # Nothing above changed what a good call computes.
        h, normed = layer(x, next_norm=(w, 1e-6))
        np.testing.assert_array_equal(h, layer(x))


def test_reference_rms_norm():
    x = np.array([[3.0, 4.0], [0.0, 0.0]])
    w = np.array([1.0, 2.0])
    expected = x / np.sqrt((x ** 2).mean(axis=1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(reference.rms_norm(x, w, 1e-6), expected)
    np.testing.assert_allclose(reference.rms_norm(x, w, 1e-6, offset=1.0), expected / w * (1 + w))
    np.testing.assert_array_equal(reference.rms_norm(x, w, 1e-6)[1], [0.0, 0.0])


# Hidden sizes across the code's blocks: 40 leaves a tail after 32 lanes (and 8 after 16),
# 333 crosses the CPU combine's 256-wide blocks with an odd tail, 2048 with I = 768 is a
# real model's (Qwen3-30B-A3B; few experts: the expert count crosses no block).
BOUNDARY_SIZES = (40, 333, 2048)


@pytest.mark.parametrize("H", BOUNDARY_SIZES)
@pytest.mark.parametrize("family", FAMILIES)
def test_block_across_hidden_size_boundaries(family, backend, H):
    I = 768 if H == 2048 else 40
    args = make_layer_args(family, H=H, I=I, E=4, k=2, seed=7, shared=I)
    rng = np.random.default_rng(H)
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        for T in (1, 7):
            x = rng.standard_normal((T, H)).astype(np.float32) * 3
            r = rng.standard_normal((T, H)).astype(np.float32)
            w_in = rng.standard_normal(H).astype(np.float32) * 0.3 + 1
            w_next = rng.standard_normal(H).astype(np.float32) * 0.3 + 1
            n_in, n_next = (w_in, 1e-6), (w_next, 1e-6)
            what = (family, backend, H, T)
            ids = layer_ids(layer, x, n_in, 0.0)
            h, normed = layer(x, input_norm=n_in, residual="input", next_norm=n_next)
            ref_h, ref_n = reference.moe_forward(x, **args, input_norm=n_in, residual="input", next_norm=n_next,
                                                 ids=ids)
            assert_close(h, ref_h, what + ("h",))
            assert_close(normed, ref_n, what + ("normed",))
            ids = layer_ids(layer, x, None, 0.0)
            h, normed = layer(x, residual=r, next_norm=n_next)
            ref_h, ref_n = reference.moe_forward(x, **args, residual=r, next_norm=n_next, ids=ids)
            assert_close(h, ref_h, what + ("next_norm h",))
            assert_close(normed, ref_n, what + ("next_norm",))


def test_eps_where_it_stops_being_small(backend):
    """Rows whose mean square is near eps (tiny activations, a large eps) and rows of huge
    RMS, through both norms, against the reference: eps inside the square root changes
    the norm by up to a factor 1.4 here, which eps moved outside it (or squared) cannot
    hide, whereas rows of RMS 1-3 with eps 1e-6 would hide anything (issue 46)."""
    args = make_layer_args("qwen3_moe", H=H, I=24, E=8, k=2, seed=9)
    rng = np.random.default_rng(4)
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        for scale, eps in ((1e-3, 1e-6), (3e-3, 1e-5), (1e-2, 1e-4), (1e3, 1e-6)):
            w = (rng.standard_normal(H) * 0.3 + 1).astype(np.float32)
            what = (backend, scale, eps)
            x = (rng.standard_normal((5, H)) * scale).astype(np.float32)
            # The input norm sees rows of RMS `scale`.
            ids = layer_ids(layer, x, (w, eps), 0.0)
            y = layer(x, input_norm=(w, eps))
            assert_close(y, reference.moe_forward(x, **args, input_norm=(w, eps), ids=ids), what + ("input_norm",))
            # The next norm sees h = residual + moe(x) of RMS `scale` (a tiny moe(x): x is tiny).
            small = (rng.standard_normal((5, H)) * 1e-4).astype(np.float32)
            ids = layer_ids(layer, small, None, 0.0)
            h, normed = layer(small, residual=x, next_norm=(w, eps))
            ref_h, ref_n = reference.moe_forward(small, **args, residual=x, next_norm=(w, eps), ids=ids)
            assert_close(h, ref_h, what + ("next_norm h",))
            assert_close(normed, ref_n, what + ("next_norm",))
