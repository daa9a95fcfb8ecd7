#!/usr/bin/env python3
"""CPU benchmark: moe_swift's CPU backend vs two NumPy implementations of the same layer.

  ours      moe_swift.MoELayer(..., backend="cpu"): the whole layer in one native call.
  grouped   NumPy float32, the strong baseline written here: route with NumPy, sort the
            (token, expert) pairs by expert, then per expert one `x_e @ W.T` BLAS matmul
            each for gate, up and down, and a weighted scatter-add into the output.
  ref       moe_swift.reference.moe_forward: the float64 oracle, a Python loop over
            (token, slot); weights converted to float64 once, outside the timing.

Before timing, ours and grouped must agree within the spec tolerance
(|a - b| <= 1e-4 * max|b| + 1e-5), and ours must match the reference on the tokens the
reference is timed on.  Timing alternates between the implementations in rounds of
blocks (ours, grouped, ref, ours, grouped, ref, ...); each block starts with a pause and
an untimed warm-up call, then times back-to-back calls, each on a fresh input; the table
gives medians.  (The pause matters on a small machine: NumPy's OpenBLAS worker threads
busy-wait for a while after each call and would otherwise take a core away from the
next block; alternating call by call made our decode look ~1.5x slower than it is.)
The reference is linear in T (one Python iteration per token and slot), so for large T
it is timed on a subset of the tokens and scaled to T; the table marks those with "~".

Results go to benchmarks/results/bench_cpu.json.

    python benchmarks/bench_cpu.py
    python benchmarks/bench_cpu.py --shapes qwen3-30b-a3b --tokens 1,64,256
    python benchmarks/bench_cpu.py --experts mixtral-8x7b=2 --no-reference
    python benchmarks/bench_cpu.py --quick
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import moe_swift
from moe_swift import reference

INIT_STD = 0.02

# name: (hidden, expert width, experts in the model, top_k, experts benchmarked by default)
SHAPES = {
    "qwen3-30b-a3b": (2048, 768, 128, 8, 128),
    "olmoe-1b-7b": (2048, 1024, 64, 8, 64),
    # 8 float32 experts are 5.6 GB; with the layer's copy and the reference's float64
    # copy that is 22.5 GB, so only 4 of them by default (per-token work is unchanged).
    "mixtral-8x7b": (4096, 14336, 8, 2, 4),
    "qwen1.5-moe-a2.7b": (2048, 1408, 60, 4, 60),   # routed experts only (shared expert not benchmarked)
    "gpt-oss-20b": (2880, 2880, 32, 4, 32),         # SiLU here, not swiglu_oai; no biases
}
DEFAULT_SHAPES = ["qwen3-30b-a3b", "olmoe-1b-7b", "mixtral-8x7b"]


# --- the grouped NumPy baseline -------------------------------------------------------


def numpy_route(x, router, top_k, norm_topk_prob=True):
    """Softmax router in float32: ids (T, k) by descending score (lower index on ties),
    weights (T, k)."""
    logits = x @ router.T
    logits -= logits.max(axis=1, keepdims=True)
    s = np.exp(logits)
    s /= s.sum(axis=1, keepdims=True)
    E = s.shape[1]
    if top_k < E:
        cand = np.argpartition(-s, top_k - 1, axis=1)[:, :top_k]
    else:
        cand = np.broadcast_to(np.arange(E), s.shape)
    cand_s = np.take_along_axis(s, cand, axis=1)
    order = np.lexsort((cand, -cand_s), axis=1)  # primary: score descending; then index
    ids = np.take_along_axis(cand, order, axis=1)
    w = np.take_along_axis(s, ids, axis=1)
    if norm_topk_prob:
        w /= w.sum(axis=1, keepdims=True) + np.float32(1e-20)
    return ids, w


def numpy_grouped(x, router, gate, up, down, top_k, ids=None, weights=None):
    """The MoE layer in float32 NumPy with tokens grouped per expert (SwiGLU experts)."""
    T, H = x.shape
    E = router.shape[0]
    if ids is None:
        ids, weights = numpy_route(x, router, top_k)
    flat = ids.ravel()
    order = np.argsort(flat, kind="stable")           # pairs sorted by expert
    counts = np.bincount(flat, minlength=E)
    starts = np.concatenate(([0], np.cumsum(counts)))
    token = order // top_k                            # token of each sorted pair
    pair_w = weights.ravel()[order]
    y = np.zeros((T, H), dtype=np.float32)
    for e in np.flatnonzero(counts):
        a, b = starts[e], starts[e + 1]
        t = token[a:b]                                # distinct: an expert is chosen once per token
        xe = x[t]
        g = xe @ gate[e].T
        u = xe @ up[e].T
        g *= u / (1 + np.exp(-g))                     # silu(g) * u
        ye = g @ down[e].T
        ye *= pair_w[a:b, None]
        y[t] += ye
    return y


# --- helpers --------------------------------------------------------------------------


def random_weights(E, H, I, seed):
    """float32 normal(0, INIT_STD): router (E, H), gate/up (E, I, H), down (E, H, I);
    one seeded generator per expert, filled on two threads."""
    router = np.random.default_rng([seed, 0]).standard_normal((E, H), dtype=np.float32)
    router *= INIT_STD
    gate = np.empty((E, I, H), np.float32)
    up = np.empty((E, I, H), np.float32)
    down = np.empty((E, H, I), np.float32)

    def fill(e):
        rng = np.random.default_rng([seed, 1, e])
        for w in (gate[e], up[e], down[e]):
            rng.standard_normal(out=w, dtype=np.float32)
            w *= INIT_STD

    with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
        list(pool.map(fill, range(E)))
    return router, gate, up, down


def tol(b):
    return 1e-4 * float(np.max(np.abs(b))) + 1e-5


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def loadavg():
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def peak_gb():
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux
    except Exception:
        return float("nan")


# --- one shape ------------------------------------------------------------------------


def bench_shape(name, H, I, E_model, k, E, tokens, args, log):
    rows = []
    log(f"\n[{name}] H={H} I={I} E={E}" + (f" (model has {E_model})" if E != E_model else "")
        + f" top_k={k}: {E * 3 * I * H * 4 / 1e9:.2f} GB of float32 experts")
    dt, (router, gate, up, down) = timed(lambda: random_weights(E, H, I, args.seed))
    dt2, layer = timed(lambda: moe_swift.MoELayer(router, gate, up, down, top_k=k, backend="cpu"))
    msg = f"  setup: weights {dt:.1f} s, MoELayer {dt2:.1f} s"
    w64 = None
    if args.reference:
        dt3, w64 = timed(lambda: tuple(a.astype(np.float64) for a in (router, gate, up, down)))
        msg += f", float64 copy for the reference {dt3:.1f} s"
    log(msg)

    rng = np.random.default_rng([args.seed, 3])
    for T in tokens:
        reps = args.repeats if T > 1 else args.decode_repeats
        # xs[0]: agreement checks, xs[1]: warm-up, xs[2:]: one different input per timed
        # run (decode then reads different experts each time).
        xs = [rng.standard_normal((T, H), dtype=np.float32) for _ in range(reps + 2)]

        # --- agreement before timing ---
        x = xs[0]
        y_ours = layer(x)
        ids, w = layer.route(x)
        np_ids, _ = numpy_route(x, router, k)
        same_mask = np.all(np_ids == ids, axis=1)
        same_routes = int(same_mask.sum())
        y_np = numpy_grouped(x, router, gate, up, down, k, ids=ids.astype(np.int64), weights=w)
        diff = float(np.max(np.abs(y_ours - y_np)))
        t_np = tol(y_np)
        ok = bool(np.all(np.isfinite(y_ours)) and diff <= t_np)
        # The grouped baseline with its own routing (what is timed) must give the same
        # output on the tokens where its routes agree with ours (all of them, barring
        # float32 near-ties).
        y_np_own = numpy_grouped(x, router, gate, up, down, k)
        own_ok = same_routes == 0 or float(np.max(np.abs(y_np_own - y_np)[same_mask])) <= t_np
        if not ok or not own_ok:
            log(f"  T={T}: ours vs grouped NumPy DISAGREE: max diff {diff:.3e} > {t_np:.3e} "
                f"(own-routing grouped ok: {own_ok})")
            rows.append(dict(shape=name, T=T, agree=False, max_diff_vs_grouped=diff, tolerance=t_np))
            args.failed = True
            continue

        # --- reference: on a subset of the tokens when T is large ---
        ref_n = T if T <= args.ref_tokens else args.ref_tokens
        ref_sub = np.unique(np.linspace(0, T - 1, ref_n).round().astype(int))
        ref_n = len(ref_sub)
        ref_diff = None
        if w64 is not None:
            xr = xs[0][ref_sub]
            ref_out = reference.moe_forward(xr, *w64, top_k=k, ids=ids[ref_sub])
            ref_diff = float(np.max(np.abs(y_ours[ref_sub] - ref_out)))
            if ref_diff > tol(ref_out):
                log(f"  T={T}: ours vs reference DISAGREE: {ref_diff:.3e} > {tol(ref_out):.3e}")
                args.failed = True

        # --- timed runs: rounds of blocks that alternate between the implementations ---
        # Each block: a pause (NumPy's OpenBLAS worker threads busy-wait for a while
        # after a call; on 2 cores they would steal a core from whatever runs next),
        # one untimed warm-up call, then back-to-back timed calls on fresh inputs.
        t_ours, t_np_runs, t_ref = [], [], []
        ref_reps = 0 if w64 is None else (args.ref_repeats if ref_n == T else args.ref_repeats_subset)
        per_round = -(-reps // args.rounds)
        for rnd in range(args.rounds):
            inputs = xs[2 + rnd * per_round: 2 + min(reps, (rnd + 1) * per_round)]
            for times, fn in ((t_ours, lambda x: layer(x)),
                              (t_np_runs, lambda x: numpy_grouped(x, router, gate, up, down, k))):
                time.sleep(args.settle)
                fn(xs[1])
                for x in inputs:
                    times.append(timed(lambda: fn(x))[0])
            n_ref = -(-ref_reps // args.rounds) if rnd < ref_reps else 0
            n_ref = min(n_ref, ref_reps - len(t_ref))
            if n_ref > 0:
                time.sleep(args.settle)
                if ref_n == T:  # cheap enough to warm up; subset runs take seconds anyway
                    reference.moe_forward(xs[1][ref_sub], *w64, top_k=k)
                for x in inputs[:n_ref]:
                    xr = x[ref_sub]
                    t_ref.append(timed(lambda: reference.moe_forward(xr, *w64, top_k=k))[0] * T / ref_n)
        ms = lambda v: 1e3 * float(np.median(v)) if v else None  # noqa: E731
        row = dict(
            shape=name, H=H, I=I, E=E, E_model=E_model, top_k=k, T=T,
            ms_ours=ms(t_ours), ms_numpy_grouped=ms(t_np_runs), ms_reference=ms(t_ref),
            runs=len(t_ours), rounds=args.rounds, settle_s=args.settle, reference_runs=len(t_ref),
            reference_tokens_timed=ref_n if t_ref else None,
            reference_scaled=bool(t_ref) and ref_n < T,
            ms_ours_all=[1e3 * v for v in t_ours], ms_numpy_grouped_all=[1e3 * v for v in t_np_runs],
            ms_reference_all=[1e3 * v for v in t_ref],
            agree=True, max_diff_vs_grouped=diff, tolerance=t_np, max_diff_vs_reference=ref_diff,
            routes_identical_to_numpy=f"{same_routes}/{T}",
        )
        row["speedup_vs_grouped"] = row["ms_numpy_grouped"] / row["ms_ours"]
        # Ratio of the fastest runs: less sensitive to other load on a shared machine.
        row["speedup_vs_grouped_min"] = min(t_np_runs) / min(t_ours)
        row["speedup_vs_reference"] = row["ms_reference"] / row["ms_ours"] if t_ref else None
        if T == 1:
            row["decode_weight_GBps_ours"] = (E * H + k * 3 * I * H) * 4 / (row["ms_ours"] * 1e-3) / 1e9
        row["loadavg_after"] = loadavg()
        rows.append(row)
        log("  " + format_row(row) + f"  [load {row['loadavg_after']}]")
    layer.close()
    return rows


# --- output ---------------------------------------------------------------------------

HEADER = (f"{'shape':<22} {'T':>4} {'ours ms':>9} {'grouped ms':>11} {'ref ms':>10} "
          f"{'vs grouped':>10} {'(min)':>6} {'vs ref':>7}  notes")


def format_row(r):
    if not r.get("agree", True):
        return f"{r['shape']:<22} {r['T']:>4}  DISAGREE (max diff {r['max_diff_vs_grouped']:.2e})"
    ref = "-" if r["ms_reference"] is None else (
        ("~" if r["reference_scaled"] else "") + f"{r['ms_reference']:.1f}")
    vs_ref = "-" if r["speedup_vs_reference"] is None else f"{r['speedup_vs_reference']:.0f}x"
    shape = r["shape"] + (f" E={r['E']}/{r['E_model']}" if r["E"] != r["E_model"] else "")
    notes = []
    if not r["routes_identical_to_numpy"].startswith(f"{r['T']}/"):
        notes.append(f"NumPy routes {r['routes_identical_to_numpy']} tokens like ours")
    if r["T"] == 1:
        notes.append(f"ours reads {r['decode_weight_GBps_ours']:.1f} GB/s")
    if r["reference_scaled"]:
        notes.append(f"ref timed on {r['reference_tokens_timed']} tok x{r['reference_runs']}, scaled to T")
    elif r["ms_reference"] is not None:
        notes.append(f"ref x{r['reference_runs']}")
    return (f"{shape:<22} {r['T']:>4} {r['ms_ours']:>9.2f} {r['ms_numpy_grouped']:>11.2f} {ref:>10} "
            f"{r['speedup_vs_grouped']:>9.2f}x {r['speedup_vs_grouped_min']:>5.2f}x {vs_ref:>7}  {'; '.join(notes)}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=
                                "shapes: " + ", ".join(SHAPES))
    p.add_argument("--shapes", default=None, help=f"comma-separated (default {','.join(DEFAULT_SHAPES)})")
    p.add_argument("--tokens", default=None, help="comma-separated T values (default 1,256)")
    p.add_argument("--experts", action="append", default=[], metavar="SHAPE=N",
                   help="benchmark N experts of SHAPE (repeatable), or N for every shape")
    p.add_argument("--repeats", type=int, default=6, help="timed runs per implementation for T > 1 (default 6)")
    p.add_argument("--decode-repeats", type=int, default=21, help="timed runs per implementation for T = 1 (default 21)")
    p.add_argument("--rounds", type=int, default=3,
                   help="the runs are split into this many rounds of alternating blocks (default 3)")
    p.add_argument("--settle", type=float, default=0.3,
                   help="pause in seconds before each block, so BLAS threads of the previous one go idle (default 0.3)")
    p.add_argument("--ref-tokens", type=int, default=16,
                   help="time the reference on at most this many tokens, scaled to T (default 16)")
    p.add_argument("--ref-repeats", type=int, default=6, help="reference runs when it sees all T tokens")
    p.add_argument("--ref-repeats-subset", type=int, default=3, help="reference runs on a token subset")
    p.add_argument("--no-reference", dest="reference", action="store_false",
                   help="skip the float64 reference (saves its float64 weight copy)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: qwen3 and olmoe with 16 experts, T in {1, 32}, few repeats")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None,
                   help="output file (default benchmarks/results/bench_cpu.json; bench_cpu_quick.json with --quick)")
    args = p.parse_args(argv)

    if args.quick:
        shapes = (args.shapes or "qwen3-30b-a3b,olmoe-1b-7b").split(",")
        tokens = [int(t) for t in (args.tokens or "1,32").split(",")]
        args.repeats, args.decode_repeats = min(args.repeats, 3), min(args.decode_repeats, 5)
        args.ref_repeats, args.ref_repeats_subset, args.ref_tokens = 1, 1, min(args.ref_tokens, 8)
        args.rounds, args.settle = min(args.rounds, 2), min(args.settle, 0.1)
        overrides = {s: 16 for s in shapes}
    else:
        shapes = (args.shapes or ",".join(DEFAULT_SHAPES)).split(",")
        tokens = [int(t) for t in (args.tokens or "1,256").split(",")]
        overrides = {}
    for item in args.experts:
        if "=" in item:
            s, n = item.split("=", 1)
            overrides[s] = int(n)
        else:
            overrides.update({s: int(item) for s in shapes})
    for s in shapes:
        if s not in SHAPES:
            p.error(f"unknown shape {s!r}; known: {', '.join(SHAPES)}")
    if any(t < 1 for t in tokens):
        p.error("--tokens must be positive")
    args.failed = False

    t_start = time.perf_counter()
    print("moe-swift CPU benchmark: ours (CPU backend) vs grouped NumPy float32 vs NumPy float64 reference")
    print(f"  numpy {np.__version__}, {os.cpu_count()} cores, {platform.machine()}, "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '-')}, "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE', '-')}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '-')} (NumPy's BLAS; ours uses Dispatch)")
    print(f"  load average at start {loadavg()} (the machine is shared: other load distorts multi-threaded BLAS most)")
    print(f"  medians of {args.decode_repeats} (T=1) / {args.repeats} (T>1) runs in {args.rounds} rounds of alternating "
          f"blocks (pause {args.settle} s + warm-up call, then back-to-back calls);")
    print(f"  random float32 weights normal(0, {INIT_STD}), x normal(0, 1), a fresh x for every run")

    rows = []
    for s in shapes:
        H, I, E_model, k, E_default = SHAPES[s]
        E = overrides.get(s, E_default)
        if not k <= E:
            p.error(f"{s}: need at least top_k = {k} experts, got {E}")
        rows += bench_shape(s, H, I, E_model, k, E, tokens, args, print)

    print("\n" + HEADER)
    print("-" * len(HEADER))
    for r in rows:
        print(format_row(r))
    print("ms: median wall time of one call; vs X: X's median / ours (>1: ours is faster); (min): the same "
          "ratio of the fastest runs;\n~: reference timed on a token subset and scaled to T (it is linear in T)")
    total = time.perf_counter() - t_start
    print(f"peak memory {peak_gb():.1f} GB, total {total:.0f} s, load average at end {loadavg()}")

    out = Path(args.json) if args.json else (
        Path(__file__).resolve().parent / "results" / ("bench_cpu_quick.json" if args.quick else "bench_cpu.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(
        benchmark="bench_cpu",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        numpy=np.__version__, moe_swift=moe_swift.__version__, python=platform.python_version(),
        machine=platform.machine(), cpu_count=os.cpu_count(),
        loadavg_end=loadavg(),
        env={k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
                                          "OMP_NUM_THREADS") if k in os.environ},
        settings=dict(shapes=shapes, tokens=tokens, experts=overrides, repeats=args.repeats,
                      rounds=args.rounds, settle_s=args.settle,
                      decode_repeats=args.decode_repeats, ref_tokens=args.ref_tokens,
                      reference=args.reference, quick=args.quick, seed=args.seed),
        total_seconds=total, peak_memory_gb=peak_gb(), rows=rows), indent=1))
    print(f"wrote {out}")
    if args.failed:
        print("FAILED: an agreement check failed (see above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
