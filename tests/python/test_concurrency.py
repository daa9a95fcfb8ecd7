"""Concurrent calls give the sequential results, and the GIL is released while computing."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import moe_swift
from families import make_layer_args


def test_concurrent_calls_equal_sequential():
    args = make_layer_args("qwen2_moe", H=96, I=64, E=16, k=4, seed=11)
    rng = np.random.default_rng(12)
    inputs = [rng.standard_normal((int(t), 96)).astype(np.float32) for t in rng.integers(1, 70, size=24)]
    with moe_swift.MoELayer(**args) as layer:
        sequential = [layer(x) for x in inputs]
        routes = [layer.route(x) for x in inputs]
        with ThreadPoolExecutor(max_workers=6) as pool:
            concurrent = list(pool.map(layer, inputs))
            concurrent_routes = list(pool.map(layer.route, inputs))
    for a, b in zip(sequential, concurrent):
        np.testing.assert_array_equal(a, b)
    for (i0, w0), (i1, w1) in zip(routes, concurrent_routes):
        np.testing.assert_array_equal(i0, i1)
        np.testing.assert_array_equal(w0, w1)


def test_close_while_other_threads_compute():
    args = make_layer_args("mixtral", H=64, I=128, E=8, k=2, seed=13)
    x = np.random.default_rng(14).standard_normal((64, 64)).astype(np.float32)
    layer = moe_swift.MoELayer(**args)
    expected = layer(x)
    outcomes = []

    def worker():
        # Runs until it sees the layer closed; every result before that is complete.
        for _ in range(100_000):
            try:
                np.testing.assert_array_equal(layer(x), expected)
            except ValueError as exc:
                assert "closed" in str(exc)
                outcomes.append("closed")
                return
        outcomes.append("never closed")

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    layer.close()
    for t in threads:
        t.join()
    assert outcomes == ["closed"] * 4


def test_gil_is_released_during_a_call():
    # One long forward in a worker thread; the main thread keeps running Python. Were the
    # GIL held, the main thread would stall for the whole call.
    args = make_layer_args("mixtral", H=512, I=1024, E=8, k=8, seed=15)
    x = np.random.default_rng(16).standard_normal((512, 512)).astype(np.float32)
    with moe_swift.MoELayer(**args) as layer:
        layer(x)
        start = time.perf_counter()
        layer(x)
        calls = max(1, int(0.4 / (time.perf_counter() - start)))
        worker = threading.Thread(target=lambda: [layer(x) for _ in range(calls)])
        stamps = []
        start = time.perf_counter()
        worker.start()
        while worker.is_alive():
            stamps.append(time.perf_counter())
        worker.join()
        duration = time.perf_counter() - start
    gaps = np.diff(stamps) if len(stamps) > 1 else np.array([np.inf])
    assert len(stamps) > 100 and gaps.max() < duration / 2, (len(stamps), gaps.max(), duration)
