"""Concurrent calls give the sequential results, and the GIL is released while computing."""

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

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


_POOL_CHILD = """
import os, sys, time
import numpy as np
import moe_swift

E, H, I = 8, 512, 256
rng = np.random.default_rng(0)
layer = moe_swift.MoELayer(rng.standard_normal((E, H), dtype=np.float32), rng.standard_normal((E, I, H), dtype=np.float32),
                           rng.standard_normal((E, I, H), dtype=np.float32), rng.standard_normal((E, H, I), dtype=np.float32),
                           top_k=2, backend="cpu")
x = rng.standard_normal((64, H), dtype=np.float32)
y = layer(x)

def workers():
    # The pool's threads (named moe_swift-cpu) and how many are on a CPU or waiting for one.
    states = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            if f.read().strip() != "moe_swift-cpu":
                continue
        with open(f"/proc/self/task/{tid}/stat") as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
    return len(states), sum(s == "R" for s in states)

time.sleep(0.05)  # after the call: the host's own time
# Ten looks 10 ms apart: on a loaded machine one look may catch a sleeping worker runnable
# on its way to sleep, or a spinning one descheduled (its state is then still R).
looks = []
for _ in range(10):
    looks.append(workers())
    time.sleep(0.01)
print(looks[0][0], min(r for _, r in looks), max(r for _, r in looks), float(np.abs(y).sum()))
"""


def _pool_child(**env):
    import subprocess

    out = subprocess.run([sys.executable, "-c", _POOL_CHILD], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, **env))
    assert out.returncode == 0, out.stderr[-2000:]
    workers, fewest_running, most_running, total = out.stdout.split()
    return int(workers), int(fewest_running), int(most_running), total


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="the worker pool: Linux with 2 cores or more")
def test_worker_pool_knobs_and_sleeping_after_a_call():
    """The CPU backend's workers sleep once a call has returned (the host's own threads get
    the cores; MOE_CPU_SPIN_US=N keeps them spinning N µs first), and MOE_CPU_THREADS sets
    how many threads a call uses; the results never depend on either."""
    workers, fewest_running, _, total = _pool_child()
    assert workers == min(len(os.sched_getaffinity(0)), 256) - 1
    assert fewest_running == 0, "a worker still spins 50-150 ms after the call"
    _, _, spinning, spun_total = _pool_child(MOE_CPU_SPIN_US="5000000")
    assert spinning >= 1 and spun_total == total, "no worker spins after the call with MOE_CPU_SPIN_US"
    alone, _, _, alone_total = _pool_child(MOE_CPU_THREADS="1")
    assert alone == 0 and alone_total == total


_AFFINITY_CHILD = """
import os, time
import numpy as np
import moe_swift

rng = np.random.default_rng(0)
E, H, I = 8, 256, 128
layer = moe_swift.MoELayer(rng.standard_normal((E, H), dtype=np.float32), rng.standard_normal((E, I, H), dtype=np.float32),
                           rng.standard_normal((E, I, H), dtype=np.float32), rng.standard_normal((E, H, I), dtype=np.float32),
                           top_k=2, backend="cpu")
x = rng.standard_normal((64, H), dtype=np.float32)
first = layer(x)
same = True
for _ in range(40):
    time.sleep(0.005)  # the workers fall asleep; the next call wakes them
    same &= bool(np.array_equal(layer(x), first))

def allowed(tid):
    with open(f"/proc/self/task/{tid}/status") as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith("Cpus_allowed_list"))

workers = [tid for tid in os.listdir("/proc/self/task")
           if open(f"/proc/self/task/{tid}/comm").read().strip() == "moe_swift-cpu"]
print(len(workers), allowed(os.getpid()), *sorted({allowed(tid) for tid in workers}), same)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="the worker pool: Linux with 2 cores or more")
def test_woken_workers_keep_the_process_cpus():
    """A worker woken onto its caller's core moves itself off it by narrowing its affinity
    for a moment; afterwards every worker may run on every CPU the process may, as before,
    and the results are unchanged."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", _AFFINITY_CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    count, process, *workers, same = out.stdout.split()
    assert int(count) == min(len(os.sched_getaffinity(0)), 256) - 1
    assert workers == [process], f"workers allowed on {workers}, the process on {process}"
    assert same == "True"
