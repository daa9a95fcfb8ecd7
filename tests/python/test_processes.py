"""Process handling: a child forked after the parent ran layers (multiprocessing's fork
start method) runs them too, on every backend, and never hangs."""

import multiprocessing
import sys

import numpy as np
import pytest

import moe_swift
from families import make_layer_args

BACKENDS = [b for b in ("cpu", "softmetal") if b in moe_swift.available_backends()]


def _child(queue, backend, x):
    try:
        args = make_layer_args("mixtral", H=64, I=32, E=8, k=2, seed=0)
        with moe_swift.MoELayer(**args, backend=backend) as layer:
            queue.put(("ok", layer(x), _PARENT_LAYER[backend](x)))
    except Exception as exc:  # reported, not raised in the child
        queue.put(("error", repr(exc), None))


_PARENT_LAYER = {}


@pytest.mark.skipif(sys.platform != "linux", reason="the fork start method")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forked_child_runs_layers(backend):
    args = make_layer_args("mixtral", H=64, I=32, E=8, k=2, seed=0)
    x = np.random.default_rng(1).standard_normal((40, 64)).astype(np.float32)
    _PARENT_LAYER[backend] = moe_swift.MoELayer(**args, backend=backend)
    expected = _PARENT_LAYER[backend](x)  # the parent has run command buffers / worker threads
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child, args=(queue, backend, x))
    child.start()
    child.join(60)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive, "the forked child hung"
    status, new_layer_y, parent_layer_y = queue.get(timeout=5)
    assert status == "ok", new_layer_y
    np.testing.assert_array_equal(new_layer_y, expected)
    np.testing.assert_array_equal(parent_layer_y, expected)
    _PARENT_LAYER.pop(backend).close()


EXIT_WITH_CALLS_IN_FLIGHT = """
import sys, threading, time
import numpy as np
import moe_swift
sys.path.insert(0, {tests!r})
from families import make_layer_args
args = make_layer_args("mixtral", H=1024, I=512, E=8, k=2, seed=0)
layer = moe_swift.MoELayer(**args, backend="cpu")
x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
def loop():
    while True:
        layer(x)
for _ in range(4):
    threading.Thread(target=loop, daemon=True).start()
time.sleep(0.5)
"""


def test_interpreter_exit_while_daemon_threads_are_in_a_call():
    """OpenBLAS's destructor ran under prefill products still in flight: SIGSEGV at exit
    in 8 of 12 runs of this script (128 rows per expert: BLAS)."""
    import pathlib
    import subprocess

    script = EXIT_WITH_CALLS_IN_FLIGHT.format(tests=str(pathlib.Path(__file__).parent))
    for _ in range(6):
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
        assert result.returncode == 0, (result.returncode, result.stderr.decode()[-500:])


MANY_LIVE_LAYERS = """
import gc, os, sys, threading
import numpy as np
import moe_swift
sys.path.insert(0, {tests!r})
from families import make_layer_args
args = make_layer_args("mixtral", H=32, I=16, E=4, k=2, seed=0)
x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
expected = moe_swift.MoELayer(**args, backend="cpu")(x)
layers = []
try:
    for _ in range(2000):
        layer = moe_swift.MoELayer(**args, backend="softmetal")
        layers.append(layer)
    print("no limit")
except MemoryError as e:
    print("MemoryError after", len(layers))
# A forward needs scratch buffers too: at the limit it raises MemoryError as well.
try:
    layers[-1](x)
except MemoryError:
    print("forward MemoryError")
# With most layers freed, the first (guarded buffers) and the last (plain buffers, past the
# guarded part of the budget) compute the same.
layers = [layers[0], layers[-1]]
gc.collect()
np.testing.assert_allclose(layers[-1](x), expected, rtol=1e-5, atol=1e-5)
np.testing.assert_allclose(layers[0](x), expected, rtol=1e-5, atol=1e-5)
del layers, layer
gc.collect()
t = threading.Thread(target=lambda: None)
t.start(); t.join()
np.testing.assert_allclose(moe_swift.MoELayer(**args, backend="softmetal")(x), expected, rtol=1e-5, atol=1e-5)
print("ok")
"""


@pytest.mark.skipif("softmetal" not in moe_swift.available_backends(), reason="SoftMetal is Linux-only")
def test_many_live_softmetal_layers_end_in_memory_error_not_a_hang():
    """Each guarded buffer costs three memory mappings; ~10,000 live layers used to exhaust
    the process's (vm.max_map_count), after which thread creation hung. SoftMetal keeps to
    a budget (SOFTMETAL_MAX_MAPPINGS, here small): guarded buffers first, then plain
    ones, then makeBuffer fails and layer creation raises MemoryError; freeing layers
    gives the mappings back."""
    import os
    import pathlib
    import subprocess

    script = MANY_LIVE_LAYERS.format(tests=str(pathlib.Path(__file__).parent))
    env = dict(os.environ, SOFTMETAL_MAX_MAPPINGS="3000")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.split()
    assert "MemoryError" in result.stdout and lines[-1] == "ok", result.stdout
