"""moe_swift as transformers' experts backend (skipped without torch and transformers):
tiny random models of each family give the same logits and the same greedy tokens with
experts_implementation="moe_swift" as with "eager"."""

import pathlib
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from moe_swift.integrations import transformers as moe_tf  # noqa: E402

# The tiny configurations of the committed reference checkpoints, one place for both.
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "fixtures"))
from make_reference_checkpoints import COMMON, TRANSFORMERS as CONFIGS  # noqa: E402

VOCAB = COMMON["vocab_size"]


def tiny_model(family):
    config = transformers.AutoConfig.for_model(family, **COMMON, **CONFIGS[family])
    torch.manual_seed(0)
    return randomize_experts(transformers.AutoModelForCausalLM.from_config(config).eval())


def randomize_experts(model):
    with torch.no_grad():  # make the experts matter: random, not the init's near-zero values
        for name, p in model.named_parameters():
            if "experts" in name:
                p.normal_(0, 0.1)
    return model


def compare_with_eager(model, name, *, generate=True):
    """The model's output (logits, or the last hidden state of a model without a head) for
    a batch of two, and its greedy tokens, are the same with the experts backend `name` as
    with "eager"; and the backend did run."""
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))

    def run(implementation):
        model.set_experts_implementation(implementation)
        out = model(ids)
        out = out.logits if hasattr(out, "logits") else out.last_hidden_state
        tokens = model.generate(ids[:1], max_new_tokens=8, do_sample=False).tolist() if generate else None
        return out.float().numpy(), tokens

    with torch.no_grad():
        eager, eager_tokens = run("eager")
        ours, ours_tokens = run(name)
    assert any(moe_tf.layer_of(m) is not None for m in model.modules()), "the backend never ran"
    moe_tf.reset(model)
    np.testing.assert_allclose(ours, eager, rtol=1e-4, atol=1e-4)
    assert ours_tokens == eager_tokens


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_experts_backend_matches_eager(family):
    compare_with_eager(tiny_model(family), moe_tf.register(backend="cpu"))


def experts_modules(model):
    return [m for m in model.modules() if hasattr(m, "_apply_gate")]


def test_the_activation_is_what_the_module_computes():
    """The activation comes from what the module's gating computes, not from its names: a
    plain function as act_fn (lfm2_moe's style) with a config that still says silu."""
    model = tiny_model("qwen3_moe")
    for m in experts_modules(model):
        del m.act_fn  # a submodule; a function takes its place as a plain attribute
        m.act_fn = torch.nn.functional.gelu  # exact GELU; config.hidden_act stays "silu"
    compare_with_eager(model, moe_tf.register(backend="cpu"), generate=False)


def test_a_gating_the_core_lacks_is_refused():
    """A module whose _apply_gate computes none of the core's activations (here a clamped
    SiLU, as deepseek_v4's) stops with a NotImplementedError instead of running plain SiLU."""
    model = tiny_model("qwen3_moe")
    for m in experts_modules(model):
        m._apply_gate = lambda gate_up: torch.nn.functional.silu(gate_up.chunk(2, -1)[0].clamp(max=1.0)) \
            * gate_up.chunk(2, -1)[1]
    model.set_experts_implementation(moe_tf.register(backend="cpu"))
    with torch.no_grad(), pytest.raises(NotImplementedError, match="no activation matching the gating"):
        model(torch.zeros((1, 3), dtype=torch.long))


def test_bfloat16_parameters_stay_bfloat16():
    name = moe_tf.register(backend="cpu")
    model = tiny_model("qwen3_moe").to(torch.bfloat16)
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model.set_experts_implementation("eager")
        eager = model(ids).logits.float()
        model.set_experts_implementation(name)
        ours = model(ids).logits
    assert ours.dtype == torch.bfloat16
    np.testing.assert_allclose(ours.float().numpy(), eager.numpy(), rtol=0.05, atol=0.05)


