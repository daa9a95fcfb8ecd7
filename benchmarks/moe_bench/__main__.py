"""python benchmarks/run.py: the CPU backend against NumPy, the reference, transformers
(torch), MLX and ggml on five model shapes, with the machine's roofline.

    python benchmarks/run.py                      # every shape, T in {1, 8, 64, 512} (~15 min)
    python benchmarks/run.py --quick              # 2 shapes, 16 experts, T in {1, 64} (~1 min)
    python benchmarks/run.py --shapes qwen3-30b-a3b --tokens 1,512 --peers ours,numpy,torch-grouped
    python benchmarks/run.py --experts mixtral-8x7b=8 --json /tmp/b.json --plot /tmp/b.png
    python benchmarks/run.py --formats f32,bf16,q8,q4,mxfp4 --shapes qwen3-30b-a3b --tokens 1,8,512
    python benchmarks/run.py --formats q4_K,q6_K,q8_0,mxfp4_ggml --peers ours,ggml --tokens 1,8,512
    python benchmarks/run.py --formats q4_0,q4_K,q8_0 --activations none,q8 --peers ours,ggml --tokens 1,8
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

import numpy as np

from . import ggml, peers, plot, report, roofline, weightformats
from .runner import DECODE_BLOCK_CALLS, Progress, bench_shape, loadavg, peak_rss_gb
from .shapes import DEFAULT_SHAPES, QUICK_EXPERTS, QUICK_SHAPES, SHAPES

QUICK_FORMAT_SHAPES = ["qwen3-30b-a3b"]

DEFAULT_TOKENS = [1, 8, 64, 512]
QUICK_TOKENS = [1, 64]


def results_dir() -> Path:
    """benchmarks/results of the checkout this suite is in (gitignored)."""
    return Path(__file__).resolve().parents[1] / "results"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python benchmarks/run.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="shapes: " + ", ".join(SHAPES) + "\npeers: " + ", ".join(peers.PEERS))
    p.add_argument("--shapes", help=f"comma list (default: all; --quick: {','.join(QUICK_SHAPES)})")
    p.add_argument("--tokens", help="comma list of T (default 1,8,64,512; --quick: 1,64)")
    p.add_argument("--peers", help=f"comma list of implementations (default: all: {','.join(peers.PEERS)}); "
                                   "ours always runs (it is what the others are checked against)")
    p.add_argument("--formats", help="comma list of expert weight formats, each benchmarked in turn: "
                                     + ", ".join(f"{k} ({v.describe})" for k, v in weightformats.FORMATS.items())
                                     + "; default: float32 only, the plain table (--quick with --formats: "
                                     + ",".join(QUICK_FORMAT_SHAPES) + " only)")
    p.add_argument("--activations", default="none",
                   help="comma list of ours' activation quantizations (moe_swift's activation_quantization: "
                        "none, q8): the first is \"ours\", each other one an implementation \"ours-<mode>\" "
                        "timed in the same rounds, with ggml's ratio against it too (default: none)")
    p.add_argument("--ggml-threads", type=int, default=None,
                   help="threads of the ggml peers (default: all cores, as llama.cpp's -t)")
    p.add_argument("--ggml-native-lib", metavar="DIR", default=None,
                   help="the ggml-native peers' libraries (libggml-base.so, libggml-cpu.so) in DIR (default: $"
                        "MOE_BENCH_GGML_LIB, else benchmarks/results/llama.cpp-native/build/bin, where "
                        "benchmarks/native/build_llama_cpp.sh builds llama.cpp)")
    p.add_argument("--ggml-no-repack", action="store_true",
                   help="keep ggml's weights in host memory instead of the CPU extra buffer types (CPU_REPACK) "
                        "llama.cpp uses by default: as llama.cpp with --no-repack")
    p.add_argument("--flush-mb", type=int, default=None,
                   help="MiB read (one thread per core) before every timed call of every implementation, so that "
                        "no call finds the previous call's experts cached (default: twice the last-level cache; "
                        "0: no flush)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="time calls in wall time (default) or in the process's CPU time: for single-threaded "
                        "runs on a loaded machine (taskset -c N ... --ggml-threads 1), where wall time is mostly "
                        "the wait for the core")
    p.add_argument("--experts", action="append", default=[], metavar="SHAPE=N",
                   help="benchmark N experts of SHAPE (repeatable), or N for every shape")
    p.add_argument("--quick", action="store_true",
                   help=f"small run: {', '.join(QUICK_SHAPES)} with {QUICK_EXPERTS} experts, T in {{1, 64}}, "
                        "few repeats (about a minute)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"most timed runs per implementation and T (x3 for T <= 8, at least {DECODE_BLOCK_CALLS} a "
                        "block; default 7, --quick 3)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds of timed calls per implementation and T: slower ones get fewer runs "
                        "(default 2.5, --quick 0.5)")
    p.add_argument("--max-call", type=float, default=30.0,
                   help="skip an implementation at a T where one call is predicted (linearly from the "
                        "previous T) to take longer than this many seconds (default 30)")
    p.add_argument("--rounds", type=int, default=None, help="rounds of alternating blocks, twice as many for T <= 8 (default 3, --quick 2)")
    p.add_argument("--settle", type=float, default=None,
                   help="pause in seconds before each block so that BLAS/OpenMP threads of the previous one "
                        "go idle (default 0.3, --quick 0.1)")
    p.add_argument("--warmup", type=float, default=0.03,
                   help="seconds of untimed calls after each block's pause, at least one call (default 0.03: "
                        "after the pause this VM's cores run the first ~10-20 ms of work up to 2x slower)")
    p.add_argument("--ref-tokens", type=int, default=None,
                   help="time the reference on at most this many tokens, scaled to T (default 8, --quick 2)")
    p.add_argument("--ref-gb", type=float, default=2.0,
                   help="most GB of float64 expert copies for the reference (fewer tokens if needed; default 2)")
    p.add_argument("--point-probe-mb", type=int, default=256,
                   help="MiB the native read probe reads at the start of every round of a decode point "
                        "(the '%% now' column; default 256, at least 64; 0: no point probe, and no '%% read')")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="output JSON (default benchmarks/results/bench.json; --quick: bench_quick.json)")
    p.add_argument("--plot", help="output PNG (default: the JSON path with .png)")
    p.add_argument("--no-plot", action="store_true", help="do not draw the PNG")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = p.parse_args(argv)
    if args.ggml_native_lib:  # the environment, so that every later lookup sees it
        os.environ[ggml.NATIVE_LIB_ENV] = str(Path(args.ggml_native_lib).resolve())

    q = args.quick
    args.repeats = args.repeats or (3 if q else 7)
    # --quick --formats: five layers in turn, so shorter blocks (about a minute on an idle machine)
    args.budget = args.budget if args.budget is not None else ((0.25 if args.formats else 0.5) if q else 2.5)
    args.rounds = args.rounds or (2 if q else 3)
    args.settle = args.settle if args.settle is not None else (0.1 if q else 0.3)
    args.ref_tokens = args.ref_tokens or (2 if q else 8)
    if args.flush_mb is not None and args.flush_mb < 0:
        p.error(f"--flush-mb must be 0 (off) or positive, got {args.flush_mb}")
    if args.point_probe_mb and args.point_probe_mb < 64:
        p.error(f"--point-probe-mb must be 0 (off) or at least 64 (beyond the caches), got {args.point_probe_mb}")
    formats = None
    if args.formats:
        formats = args.formats.split(",")
        for f in formats:
            if f not in weightformats.FORMATS:
                p.error(f"unknown format {f!r}; known: {', '.join(weightformats.FORMATS)}")
            if weightformats.status(f):
                p.error(f"format {f}: {weightformats.status(f)}")
    args.formats = formats
    quick_shapes = QUICK_FORMAT_SHAPES if formats else QUICK_SHAPES
    shapes = (args.shapes or ",".join(quick_shapes if q else DEFAULT_SHAPES)).split(",")
    for s in shapes:
        if s not in SHAPES:
            p.error(f"unknown shape {s!r}; known: {', '.join(SHAPES)}")
    try:
        tokens = [int(t) for t in (args.tokens or ",".join(map(str, QUICK_TOKENS if q else DEFAULT_TOKENS))).split(",")]
    except ValueError:
        p.error("--tokens must be a comma list of integers")
    if any(t < 1 for t in tokens):
        p.error("--tokens must be positive")
    selected = (args.peers or ",".join(peers.PEERS)).split(",")
    for n in selected:
        if n not in peers.PEERS:
            p.error(f"unknown peer {n!r}; known: {', '.join(peers.PEERS)}")
    from moe_swift.options import ACTIVATION_QUANTIZATIONS
    modes = args.activations.split(",")
    for m in modes:
        if m not in ACTIVATION_QUANTIZATIONS:
            p.error(f"--activations: unknown mode {m!r}; known: {', '.join(ACTIVATION_QUANTIZATIONS)}")
    if len(set(modes)) != len(modes):
        p.error("--activations: each mode once")
    args.activations = modes
    selected = (["ours"] + [f"ours-{m}" for m in modes[1:]]
                + [n for n in peers.PEERS if n in selected and n != "ours"])
    experts = {s: QUICK_EXPERTS for s in shapes} if q else {}
    for item in args.experts:
        try:
            if "=" in item:
                s, n = item.split("=", 1)
                if s not in SHAPES:
                    p.error(f"--experts: unknown shape {s!r}")
                experts[s] = int(n)
            else:
                experts.update({s: int(item) for s in shapes})
        except ValueError:
            p.error(f"--experts {item!r}: expected SHAPE=N or N")
    for s in shapes:
        E = experts.get(s, SHAPES[s].default_experts)
        if not SHAPES[s].top_k <= E:
            p.error(f"{s}: needs at least top_k = {SHAPES[s].top_k} experts, got {E}")
        experts[s] = E
    args.shapes, args.tokens, args.selected, args.experts = shapes, sorted(set(tokens)), selected, experts
    stem = "bench_formats" if formats else "bench"
    default_json = results_dir() / (f"{stem}_quick.json" if q else f"{stem}.json")
    args.json = Path(args.json) if args.json else default_json
    args.plot = None if args.no_plot else (Path(args.plot) if args.plot else args.json.with_suffix(".png"))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    log = Progress(quiet=args.quiet)
    started = datetime.datetime.now().astimezone()
    out = print

    out(f"moe-swift CPU benchmark ({started:%Y-%m-%d %H:%M %Z}): one MoE layer, ours vs peers, with the roofline")
    out(f"  machine: {platform.machine()}, {peers.cores()} cores, {_cpu_model()}, {_mem_gb():.0f} GB; "
        f"load average at start {loadavg()} (shared machines distort multi-threaded BLAS most)")
    out(f"  numpy {np.__version__}" + (f" ({roofline.blas_info()})" if roofline.blas_info() else ""))
    for line in roofline.env_warnings():
        out("  " + line)
        print(line, file=sys.stderr)
    out("  implementations:")
    for m in args.activations[1:]:
        out(f"    {'ours-' + m:14s} ours with activation_quantization={m!r} (on quantized formats; timed in the "
            "same rounds)")
    if args.activations[0] != "none":
        out(f"    (ours runs with activation_quantization={args.activations[0]!r})")
    for n in peers.PEERS:
        if n not in args.selected:
            out(f"    {n:14s} not selected (--peers)")
        elif peers.status(n) is None:
            out(f"    {n:14s} {peers.info(n)}")
        else:
            out(f"    {n:14s} {peers.status(n)}")
    out(f"  timing: medians of up to {args.repeats} runs (x3 for T <= {roofline.DECODE_MAX_T}, at least "
        f"{DECODE_BLOCK_CALLS} a block) per implementation, "
        f"{args.budget:g} s of calls each at most (>= 3 runs unless one call takes longer), in {args.rounds} rounds "
        f"of alternating blocks (pause {args.settle:g} s + {args.warmup * 1e3:g} ms of warm-up calls, at least one, "
        f"then back-to-back calls on fresh inputs)")
    from .runner import flush_bytes
    fb = flush_bytes(args)
    out("  caches: " + (f"{fb / 2**20:.0f} MiB read ({peers.cores()} threads) before every timed call of every "
                        "implementation" if fb else "not flushed (--flush-mb 0)")
        + "; ratios peer / ours paired per round (median over the rounds of the round medians' ratio)")
    if args.clock == "cpu":
        out("  clock: the process's CPU time per call (all threads), not wall time")
    out("  checks before timing: every implementation vs ours, |y - ours| <= 1e-4 max|ours| + 1e-5; ours vs "
        "the float64 reference on a few tokens (spec tolerance)")

    if args.formats:
        out("  formats: " + "; ".join(f"{f} = {weightformats.FORMATS[f].describe}" for f in args.formats)
            + " (router, biases, shared expert float32)")
    log("measuring the roofline (read probe, GEMV bandwidth, SGEMM peak) ...")
    roof_start = roofline.measure(quick=args.quick)
    log(f"roofline: read probe {roof_start.get('stream_GBps_best', 0):.1f} GB/s, GEMV {roof_start['gemv_GBps_best']:.1f} GB/s, "
        f"{roof_start['gemm_GFLOPs_best']:.0f} GFLOP/s")

    rows, failures = [], []
    for s in args.shapes:
        shape = SHAPES[s]
        E = args.experts[s]
        log(f"=== {s}: H={shape.hidden} I={shape.inter} E={E}"
            + (f" (of {shape.experts})" if E != shape.experts else "") + f" k={shape.top_k}"
            + (f" shared={shape.shared}" if shape.shared else "") + f", T in {args.tokens}")
        rows += bench_shape(shape, E, args.tokens, args.selected, args, log, failures, formats=args.formats)
        log(f"{s}: done, peak RSS so far {peak_rss_gb():.1f} GB")

    log("measuring the roofline again ...")
    roof_end = roofline.measure(quick=args.quick)
    roof = roofline.combine(roof_start, roof_end)
    report.add_fractions(rows, roof)

    out("")
    if args.formats:
        out(report.formats_tables(rows, args.selected, roof))
        out("")
        out(report.FORMATS_LEGEND)
    else:
        out(report.tables(rows, args.selected, roof))
        out("")
        out(report.LEGEND)
    if args.formats:
        ran = {(r["shape"], r.get("format")) for r in rows}
        missing = [f"{s} {f}" for s in args.shapes for f in args.formats if (s, f) not in ran]
        if missing:
            out("Not run (the format's blocks do not divide the shape's rows): " + ", ".join(missing))
    out(f"Roofline measured with NumPy on {peers.cores()} cores (best of the start and end of the run): "
        f"read probe ({roof_start.get('stream_method', '?')}) {roof_start.get('stream_GBps_best', 0):.1f} / "
        f"{roof_end.get('stream_GBps_best', 0):.1f} GB/s, "
        f"GEMV over a {roof_start['gemv_matrix_bytes'] / 2**30:.2f} GiB float32 matrix "
        f"{roof_start['gemv_GBps_best']:.1f} / {roof_end['gemv_GBps_best']:.1f} GB/s (start / end), "
        f"SGEMM {roof_start['gemm_n']}^3 {roof_start['gemm_GFLOPs_best']:.0f} / {roof_end['gemm_GFLOPs_best']:.0f} GFLOP/s")
    total = log.elapsed()
    out(f"peak RSS {peak_rss_gb():.1f} GB, total {total:.0f} s, load average at end {loadavg()}")

    payload = dict(
        benchmark="moe_bench", date=started.isoformat(timespec="seconds"), argv=sys.argv[1:],
        machine=dict(arch=platform.machine(), cores=peers.cores(), cpu=_cpu_model(), memory_gb=_mem_gb(),
                     python=platform.python_version(), numpy=np.__version__, blas=roofline.blas_info()),
        env={k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
                                         "OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ},
        env_warnings=roofline.env_warnings(),
        implementations={n: (peers.info(n) if peers.status(n) is None else peers.status(n))
                         if n in args.selected else "not selected" for n in peers.PEERS},
        settings=dict(shapes=args.shapes, tokens=args.tokens, experts=args.experts, peers=args.selected,
                      repeats=args.repeats, budget_s=args.budget, max_call_s=args.max_call, rounds=args.rounds,
                      settle_s=args.settle, warmup_s=args.warmup, ref_tokens=args.ref_tokens, ref_gb=args.ref_gb, quick=args.quick,
                      seed=args.seed, decode_max_T=roofline.DECODE_MAX_T, formats=args.formats,
                      ggml_threads=args.ggml_threads or peers.cores(), ggml_repack=not args.ggml_no_repack,
                      ggml_native_lib=str(ggml.native_lib_dir()),
                      flush_bytes=fb, clock=args.clock, activations=args.activations),
        formats=None if not args.formats else {f: dict(describe=weightformats.FORMATS[f].describe,
                                                       bits_per_weight=weightformats.FORMATS[f].bits_per_weight,
                                                       ggml=[t for t in weightformats.FORMATS[f].ggml if t])
                                               for f in args.formats},
        roofline=dict(used=roof, start=roof_start, end=roof_end),
        loadavg_end=loadavg(), total_seconds=total, peak_rss_gb=peak_rss_gb(),
        failures=failures, rows=rows)
    report.write_json(args.json, payload)
    out(f"wrote {args.json}")
    if args.plot:
        why = plot.plot(rows, args.selected, roof, args.plot,
                        f"moe-swift CPU backend vs peers, {peers.cores()} cores, {started:%Y-%m-%d} "
                        f"(roofline {roof['GBps']:.0f} GB/s, {roof['GFLOPs']:.0f} GFLOP/s)")
        out(f"wrote {args.plot}" if why is None else f"plot skipped: {why}")
    if failures:
        out("FAILED checks:")
        for f in failures:
            out("  " + f)
        return 1
    return 0


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _mem_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return float("nan")


if __name__ == "__main__":
    sys.exit(main())
