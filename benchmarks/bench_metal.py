#!/usr/bin/env python3
"""The Metal backend's first measurements, and a model of them for when there is no Mac.

    python benchmarks/bench_metal.py                   # "metal" if available, else "softmetal"; small shapes
    python benchmarks/bench_metal.py --backend metal --shape qwen3-30b-a3b --format q4 \
        --tokens 1,4,64,512 --layers 8                 # latency, device counters, run_layers vs separate calls
    python benchmarks/bench_metal.py --shape qwen3-30b-a3b --formats f32,bf16,q8,q4,mxfp4 \
        --tokens 1,4,512                               # one layer per weight format against MLX on the GPU
    python benchmarks/bench_metal.py --model           # the roofline model of Apple GPUs (nothing measured)

Latency mode: per token count, the forward latency (best of --repeats) and what it did on the
device (moe_swift.last_stats: dispatches, command buffers, waits, allocations), then a
stack of --layers layers as separate forwards vs one run_layers call - against "cpu".

--formats mode: for each weight format, ours on --backend and MLX (mlx-lm's SwitchGLU:
mx.gather_mm, or mx.gather_qmm on the same quantized arrays; moe_bench.peers.MLXLayer)
on MLX's GPU device (--mlx-device) where mlx is installed, same weights and inputs; median of --repeats
calls, each on a fresh input; the largest difference between the two outputs relative to
max|ours| (bf16: MLX computes in bfloat16, so expect ~1e-2).

--model: moe_bench.metal_model - per dispatch of one forward (decode T = 1, prefill
T = 512) bytes, FLOPs and a roofline time on M2 / M3 / M4 Max, with its assumptions.

Every mode prints a table and writes JSON (--json; default benchmarks/results/bench_metal.json,
bench_metal_formats.json or metal_model.json). On Linux "softmetal" is a CPU emulation of the
GPU, far slower than "cpu": its times say nothing about a GPU, the device counters do.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def best_of(fn, repeats):
    fn()  # warm-up: the first forward of a shape allocates its buffers
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def write_json(path, payload):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str))
    print(f"wrote {path}")


def layer_shape(a):
    """The benchmarked shape: --shape, or the small default sizes with Qwen3's family options."""
    from moe_bench.shapes import SHAPES
    if a.shape:
        s = SHAPES[a.shape]
        return replace(s, shared=a.shared or s.shared), a.experts or s.experts
    s = replace(SHAPES["qwen3-30b-a3b"], name="small", hidden=a.hidden, inter=a.inter, top_k=a.top_k, shared=a.shared)
    return s, a.experts or 16


def weights(a, fmt):
    from moe_bench.shapes import Weights
    from moe_bench.weightformats import FormatWeights
    shape, E = layer_shape(a)
    return FormatWeights(Weights(shape, E), fmt)


def environment(backend):
    import moe_swift
    return dict(backend=backend, available=moe_swift.available_backends(), machine=platform.machine(),
                system=platform.platform(), python=platform.python_version(), numpy=np.__version__,
                time=time.strftime("%Y-%m-%d %H:%M:%S %Z"))


def latency(a):
    import moe_swift
    fw = weights(a, a.format)
    w = fw.master
    H, I, E, k = w.H, w.I, w.E, w.k
    rng = np.random.default_rng(0)
    print(f"backend {a.backend} (available: {moe_swift.available_backends()}); {w.shape.name} H={H} I={I} E={E} "
          f"k={k} shared={w.shape.shared} format {a.format}, {a.layers} layers (the same weights, one copy each)")
    kwargs = fw.layer_kwargs()
    layers = {name: [moe_swift.MoELayer(**kwargs, backend=name) for _ in range(a.layers)] for name in (a.backend, "cpu")}
    rows = []
    for T in [int(t) for t in a.tokens.split(",")]:
        x = rng.standard_normal((T, H)).astype(np.float32)
        for name, ls in layers.items():
            one = best_of(lambda: ls[0](x), a.repeats)
            stats = moe_swift.last_stats()
            loop = best_of(lambda: [l(x, residual=x) for l in ls], a.repeats)
            stacked = best_of(lambda: moe_swift.run_layers(ls, x), a.repeats)
            s2 = moe_swift.last_stats()
            rows.append(dict(tokens=T, backend=name, forward_ms=one * 1e3, stats=dict(stats),
                             separate_ms=loop * 1e3, run_layers_ms=stacked * 1e3, run_layers_stats=dict(s2)))
            print(f"T={T:5d} {name:9s} forward {one * 1e3:9.3f} ms  [dispatches {stats['dispatches']}, "
                  f"command buffers {stats['command_buffers']}, waits {stats['cpu_waits']}, "
                  f"allocations {stats['allocations']}]   {a.layers} layers: separate {loop * 1e3:9.3f} ms, "
                  f"run_layers {stacked * 1e3:9.3f} ms [dispatches {s2['dispatches']}, "
                  f"command buffers {s2['command_buffers']}, waits {s2['cpu_waits']}]")
    for ls in layers.values():
        for l in ls:
            l.close()
    write_json(a.json or RESULTS / "bench_metal.json",
               dict(mode="latency", env=environment(a.backend), shape=w.shape.name, H=H, I=I, E=E, k=k,
                    format=a.format, layers=a.layers, repeats=a.repeats, rows=rows))


