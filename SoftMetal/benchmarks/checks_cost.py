"""What each of SoftMetal's checks costs, against no checks and against all of them
(`checks="all"`): the MoE layer's forwards (decode, T = 1, and prefill, T = 9, of a
qwen2_moe layer with a shared expert, float32 and q4) and a few kernels of the corpus
(ggml's rms_norm, a simdgroup-matrix GEMM, a fenced cross-threadgroup hand-off).

    python SoftMetal/benchmarks/checks_cost.py  # prints a table, writes SoftMetal/benchmarks/results/checks_cost.json

Best of a few runs after a warm-up (the warm-up compiles the memory check's instrumented
build); numbers are for this machine at the time of the run. A forward that a check
reports is shown as "reported" (the decode router before its hand-off was fenced).

One run (2 cores shared with five other jobs' builds and tests, so the ratios are rough;
the layer at T = 1 is reported by the memory model check: its router's hand-off is not
fenced yet), made when the permuted rerun was called check_races (it is check_order now;
check_races, the race detector, was not in that run):

| what | none | check_order | run-ahead | check_memory | all |
| --- | --- | --- | --- | --- | --- |
| 64x512x512 simdgroup-matrix GEMM | 92.4 ms | 502.7 ms (5.4x) | 531.7 ms (5.8x) | 1169.2 ms (12.6x) | 1982.9 ms (21.5x) |
| ggml kernel_rms_norm_f32, 5 rows of 256 | 0.7 ms | 12.8 ms (19.0x) | 12.4 ms (18.4x) | 3.3 ms (4.8x) | 14.6 ms (21.6x) |
| fenced hand-off, 4 threadgroups | 0.6 ms | 0.5 ms (0.8x) | 0.6 ms (0.9x) | 0.8 ms (1.4x) | 0.9 ms (1.5x) |
| layer f32 T=1 | 3.3 ms | 169.1 ms (51.8x) | 211.1 ms (64.7x) | reported | reported |
| layer f32 T=9 | 19.4 ms | 262.1 ms (13.5x) | 268.6 ms (13.9x) | 244.3 ms (12.6x) | 376.7 ms (19.4x) |
| layer q4 T=1 | 3.0 ms | 52.0 ms (17.5x) | 45.8 ms (15.4x) | reported | reported |
| layer q4 T=9 | 16.1 ms | 82.9 ms (5.2x) | 90.1 ms (5.6x) | 304.7 ms (19.0x) | 413.6 ms (25.8x) |

Small dispatches pay mostly fixed costs (copies of the bound buffers for the reruns, the
symbolizer only on a finding); large ones the per-access call of the memory check, which
"all" adds to one run-ahead rerun.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "SoftMetal" / "tests" / "python"), str(ROOT / "tests" / "python")]

from moe_swift import softmetal  # noqa: E402

# The check, as harness arguments and as the environment the layer's Swift side reads.
CONFIGS = {
    "none": ({}, {}),
    "check_order": ({"check_order": True}, {"SOFTMETAL_CHECK_ORDER": "1"}),
    "check_races": ({"check_races": True}, {"SOFTMETAL_CHECK_RACES": "1"}),
    "run-ahead": ({"schedule": "run-ahead"}, {"SOFTMETAL_SCHEDULE": "run-ahead"}),
    "check_memory": ({"check_memory": True}, {"SOFTMETAL_CHECK_MEMORY": "1"}),
    "all": ({"checks": "all"}, {"SOFTMETAL_CHECKS": "all"}),
}
ENV_NAMES = ("SOFTMETAL_CHECK_RACES", "SOFTMETAL_CHECK_ORDER", "SOFTMETAL_SCHEDULE", "SOFTMETAL_CHECK_MEMORY", "SOFTMETAL_CHECKS",
             "SOFTMETAL_STALE_READS")

LAYER = r"""
import json, sys, time
import numpy as np, moe_swift
from families import make_layer_args
from test_formats import FORMATS
out = {}
for fmt in (None, "q4"):
    args = make_layer_args("qwen2_moe", H=64, I=64, E=8, k=2, seed=1, shared=64)
    if fmt:
        for name in ("router_weight", "gate_proj", "up_proj", "down_proj"):
            args[name] = FORMATS[fmt](args[name])
        args["shared_expert"] = {k: (FORMATS[fmt](v) if k != "sigmoid_gate" else v) for k, v in args["shared_expert"].items()}
    x = np.random.default_rng(2).standard_normal((9, 64)).astype(np.float32)
    with moe_swift.MoELayer(**args, backend="softmetal") as layer:
        for T in (1, 9):
            key = f"layer {fmt or 'f32'} T={T}"
            try:
                layer(x[:T])
                times = []
                for _ in range(3):
                    t = time.perf_counter(); layer(x[:T]); times.append(time.perf_counter() - t)
                out[key] = min(times)
            except Exception as e:
                out[key] = "reported"
