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