def median_ms(fn, xs):
    fn(xs[0])  # warm-up
    times = []
    for x in xs[1:]:
        t = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def against_mlx(a):
    import moe_swift
    from moe_bench import peers
    mlx_status = peers.status("mlx")
    rows = []
    print(f"backend {a.backend}; MLX on its {a.mlx_device.upper()} device: "
          f"{mlx_status or peers.info('mlx').replace(' on the CPU device', '')}")
    print(f"{'format':7s} {'T':>5s} {'ours ms':>10s} {'GB/s':>7s} {'mlx ms':>10s} {'mlx/ours':>9s} {'max diff':>9s}")
    tokens = [int(t) for t in a.tokens.split(",")]
    for fmt in a.formats.split(","):
        fw = weights(a, fmt)
        w = fw.master
        ours = moe_swift.MoELayer(**fw.layer_kwargs(), backend=a.backend)
        mlx, why = None, mlx_status
        if mlx_status is None:
            try:
                mlx = peers.MLXLayer(w, fw if fmt != "f32" else None, device=a.mlx_device)
            except Exception as exc:  # noqa: BLE001 - reported in the table
                why = f"{exc.__class__.__name__}: {exc}"
        rng = np.random.default_rng(1)
        for T in tokens:
            xs = [rng.standard_normal((T, w.H)).astype(np.float32) for _ in range(a.repeats + 1)]
            t_ours = median_ms(ours, xs)
            ids, _ = ours.route(xs[-1])
            distinct = len(np.unique(ids))
            gbs = (distinct * fw.expert_bytes() + w.fixed_bytes()) / (t_ours * 1e-3) / 1e9
            row = dict(format=fmt, tokens=T, ours_ms=t_ours, ours_gbs=gbs, distinct_experts=distinct,
                       expert_bytes=fw.expert_bytes())
            if mlx is not None:
                row["mlx_ms"] = median_ms(mlx, xs)
                y, y_mlx = ours(xs[-1]), mlx(xs[-1])
                row["max_diff_rel"] = float(np.abs(y - y_mlx).max() / max(np.abs(y).max(), 1e-30))
            else:
                row["mlx"] = why
            rows.append(row)
            mlx_cells = (f"{row['mlx_ms']:10.3f} {row['mlx_ms'] / t_ours:8.2f}x {row['max_diff_rel']:9.1e}"
                         if mlx is not None else f"{'-':>10s} {'-':>9s} {'-':>9s}")
            print(f"{fmt:7s} {T:5d} {t_ours:10.3f} {gbs:7.1f} {mlx_cells}")
        ours.close()
        if mlx is not None:
            mlx.close()
        elif why != mlx_status:
            print(f"        mlx, {fmt}: {why}")
        fw.close()
    if mlx_status is not None:
        print(f"mlx: {mlx_status}")
    shape, E = layer_shape(a)
    write_json(a.json or RESULTS / "bench_metal_formats.json",
               dict(mode="formats", env=environment(a.backend), shape=shape.name, H=shape.hidden, I=shape.inter,
                    E=E, k=shape.top_k, repeats=a.repeats, mlx_device=a.mlx_device,
                    mlx=mlx_status or peers.info("mlx"), rows=rows))


def modelled(a):
    from moe_bench import metal_model as mm
    shape, E = layer_shape(a) if a.shape else (None, None)
    s = mm.QWEN3 if shape is None else mm.LayerShape(shape.hidden, shape.inter, E, shape.top_k, shape.name)
    tokens = tuple(int(t) for t in a.tokens.split(",")) if a.tokens_given else (1, 512)
    m = mm.model(s, tokens=tokens, formats=tuple(a.formats.split(",")) if a.formats else tuple(mm.FORMATS),
                 router_fmt=a.router_format, stack_layers=a.stack_layers)
    print(mm.report(m))
    write_json(a.json or RESULTS / "metal_model.json", dict(mode="model", **m))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default=None, help="default: metal if available, else softmetal")
    ap.add_argument("--shape", default=None, help="a shape of moe_bench (e.g. qwen3-30b-a3b); overrides the sizes")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=128)
    ap.add_argument("--experts", type=int, default=0, help="default: the shape's (16 for the small default)")
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--shared", type=int, default=0, help="shared expert width (0: none or the shape's)")
    ap.add_argument("--tokens", default=None, help="default 1,4,64 (--model: 1,512)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--format", default="f32", help="latency mode: the experts' weight format")
    ap.add_argument("--formats", default=None, help="f32,bf16,q8,q4,mxfp4: one layer per format against MLX "
                                                    "(with --model: the formats modelled)")
    ap.add_argument("--mlx-device", default="gpu", choices=("gpu", "cpu"), help="--formats: MLX's device")
    ap.add_argument("--model", action="store_true", help="print the roofline model of Apple GPUs instead of measuring")
    ap.add_argument("--router-format", default="f32", help="--model: the router's format")
    ap.add_argument("--stack-layers", type=int, default=48, help="--model: layers of one run_layers call")
    ap.add_argument("--json", default=None, help="where to write the results")
    a = ap.parse_args(argv)
    a.tokens_given = a.tokens is not None
    a.tokens = a.tokens or "1,4,64"
    if a.model:
        return modelled(a)
    import moe_swift
    a.backend = a.backend or ("metal" if "metal" in moe_swift.available_backends() else "softmetal")
    return against_mlx(a) if a.formats else latency(a)


if __name__ == "__main__":
    main()