def test_one_line_of_glue(tmp_path):
    """docs/integrations.md's recipe: importing the module is all it takes before from_pretrained."""
    import moe_swift.integrations.transformers  # noqa: F401  (registers "moe_swift")

    tiny_model("mixtral").save_pretrained(tmp_path)
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))
    eager = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation="eager").eval()
    ours = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation="moe_swift").eval()
    with torch.no_grad():
        np.testing.assert_allclose(ours(ids).logits.numpy(), eager(ids).logits.numpy(), rtol=1e-4, atol=1e-4)
    assert any(moe_tf.layer_of(m) is not None for m in ours.modules())


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_gradients_are_eager_ones(family):
    """Training through the backend: the forward is the layer's, and the loss and every
    gradient - the expert weights, the router and everything below - are eager's (the op's
    autograd formula differentiates transformers' eager experts at the same inputs)."""
    name = moe_tf.register(backend="cpu")
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))

    def loss_and_grads(implementation):
        model = tiny_model(family).train()
        model.set_experts_implementation(implementation)
        loss = model(ids, labels=ids).loss
        loss.backward()
        ran = any(moe_tf.layer_of(m) is not None for m in model.modules())
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, ran

    eager_loss, eager, _ = loss_and_grads("eager")
    ours_loss, ours, ran = loss_and_grads(name)
    assert ran, "the backend's forward did not run"
    assert ours_loss == pytest.approx(eager_loss, rel=1e-5)
    assert ours.keys() == eager.keys() and any("experts" in n for n in ours)
    for n in eager:
        np.testing.assert_allclose(ours[n].numpy(), eager[n].numpy(), rtol=1e-4, atol=1e-5, err_msg=n)


def test_the_op_compiles_in_one_graph():
    """torch.compile(fullgraph=True) traces the experts as one registered op (its fake
    function gives the shape; nothing goes through NumPy while tracing), the compiled model
    gives eager's logits, and further calls of the same shape do not recompile."""
    name = moe_tf.register(backend="cpu")
    model = tiny_model("qwen3_moe")
    model.set_experts_implementation(name)
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(8))
    torch._dynamo.reset()
    counts = []

    def backend(gm, example_inputs):
        op = torch.ops.moe_swift.experts
        counts.append(sum(1 for node in gm.graph.nodes if node.target in (op, op.default)))
        return gm.forward

    compiled = torch.compile(model, fullgraph=True, backend=backend)
    with torch.no_grad():
        first = compiled(ids).logits
        second = compiled(ids).logits
        model.set_experts_implementation("eager")
        eager = model(ids).logits
    assert counts == [model.config.num_hidden_layers], counts
    np.testing.assert_allclose(first.numpy(), eager.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(second.numpy(), first.numpy())


def test_a_compiled_training_step_has_eager_gradients():
    """torch.compile(fullgraph=True) of forward and loss, then backward: the backward op is
    recorded as one call, and the gradients are eager's."""
    name = moe_tf.register(backend="cpu")
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))

    def loss_and_grads(implementation, compile):
        model = tiny_model("qwen3_moe").train()
        model.set_experts_implementation(implementation)
        step = (lambda i: model(i, labels=i).loss)
        if compile:
            torch._dynamo.reset()
            step = torch.compile(step, fullgraph=True, backend="aot_eager")
        loss = step(ids)
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    eager_loss, eager = loss_and_grads("eager", False)
    ours_loss, ours = loss_and_grads(name, True)
    assert ours_loss == pytest.approx(eager_loss, rel=1e-5)
    assert ours.keys() == eager.keys()
    for n in eager:
        np.testing.assert_allclose(ours[n].numpy(), eager[n].numpy(), rtol=1e-4, atol=1e-5, err_msg=n)


def test_the_op_passes_torch_opcheck():
    """torch.library.opcheck: the schema, the fake function and the autograd registration
    agree with what the op does."""
    name = moe_tf.register(backend="cpu")
    model = tiny_model("mixtral")
    model.set_experts_implementation(name)
    experts = next(m for m in model.modules() if type(m).__name__.endswith("Experts"))
    T, H, k = 5, model.config.hidden_size, model.config.num_experts_per_tok
    g = torch.Generator().manual_seed(9)
    hidden = torch.randn(T, H, generator=g)
    index = torch.stack([torch.randperm(model.config.num_local_experts, generator=g)[:k] for _ in range(T)])
    weights = torch.rand(T, k, generator=g)
    key = moe_tf._module_key(experts)
    args = (hidden, index, weights, list(experts.parameters(recurse=False)), key, "cpu", -1, "none")
    torch.library.opcheck(torch.ops.moe_swift.experts.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_a_weight_changed_in_place_is_seen():
    """An optimizer step changes the parameters in place: the next no_grad call rebuilds the
    layer instead of running the old weights."""
    name = moe_tf.register(backend="cpu")
    model = tiny_model("qwen3_moe")
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(5))
    model.set_experts_implementation(name)
    with torch.no_grad():
        model(ids)
        for n, p in model.named_parameters():
            if "experts" in n:
                p.mul_(1.5)
        ours = model(ids).logits
        model.set_experts_implementation("eager")
        eager = model(ids).logits
    np.testing.assert_allclose(ours.numpy(), eager.numpy(), rtol=1e-4, atol=1e-4)