print(json.dumps(out))
"""


def layer_times(env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "python"), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", LAYER], env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def best(f, repeat=3):
    f()  # warm-up: compiles (the instrumented build too)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def kernel_launchers():
    import softmetal_cost
    import test_softmetal_memory_check as mm
    import test_third_party_kernels as ggml

    gemm = softmetal.compile(softmetal_cost.SOURCE)
    rng = np.random.default_rng(0)
    M, N, K = 64, 512, 512
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    c = np.zeros((M, N), np.float32)
    dims = np.array([M, N, K, 0], np.uint32)
    rms = softmetal.compile(ggml.GGML_METAL.read_text(), include_dirs=ggml.GGML_INCLUDES, defines=ggml.GGML_DEFINES)
    handoff = softmetal.compile(mm.HANDOFF.replace("FENCE", mm.DEVICE_FENCE), metal_version=320)
    x, previous, counter, out = mm._handoff_buffers()

    def run_gemm(**checks):
        gemm.launch("sg_gemm", [a, b, c, dims], threadgroups=(N // 32, M // 8), threads_per_threadgroup=(128,), **checks)

    def run_handoff(**checks):
        handoff.launch("handoff_plain", [x, previous.copy(), counter, out], threadgroups=(mm.GROUPS,),
                       threads_per_threadgroup=(32,), **checks)

    rows = np.random.default_rng(1).standard_normal((5, 256)).astype(np.float32)

    def run_rms(checks=None, **rest):
        if checks == "all":  # _rms_launch takes the single switches
            rest = {"check_memory": True, "schedule": "run-ahead"}
        ggml._rms_launch(rms, x=rows.copy(), **rest)

    return {"64x512x512 simdgroup-matrix GEMM": run_gemm, "ggml kernel_rms_norm_f32, 5 rows of 256": run_rms,
            "fenced hand-off, 4 threadgroups": run_handoff}


def main() -> dict:
    results: dict[str, dict[str, float | str]] = {}
    for name, run in kernel_launchers().items():
        results[name] = {config: best(lambda: run(**args)) for config, (args, _) in CONFIGS.items()}
    layer = {config: layer_times(env) for config, (_, env) in CONFIGS.items()}
    for key in layer["none"]:
        results[key] = {config: layer[config][key] for config in CONFIGS}
    return results


def table(results) -> str:
    head = "| what | " + " | ".join(CONFIGS) + " |\n| --- |" + " --- |" * len(CONFIGS) + "\n"
    rows = []
    for name, times in results.items():
        base = times["none"]
        cells = []
        for config in CONFIGS:
            t = times[config]
            if isinstance(t, str) or isinstance(base, str):
                cells.append(t if isinstance(t, str) else f"{t * 1e3:.1f} ms")
            else:
                cells.append(f"{t * 1e3:.1f} ms" + ("" if config == "none" else f" ({t / base:.1f}x)"))
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return head + "\n".join(rows)


if __name__ == "__main__":
    results = main()
    print(table(results))
    out = HERE / "results" / "checks_cost.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")
