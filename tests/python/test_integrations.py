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
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # make the experts matter: random, not the init's near-zero values
        for name, p in model.named_parameters():
            if "experts" in name:
                p.normal_(0, 0.1)
    return model


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_experts_backend_matches_eager(family):
    name = moe_tf.register(backend="cpu")
    model = tiny_model(family)
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.set_experts_implementation("eager")
        eager = model(ids).logits
        eager_tokens = model.generate(ids[:1], max_new_tokens=8, do_sample=False)
        model.set_experts_implementation(name)
        ours = model(ids).logits
        ours_tokens = model.generate(ids[:1], max_new_tokens=8, do_sample=False)
    assert any(m.__dict__.get("_moe_swift_layer") is not None for m in model.modules()), "the backend never ran"
    np.testing.assert_allclose(ours.numpy(), eager.numpy(), rtol=1e-4, atol=1e-4)
    assert ours_tokens.tolist() == eager_tokens.tolist()
    moe_tf.reset(model)


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
    """The README's recipe: importing the module is all it takes before from_pretrained."""
    import moe_swift.integrations.transformers  # noqa: F401  (registers "moe_swift")

    tiny_model("mixtral").save_pretrained(tmp_path)
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))
    eager = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation="eager").eval()
    ours = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation="moe_swift").eval()
    with torch.no_grad():
        np.testing.assert_allclose(ours(ids).logits.numpy(), eager(ids).logits.numpy(), rtol=1e-4, atol=1e-4)
    assert any(m.__dict__.get("_moe_swift_layer") is not None for m in ours.modules())