def test_models_deep_copy_and_pickle():
    import copy
    import pickle

    name = moe_tf.register(backend="cpu")
    model = tiny_model("mixtral")
    model.set_experts_implementation(name)
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        before = model(ids).logits
        for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert not any(moe_tf.layer_of(m) is not None for m in clone.modules())
            np.testing.assert_array_equal(clone(ids).logits.numpy(), before.numpy())
            assert any(moe_tf.layer_of(m) is not None for m in clone.modules())


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_the_expert_weights_are_held_once(family):
    """After the first forward each experts module's matrices live in one page-aligned
    buffer that its layer reads in place: the layer then needs no memory of its own for
    them (a memory_limit far below their bytes does not stop it), while a layer built from
    copies of them does. gpt-oss's transposed, interleaved layout is the counted exception:
    its layer copies."""
    name = moe_tf.register(backend="cpu")
    model = tiny_model(family)
    model.set_experts_implementation(name)
    ids = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(ids).logits
        model.set_experts_implementation("eager")
        eager = model(ids).logits
    np.testing.assert_allclose(before.numpy(), eager.numpy(), rtol=1e-4, atol=1e-4)
    modules = [m for m in model.modules() if moe_tf.layer_of(m) is not None]
    assert modules
    for module in modules:
        matrices = [p for n in moe_tf._IN_PLACE if (p := getattr(module, n, None)) is not None]
        nbytes = sum(p.numel() * p.element_size() for p in matrices)
        top_k = model.config.num_experts_per_tok
        buffer = moe_tf._BUFFERS.get(module)
        copies_needed = pytest.raises(MemoryError, match="copies of the weights")
        if family == "gpt_oss":
            assert buffer is None
            with copies_needed:
                moe_tf.layer_from_module(module, top_k=top_k, backend="cpu", memory_limit=nbytes // 4)
            continue
        start = buffer.data_ptr()
        assert all(start <= p.data_ptr() < start + buffer.numel() for p in matrices)
        moe_tf.layer_from_module(module, top_k=top_k, backend="cpu", weight_memory=buffer,
                                 memory_limit=nbytes // 4).close()
        with copies_needed:
            moe_tf.layer_from_module(module, top_k=top_k, backend="cpu", memory_limit=nbytes // 4)
    # The parameters stay the model's own: an in-place change shows in eager and in ours.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "experts" in n:
                p.mul_(0.5)
        eager = model(ids).logits
        model.set_experts_implementation(name)
        ours = model(ids).logits
    np.testing.assert_allclose(ours.numpy(), eager.numpy(), rtol=1e-4, atol=1e-4)
    assert not np.allclose(ours.numpy(), before.numpy(), atol=1e-3)


def test_the_op_converts_with_torch_and_falls_back_for_the_unusual():
    """The op's own conversion (torch ops, then the library on the addresses) gives what
    MoELayer.experts gives, in every activation dtype; inputs it does not take as they are
    (float64, ids beyond int32) go through experts(), whose checks and messages apply."""
    import moe_swift

    E, H, I, k = 4, 64, 32, 2
    rng = np.random.default_rng(0)
    layer = moe_swift.MoELayer(rng.standard_normal((E, H), dtype=np.float32), rng.standard_normal((E, I, H), dtype=np.float32),
                               rng.standard_normal((E, I, H), dtype=np.float32), rng.standard_normal((E, H, I), dtype=np.float32),
                               top_k=k, backend="cpu")
    ids = torch.tensor([[0, 3], [2, 1], [1, 0]])
    weights = torch.tensor([[0.7, 0.3], [0.5, 0.5], [0.9, 0.1]])
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        x = torch.randn(3, H).to(dtype)
        w = weights.to(dtype if dtype != torch.float64 else torch.float32)
        got, want = moe_tf._run(layer, x, ids, w), layer.experts(x, ids, w)
        assert got.dtype == want.dtype and torch.equal(got, want), dtype
    with pytest.raises(ValueError, match=r"ids\[0, 0\] = 4294967296 is not an expert id \(0\.\.<4\)"):
        moe_tf._run(layer, torch.randn(3, H), ids + 2**32, weights)
    x = torch.randn(3, H)
    assert torch.equal(moe_tf._run(layer, x, ids.to(torch.int32), weights), layer.experts(x, ids, weights))
    assert torch.equal(moe_tf._run(layer, x.t().contiguous().t(), ids, weights), layer.experts(x, ids, weights))
    with pytest.raises(ValueError, match=r"is not an expert id \(0\.\.<4\)"):
        moe_tf._run(layer, torch.randn(3, H), ids + 4, weights)
