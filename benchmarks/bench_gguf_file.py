#!/usr/bin/env python3
"""Our layer against ggml's `mul_mat_id` on a real GGUF file: the MoE layers of a file
(benchmarks/make_gguf_model.py writes a Qwen3-30B-A3B-shaped one in llama.cpp's Q4_K_M
mix) loaded with `moe_swift.from_pretrained`, and ggml's graph on the very blocks read
from the same file (the gguf package's memory-mapped reader), per tensor in the file's
type (Q4_K gate and up; Q6_K or Q4_K down, as Q4_K_M alternates them).

    python benchmarks/make_gguf_model.py /tmp/q4km-8l.gguf --layers 8 --vocab 4096
    python benchmarks/bench_gguf_file.py /tmp/q4km-8l.gguf

ggml is set up as the benchmark's ggml peer is (benchmarks/moe_bench/ggml.py: the
weights in the CPU device's extra buffer types where it takes them, i.e. llama.cpp's
CPU_REPACK, one polling threadpool, here shared by all layers as llama.cpp's is), the
libggml-python wheel's build or, with --ggml-build native, llama.cpp's built for this
machine by benchmarks/native/build_llama_cpp.sh; its
routing is our layer's `route` on the same float32 router, inside the timed call. Ours
runs in each mode of --activations (default both: float32-exact, and 8-bit activations as
ggml's are, column "ours-q8"), all on the cpu backend with one thread per core.

Every expert of every layer runs once before timing (a mapped file's pages fault in on
first touch, as they do once in a decode loop). Each timed call runs the next layer of the
file on a fresh input, cycling through all layers, so that the experts a call reads were
last read a whole pass earlier: from memory, not from the cache (a T = 1 pass over 8 Qwen3-30B-A3B layers reads ~170 MB of experts).
Rounds alternate the order of the two; each round also measures the read bandwidth
(moe_bench.roofline.stream_read: NumPy and the native library's probe over 1 GiB, the
best counts), and GB/s counts the bytes of the distinct experts a call's tokens chose (gate, up
and down in their types) and the router. Times are medians per round; the ratio
(ggml ms / ours ms, above 1: ours is faster) is the median over the rounds of each round's
ratio. The table is printed and written with its raw numbers (JSON) to --out.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # moe_bench, run from a checkout

import moe_swift  # noqa: E402
from moe_bench import ggml, peers, roofline  # noqa: E402
from moe_bench.runner import GGML_SAME_BLOCKS_REL_RMS, loadavg  # noqa: E402


def file_layers(path, wanted):
    """{layer: (router float32 (E, H), (gate, up, down) blocks (E, rows, row bytes), their types)}."""
    import gguf
    reader = gguf.GGUFReader(path)
    by_name = {t.name: t for t in reader.tensors}
    out = {}
    for i in wanted:
        p = f"blk.{i}."
        router = np.asarray(by_name[p + "ffn_gate_inp.weight"].data, np.float32)
        mats = [by_name[p + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down")]
        out[i] = (router, tuple(m.data for m in mats), tuple(m.tensor_type.name for m in mats))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", type=Path, help="a GGUF file of MoE layers (make_gguf_model.py writes one)")
    ap.add_argument("--layers", type=int, default=0, help="use the first N MoE layers (default: all)")
    ap.add_argument("--tokens", default="1,8,512")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", default="1:4,8:2,512:1", help="passes over the layers per round and T")
    ap.add_argument("--probe-mb", type=int, default=1024, help="size of the read-bandwidth probe's buffer")
    ap.add_argument("--ggml-build", choices=["wheel", "native"], default="wheel",
                    help="which ggml is the peer: the libggml-python wheel's (AVX2) or llama.cpp built natively "
                         "(benchmarks/native/build_llama_cpp.sh)")
    ap.add_argument("--activations", default="none,q8",
                    help="ours' activation_quantization values, each timed in the same rounds (ours, ours-q8)")
    ap.add_argument("--out", type=Path, default=HERE / "measurements" / f"{time.strftime('%Y-%m-%d', time.gmtime())}"
                                                                       f"-bench_gguf_file.txt")
    a = ap.parse_args(argv)
    why = ggml.status(a.ggml_build)
    if why:
        raise SystemExit(f"bench_gguf_file.py needs ggml ({a.ggml_build}): {why}")
    if not a.path.is_file():
        raise SystemExit(f"{a.path}: no such file (write one with benchmarks/make_gguf_model.py)")
    tokens = [int(t) for t in a.tokens.split(",")]
    passes = {int(k): int(v) for k, v in (p.split(":") for p in a.passes.split(","))}
    threads = peers.cores()
    log = lambda msg: print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)  # noqa: E731

    modes = a.activations.split(",")
    for mode in modes:
        if mode not in moe_swift.options.ACTIVATION_QUANTIZATIONS:
            ap.error(f"--activations: {mode!r} is not one of {sorted(moe_swift.options.ACTIVATION_QUANTIZATIONS)}")
    ours_by_mode = {}
    for mode in modes:
        t0 = time.perf_counter()
        layers = moe_swift.from_pretrained(a.path, backend="cpu", progress=False, activation_quantization=mode)
        wanted = sorted(layers)[:a.layers] if a.layers else sorted(layers)
        ours_by_mode["ours" if mode == "none" else f"ours-{mode}"] = {i: layers[i] for i in wanted}
        log(f"ours ({mode}): {len(wanted)} layers loaded in {time.perf_counter() - t0:.1f} s")
    ours = next(iter(ours_by_mode.values()))
    blocks = file_layers(a.path, wanted)
    pool = ggml.new_pool(threads, a.ggml_build)
    peer, expert_bytes = {}, {}
    t0 = time.perf_counter()
    for i, (_, mats, types) in blocks.items():
        E, I, H = mats[0].shape[0], mats[0].shape[1], mats[2].shape[1]
        w = SimpleNamespace(H=H, I=I, E=E, k=ours[i].top_k, shared=None, gate_up_bias=None,
                            shape=SimpleNamespace(activation="silu"))
        peer[i] = ggml.GGMLLayer(w, types, ours[i].route, threads, blocks=mats, pool=pool, build=a.ggml_build)
        expert_bytes[i] = sum(m.nbytes for m in mats) / E
    placement = "; ".join(sorted({layer.describe() for layer in peer.values()}))
    log(f"ggml: {len(peer)} layers set up in {time.perf_counter() - t0:.1f} s ({placement})")
    H = blocks[wanted[0]][1][2].shape[1]
    router_bytes = blocks[wanted[0]][0].nbytes

    rng = np.random.default_rng(0)
    n = len(wanted)
    xs = {T: [rng.standard_normal((T, H), dtype=np.float32) for _ in range(n * passes.get(T, 1))] for T in tokens}
    # Bytes a call reads: the distinct experts its tokens chose, and the router.
    read = {T: [len(np.unique(ours[wanted[c % n]].route(x)[0])) * expert_bytes[wanted[c % n]] + router_bytes
                for c, x in enumerate(xs[T])] for T in tokens}
    checks = {}
    for name, layers in ours_by_mode.items():
        for T in tokens:
            x = xs[T][0][:8]
            y, yg = layers[wanted[0]](x), peer[wanted[0]](x)
            checks[f"{name} T={T}"] = e = float(np.sqrt(np.mean((yg - y) ** 2) / np.mean(y ** 2)))
            if not e <= GGML_SAME_BLOCKS_REL_RMS:
                raise SystemExit(f"ggml and {name} disagree on layer {wanted[0]}: relative RMS {e:.3g}")
    log("outputs agree: relative RMS of ggml vs ours " + ", ".join(f"{k} {e:.2e}" for k, e in checks.items()))

    # Every expert of every layer runs once before timing: a mapped file's pages fault in on
    # their first touch (ggml's copies were made at setup), and a decode loop touches every
    # expert early; without this, ours' first rounds time page faults of experts not yet read.
    for layers in ours_by_mode.values():
        for i in wanted:
            layer = layers[i]
            E, k = blocks[i][1][0].shape[0], layer.top_k
            ids = np.arange(E // k * k, dtype=np.int32).reshape(-1, k)
            layer.experts(rng.standard_normal((len(ids), H), dtype=np.float32), ids,
                          np.ones(ids.shape, np.float32))
    log("every expert of every layer run once (its pages touched)")

    probe = np.ones((a.probe_mb << 20) // 8, np.uint64)
    impls = {**ours_by_mode, "ggml": peer}
    times = {(name, T): [] for name in impls for T in tokens}
    gbs = {(name, T): [] for name in impls for T in tokens}
    roofs = []
    for r in range(a.rounds):
        roofs.append(roofline.stream_read(probe, runs=3))
        for T in tokens:
            order = list(impls) if r % 2 == 0 else list(impls)[::-1]
            for name in order:
                layers = impls[name]
                layers[wanted[(r + 1) % n]](xs[T][0])  # warm-up: graphs, threads
                per_call, rates = [], []
                for c, x in enumerate(xs[T]):
                    f = layers[wanted[c % n]]
                    s = time.perf_counter()
                    f(x)
                    dt = time.perf_counter() - s
                    per_call.append(dt)
                    rates.append(read[T][c] / dt / 1e9)
                times[(name, T)].append(float(np.median(per_call)) * 1e3)
                gbs[(name, T)].append(float(np.median(rates)))
        log(f"round {r + 1}/{a.rounds}: read roof {roofs[-1]['best']:.1f} GB/s; "
            + ", ".join(f"T={T} " + " ".join(f"{name} {times[(name, T)][-1]:.2f} ms" for name in impls) for T in tokens))
    roof = max(rr["best"] for rr in roofs)

    types = sorted({"/".join(t) for _, _, t in blocks.values()})
    lines = [f"moe-swift on a GGUF file vs ggml's mul_mat_id on the same blocks ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC)",
             f"  file: {a.path.name}, {a.path.stat().st_size / 1e9:.2f} GB; {n} MoE layers used (E={blocks[wanted[0]][1][0].shape[0]}, "
             f"k={ours[wanted[0]].top_k}, H={H}, I={blocks[wanted[0]][1][0].shape[1]}); expert types (gate/up/down): {', '.join(types)}",
             f"  machine: {platform.machine()}, {threads} cores, ours isa {moe_swift.cpu_instruction_set()}; "
             f"load average at start {loadavg()}",
             f"  ggml: {ggml.info(a.ggml_build)}; layers: {placement}; one threadpool for all layers",
             f"  timing: {a.rounds} rounds; per round and T, the median over {', '.join(f'T={T}: {len(xs[T])}' for T in tokens)} "
             f"calls cycling through the layers (fresh input each); read roof per round: {roofs[-1]['method']} (best {roof:.1f} GB/s)",
             f"  ggml vs ours before timing (relative RMS; ggml rounds activations to 8 bits): "
             + ", ".join(f"{k} {e:.1e}" for k, e in checks.items()), "",
             f"{'T':>4}  " + "  ".join(f"{name + ' ms':>10}  {'GB/s':>5}  {'% roof':>6}" for name in impls)
             + "  " + "  ".join(f"{'ggml/' + name:>12}" for name in ours_by_mode),
             f"{'-' * 4}  " + "  ".join(f"{'-' * 10}  {'-' * 5}  {'-' * 6}" for _ in impls)
             + "  " + "  ".join("-" * 12 for _ in ours_by_mode)]
    rows = []
    for T in tokens:
        row = dict(T=T)
        for name in impls:
            row[name] = dict(ms=float(np.median(times[(name, T)])), GBps=float(np.median(gbs[(name, T)])),
                             ms_rounds=times[(name, T)], GBps_rounds=gbs[(name, T)])
        for name in ours_by_mode:
            row["ratio" if name == "ours" else f"ratio_{name}"] = float(np.median(
                [g / o for g, o in zip(times[("ggml", T)], times[(name, T)])]))
        rows.append(row)
        cells = []
        for name in impls:
            pct = f"{100 * row[name]['GBps'] / roof:5.0f}%" if T <= roofline.DECODE_MAX_T else "     -"
            cells.append(f"{row[name]['ms']:10.2f}  {row[name]['GBps']:5.1f}  {pct}")
        ratios = [row["ratio" if name == "ours" else f"ratio_{name}"] for name in ours_by_mode]
        lines.append(f"{T:>4}  " + "  ".join(cells) + "  " + "  ".join(f"{r:11.2f}x" for r in ratios))
    text = "\n".join(lines)
    print(text)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text + "\n")
    a.out.with_suffix(".json").write_text(json.dumps(dict(
        file=a.path.name, file_bytes=a.path.stat().st_size, layers=wanted, types=types, threads=threads,
        checks_rel_rms=checks, roofs_GBps=[rr["best"] for rr in roofs], roof_method=roofs[-1]["method"], rows=rows,
        ggml=ggml.info(a.ggml_build), loadavg=loadavg()), indent=1) + "\n")
    print(f"written: {a.out} and {a.out.with_suffix('.json').name}")
    for layer in peer.values():
        layer.close()
    ggml.free_pool(pool, a.ggml_build)
    return 0


if __name__ == "__main__":
    sys.exit(main())
