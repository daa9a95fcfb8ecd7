"""Progress of long work (moe_swift.progress): a bar or line on a terminal, log records
otherwise, nothing when silenced or before the delay; from_pretrained and the integrations'
layer building report through it. The delay is set here rather than waited for, so no test
depends on how long anything takes."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

import pytest

import moe_swift
from moe_swift import progress as progress_module
from moe_swift.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_checkpoints as fixtures  # noqa: E402


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def quiet_by_default(monkeypatch, caplog):
    monkeypatch.delenv(progress_module.ENVIRONMENT, raising=False)
    # Work "shorter than the delay", whatever this machine's speed.
    monkeypatch.setattr(progress_module, "DELAY", float("inf"))
    caplog.set_level(logging.INFO, logger="moe_swift")


def messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "moe_swift"]


def run(steps=3, total=3, stream=None, **kwargs):
    with Progress("work", total, stream=io.StringIO() if stream is None else stream, **kwargs) as bar:
        for _ in range(steps):
            bar.update()


def test_short_work_shows_nothing(caplog):
    stream = Terminal()
    run(stream=stream)
    run()
    assert stream.getvalue() == "" and messages(caplog) == []


def test_long_work_is_logged_without_a_terminal(monkeypatch, caplog):
    monkeypatch.setattr(progress_module, "DELAY", 0.0)
    run()
    logged = messages(caplog)
    assert logged[0].startswith("work: 1/3 layers after") and logged[-1].startswith("work: done, 3 layers in")


def test_own_line_on_a_terminal_without_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm fails
    stream = Terminal()
    run(stream=stream, progress=True)
    assert stream.getvalue().startswith("\rwork: 1/3 layers, ") and "\rwork: 3/3 layers, " in stream.getvalue()
    assert stream.getvalue().endswith("\n")


def test_tqdm_bar_on_a_terminal():
    pytest.importorskip("tqdm")
    stream = Terminal()
    run(steps=4, total=4, stream=stream, progress=True)
    assert "work: 100%" in stream.getvalue() and "4/4" in stream.getvalue()


def test_silenced_by_argument_and_environment(monkeypatch, caplog):
    monkeypatch.setattr(progress_module, "DELAY", 0.0)
    stream = Terminal()
    run(stream=stream, progress=False)
    monkeypatch.setenv(progress_module.ENVIRONMENT, "0")
    run(stream=stream)
    assert stream.getvalue() == "" and messages(caplog) == []
    monkeypatch.setattr(progress_module, "DELAY", float("inf"))
    monkeypatch.setenv(progress_module.ENVIRONMENT, "1")
    run()
    assert len(messages(caplog)) == 2


def test_bad_settings_are_clear_errors(monkeypatch):
    with pytest.raises(TypeError, match="progress must be True, False or None"):
        run(progress="yes")
    monkeypatch.setenv(progress_module.ENVIRONMENT, "loud")
    with pytest.raises(ValueError, match="MOE_SWIFT_PROGRESS must be one of"):
        run()


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    return fixtures.make("deepseek_v3", tmp_path_factory.mktemp("progress") / "deepseek_v3")


def test_from_pretrained(deepseek, caplog, capsys):
    moe_swift.from_pretrained(deepseek, backend="cpu")
    moe_swift.from_pretrained(deepseek, backend="cpu", progress=False)
    assert messages(caplog) == [] and capsys.readouterr() == ("", "")
    layers = moe_swift.from_pretrained(deepseek, backend="cpu", progress=True)
    logged = messages(caplog)
    assert len(layers) == 2 and len(logged) == 2
    assert logged[0].startswith(f"moe_swift: loading the MoE layers of {deepseek}: 1/2 layers after")
    assert logged[1].startswith(f"moe_swift: loading the MoE layers of {deepseek}: done, 2 layers in")


def test_transformers_first_forward(caplog):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_integrations import tiny_model
    from moe_swift.integrations import transformers as moe_tf

    model = tiny_model("qwen3_moe")
    moe_tf.reset(model)  # a count another test left open ends here
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        model.set_experts_implementation(moe_tf.register("moe_swift_quiet", backend="cpu", progress=False))
        model(ids)
        model(ids)
        assert messages(caplog) == []
        moe_tf.reset(model)
        model.set_experts_implementation(moe_tf.register("moe_swift_shown", backend="cpu", progress=True))
        model(ids)
        assert messages(caplog)[0].startswith("moe_swift: building the experts layers: 1 layer after")
        model(ids)  # finds its layers built: the count ends
    experts = sum(1 for m in model.modules() if moe_tf.layer_of(m) is not None)
    assert experts >= 2 and messages(caplog)[-1].startswith(f"moe_swift: building the experts layers: done, {experts} layers in")
    moe_tf.reset(model)


def test_mlx_lm_patch(caplog):
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    from test_integration_mlx import tiny
    import moe_swift.integrations.mlx_lm as moe_mlx

    assert moe_mlx.patch(tiny("qwen3_moe"), backend="cpu", progress=False) == 2
    assert messages(caplog) == []
    assert moe_mlx.patch(tiny("qwen3_moe"), backend="cpu", progress=True) == 2
    assert [m.split(" after")[0].split(" in ")[0] for m in messages(caplog)] == [
        "moe_swift: patching the SwitchGLU layers: 1/2 layers",
        "moe_swift: patching the SwitchGLU layers: done, 2 layers"]


def test_a_long_native_call_is_announced_while_it_runs(monkeypatch, caplog):
    """Waiting: the first line is written while the call is still running (a timer thread:
    the call releases the GIL), the second when it ends; a short call or progress=False
    says nothing; without a terminal, log records."""
    import threading

    from moe_swift.progress import Waiting

    monkeypatch.setattr(progress_module, "DELAY", 0.05)
    stream, inside = Terminal(), threading.Event()
    with Waiting("moe_swift: compiling", stream=stream):
        inside.wait(2.0)  # released by nothing: the timer writes meanwhile
        written_during = stream.getvalue()
    assert written_during == "moe_swift: compiling...\n"
    assert stream.getvalue().splitlines()[1].startswith("moe_swift: compiling: done in ")
    for progress in (False, None):
        monkeypatch.setattr(progress_module, "DELAY", float("inf") if progress is None else 0.0)
        quiet = Terminal()
        with Waiting("x", stream=quiet, progress=progress):
            inside.wait(0.1)
        assert quiet.getvalue() == ""
    monkeypatch.setattr(progress_module, "DELAY", 0.0)
    with Waiting("moe_swift: logged", stream=io.StringIO()):
        inside.wait(0.2)
    assert messages(caplog)[0] == "moe_swift: logged..." and "done in" in messages(caplog)[1]


def test_softmetal_layers_say_they_compile(monkeypatch):
    """Creating a softmetal layer (MoELayer and from_pretrained) goes through that
    announcement, and a cpu layer does not."""
    from moe_swift import layer as layer_module

    seen = []
    original = layer_module.creating
    monkeypatch.setattr(layer_module, "creating", lambda code, progress=None: seen.append(code) or original(code))
    import numpy as np
    rng = np.random.default_rng(0)
    w = lambda *s: rng.standard_normal(s, dtype=np.float32) * 0.02  # noqa: E731
    from moe_swift import checkpoint as checkpoint_module
    monkeypatch.setattr(checkpoint_module, "creating", layer_module.creating)
    backends = [b for b in ("cpu", "softmetal") if b in moe_swift.available_backends()]
    folder = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "olmoe"
    for backend in backends:
        moe_swift.MoELayer(w(4, 64), w(4, 32, 64), w(4, 32, 64), w(4, 64, 32), top_k=2, backend=backend).close()
        moe_swift.from_pretrained(folder, layer=0, backend=backend).close()
    assert seen == [layer_module.BACKENDS[b] for b in backends for _ in range(2)]
    assert layer_module.creating(layer_module.BACKENDS["softmetal"]).what == layer_module.SOFTMETAL_COMPILE
    assert layer_module.creating(layer_module.BACKENDS["cpu"]).mode is False
