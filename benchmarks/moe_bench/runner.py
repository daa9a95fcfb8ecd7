"""One shape: build every implementation from the same weights, check each against ours,
then time them in alternating blocks.

Timing method (kept from the first benchmark, benchmarks/bench_cpu.py): the timed runs
of each implementation are split into rounds; a round runs one block per implementation
(ours, numpy, reference, torch-eager, torch-grouped, mlx); each block starts with a
pause (`settle`) and untimed warm-up calls (`warmup` seconds of them, at least one: after
the pause this VM's cores run the first ~10-20 ms of work up to 2x slower, for every
implementation), then times back-to-back calls, each on a
fresh input (the same inputs for every implementation, so in decode all of them read
the same experts). Tables give medians. In decode (T <= 8) each round also starts with
the native read probe (`--point-probe-mb`, 256 MiB): an implementation's median in a
round over that round's probe, the median over the rounds, is its bandwidth fraction at
that moment. This machine's bandwidth moves by up to 2x within minutes, so the roofline
of the whole run (best of its start and end) understates a point measured in a slow
phase. The pause matters on a small machine: NumPy's OpenBLAS and torch's OpenMP worker
threads spin for a while after a call and would otherwise take a core from the next block
(alternating call by call made our decode look ~1.5x slower than it is). ggml's
threadpool is never paused: llama.cpp keeps one threadpool whose workers poll between
graph computations through a decode loop, and so does the ggml peer, block after block.

Before every timed call of every implementation the last-level cache is flushed
(`flush_mb`, default twice the L3: threads reading a buffer of that size, one per core,
outside the timing), as the rest of a model's layers would between two calls of this
one: no implementation finds the experts of the previous call still cached. The
implementations of one point are paired in one process and in the same rounds; each
peer's `paired_ratio` is the median over the rounds of (its median in the round / ours'
median in the same round), which cancels the machine's slow and fast phases better
than the ratio of the overall medians.

Slow implementations get fewer runs: each has `budget` seconds of timed calls per point
(at least 3 runs, 1 when a single call takes longer than the budget, at most `repeats`,
three times that for decode; a call slower than half the budget has no warm-up call of
its own: the check call just before served as one). A call longer than `max_call` / 3
is timed once only: its check call is its run. One whose call is predicted (linearly in
T from the previous T) to take more than `max_call` seconds is skipped at that T, with
the reason.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import numpy as np

from moe_swift import reference
from . import peers
from . import grouped
from . import roofline
from .roofline import DECODE_MAX_T
from .shapes import Weights
from .weightformats import FormatWeights

# Loose checks (relative RMS error of the output) for peers that do not compute the same
# layer as ours to the spec tolerance: ggml quantizes the float32 weights itself and the
# activations to 8 bits (checked against the float32 layer); MLX runs bf16 weights with
# bfloat16 activations (checked against ours).
GGML_REL_RMS = {"F32": 1e-4, "BF16": 0.03, "Q8_0": 0.05, "Q4_0": 0.35, "Q4_K": 0.35, "MXFP4": 0.35}
# ggml on the very blocks ours reads (the ggml formats): only its 8-bit activations (Q8_0
# / Q8_K blocks of x and of the activation before down) set it apart from ours.
GGML_SAME_BLOCKS_REL_RMS = 0.05
MLX_BF16_REL_RMS = 0.03


def rel_rms(y, ref, keep):
    d, r = (y - ref)[keep], ref[keep]
    return float(np.sqrt(np.mean(d.astype(np.float64) ** 2) / max(np.mean(r.astype(np.float64) ** 2), 1e-300)))


class Progress:
    """Progress lines on stderr with the elapsed time: long runs show they are alive."""

    def __init__(self, stream=None, quiet=False):
        self.t0 = time.perf_counter()
        self.stream = stream or sys.stderr
        self.quiet = quiet

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def __call__(self, msg: str):
        if not self.quiet:
            print(f"[{self.elapsed():7.1f} s] {msg}", file=self.stream, flush=True)


def timed(fn, *a):
    t0 = time.perf_counter()
    out = fn(*a)
    return time.perf_counter() - t0, out


def loadavg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def rss_gb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9
    except OSError:
        return float("nan")


def peak_rss_gb() -> float:
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux
    except Exception:  # noqa: BLE001
        return float("nan")


def tolerance(ref) -> float:
    """|y - ref| <= 1e-4 * max|ref| + 1e-5 (docs/spec.md, "What one call computes")."""
    return 1e-4 * float(np.max(np.abs(ref))) + 1e-5


def near_ties(x, w, rel=1e-5):
    """Tokens whose k-th and (k+1)-th routing scores (float64) are within `rel` of each
    other: float32 routers may choose differently there, so outputs are not compared."""
    k, E = w.k, w.E
    if k >= E:
        return np.zeros(x.shape[0], dtype=bool)
    logits = x.astype(np.float64) @ w.router.T.astype(np.float64)
    if w.router_bias is not None:
        logits += w.router_bias
    s = np.exp(logits - logits.max(axis=1, keepdims=True))
    s /= s.sum(axis=1, keepdims=True)
    top = -np.partition(-s, (k - 1, k), axis=1)
    return (top[:, k - 1] - top[:, k]) <= rel * top[:, k - 1]


# Least timed calls per block of a decode point (see bench_point).
DECODE_BLOCK_CALLS = 12


def l3_bytes() -> int:
    """The largest cache's size from sysfs (32 MiB when it cannot be read)."""
    best = 0
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (d / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            best = max(best, int(text.rstrip("KMG")) * mult)
        except ValueError:
            continue
    return best or 32 << 20


class CacheFlush:
    """Reads `nbytes` (one thread per core, each its share) so that what a call read
    before is no longer cached; calling it is the flush. nbytes 0: does nothing."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        if not nbytes:
            return
        from concurrent.futures import ThreadPoolExecutor
        buf = np.ones(nbytes // 8, np.uint64)  # written once: every page is resident
        self.parts = np.array_split(buf, peers.cores())
        self.pool = ThreadPoolExecutor(len(self.parts))

    def __call__(self):
        if self.nbytes:
            list(self.pool.map(np.bitwise_or.reduce, self.parts))

    def close(self):
        if self.nbytes:
            self.pool.shutdown()
            self.parts = None


# What a timed call is measured in. "cpu": the process's CPU time (all its threads), for
# single-threaded runs on a machine other jobs load (`taskset -c N` and --ggml-threads 1),
# where wall time is mostly the wait for the core; with several threads it also counts
# their spinning.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def flush_bytes(args) -> int:
    mb = getattr(args, "flush_mb", 0)
    return (2 * l3_bytes() if mb is None else mb << 20) if mb != 0 else 0


def plan_runs(t_call: float, max_runs: int, budget: float) -> int:
    if t_call >= budget:
        return 1
    return max(min(3, max_runs), min(max_runs, int(budget / max(t_call, 1e-9))))


def build(w, fw, selected, args, log):
    """Every selected implementation for one shape (and format: `fw` a FormatWeights,
    None for the float32 layer of the plain benchmark). Returns ({name: callable},
    {name: reason it cannot run})."""
    shape = w.shape
    tag = shape.name + ("" if fw is None else f" [{fw.name}]")
    impls, state = {}, {}
    modes = getattr(args, "activations", ["none"])
    t, impls["ours"] = timed(peers.Ours, w, fw, modes[0])
    log(f"{tag}: ours built in {t:.1f} s (native copy)")
    for m in modes[1:]:
        if fw is None or fw.fmt.dense:
            state[f"ours-{m}"] = "n/a (dense weights take float32 activations)"
        else:
            impls[f"ours-{m}"] = peers.Ours(w, fw, m)
    if "numpy" in selected:
        impls["numpy"] = peers.NumPyGrouped(w if fw is None else fw.deq)
    torch_names = [n for n in peers.TORCH_IMPLEMENTATIONS if n in selected]
    if fw is not None and fw.name != "f32":
        for n in torch_names:
            state[n] = "n/a (float32 only)"
        torch_names = []
    runnable = [n for n in torch_names if peers.status(n) is None]
    for n in torch_names:
        if n not in runnable:
            state[n] = peers.status(n)
    if runnable:
        try:
            t, block = timed(peers.TorchBlock, w)
            log(f"{shape.name}: transformers block built in {t:.1f} s (shares the NumPy arrays)")
            for n in runnable:
                impls[n] = block.impl(n)
            impls["_torch_block"] = block
        except Exception as exc:  # noqa: BLE001
            for n in runnable:
                state[n] = f"failed to build the transformers block: {exc.__class__.__name__}: {exc}"
    if "mlx" in selected:
        if fw is not None and fw.fmt.ggml_type:
            state["mlx"] = "n/a (MLX reads no ggml blocks)"
        elif peers.status("mlx") is not None:
            state["mlx"] = peers.status("mlx")
        else:
            try:
                t, impls["mlx"] = timed(peers.MLXLayer, w, fw)
                log(f"{tag}: MLX layer built in {t:.1f} s (copy)")
            except peers.Unsupported as exc:
                state["mlx"] = str(exc)
            except Exception as exc:  # noqa: BLE001
                state["mlx"] = f"failed to build: {exc.__class__.__name__}: {exc}"
    for n, (ggml_build, slot) in peers.GGML_PEERS.items():
        if n not in selected:
            continue
        gtype = (fw.fmt.ggml[slot] if fw is not None else ("F32", None)[slot])
        blocks = fw.ggml_blocks() if fw is not None and slot == 0 else None
        if peers.status(n) is not None:
            state[n] = peers.status(n)
            continue
        if gtype is None:
            state[n] = "n/a (no second ggml type for this format)"
            continue
        from . import ggml
        why = ggml.supports(w, gtype)
        if why:
            state[n] = why
            continue
        try:
            t, impls[n] = timed(lambda: ggml.GGMLLayer(
                w, gtype, impls["ours"].route, getattr(args, "ggml_threads", None) or peers.cores(), blocks=blocks,
                repack=not getattr(args, "ggml_no_repack", False), build=ggml_build))
            source = ("the blocks ours reads" if blocks is not None else "a copy" if gtype == "F32"
                      else "ggml_quantize_chunk of the float32 weights")
            log(f"{tag}: {n} built in {t:.1f} s from {source}: {impls[n].describe()}")
        except Exception as exc:  # noqa: BLE001
            state[n] = f"failed to build: {exc.__class__.__name__}: {exc}"
    if "reference" in selected and peers.status("reference") is not None:
        state["reference"] = peers.status("reference")
    log(f"{tag}: process RSS {rss_gb():.1f} GB")
    return impls, state


def close_all(impls):
    for v in impls.values():
        try:
            v.close()
        except Exception:  # noqa: BLE001
            pass
    impls.clear()
    gc.collect()


def bench_shape(shape, E, tokens, selected, args, log, failures, formats=None):
    """Rows (one per format and T) for one shape; appends messages of failed checks to
    `failures`. `formats`: names of weightformats.FORMATS (rows carry "format"), None:
    the float32 layer as the plain benchmark runs it."""
    t, w = timed(Weights, shape, E, args.seed)
    log(f"{shape.name}: {w.nbytes() / 1e9:.2f} GB of float32 weights generated in {t:.1f} s")
    rows = []
    flush = CacheFlush(flush_bytes(args))
    try:
        for fmt in formats or [None]:
            fw = None
            impls = {}
            try:
                if fmt is not None:
                    try:
                        t, fw = timed(FormatWeights, w, fmt)
                    except ValueError as exc:  # a ggml block longer than this shape's rows
                        log(f"{shape.name}: format {fmt} not run: {exc}")
                        continue
                    log(f"{shape.name}: experts converted to {fmt} in {t:.1f} s "
                        f"({fw.expert_bytes() / 1e6:.2f} MB per expert)")
                impls, state = build(w, fw, selected, args, log)
                last = {}
                for T in tokens:
                    rows.append(bench_point(w, T, impls, state, selected, args, log, failures, last, fw, flush))
            finally:
                close_all(impls)
                if fw is not None:
                    fw.close()
                gc.collect()
    finally:
        flush.close()
        del w
        gc.collect()
    return rows


def bench_point(w, T, impls, state, selected, args, log, failures, last, fw=None, flush=None):
    shape = w.shape
    wd = w if fw is None else fw.deq  # the layer ours computes (experts' exact values)
    tag = f"{shape.name} T={T}" + ("" if fw is None else f" [{fw.name}]")
    rng = np.random.default_rng([args.seed, 10, T])
    max_runs = args.repeats * (3 if T <= DECODE_MAX_T else 1)
    if T <= DECODE_MAX_T:
        # Blocks of at least DECODE_BLOCK_CALLS calls where the budget allows: on this VM
        # the first calls after the block's pause run up to 2x slower (the cores went
        # idle), for every implementation, and a model's decode loop calls the layer back
        # to back; with 3-4 calls a block, decode medians were mostly of those cold calls.
        max_runs = max(max_runs, 2 * args.rounds * DECODE_BLOCK_CALLS)
    # xs[0]: checks, xs[1]: warm-ups, xs[2:]: one different input per timed run.
    xs = [rng.standard_normal((T, w.H), dtype=np.float32) for _ in range(max_runs + 2)]
    # More warm-up inputs in decode, so that repeated warm-up calls do not leave one
    # input's experts in the last-level cache.
    warm_xs = [xs[1]] + [rng.standard_normal((T, w.H), dtype=np.float32) for _ in range(7 if T <= DECODE_MAX_T else 0)]
    x0 = xs[0]
    ours = impls["ours"]
    res = {}

    # --- checks ------------------------------------------------------------------------
    t_check, y_ours = timed(ours, x0)
    ids, rw = ours.route(x0)
    keep = ~near_ties(x0, w)
    tol = tolerance(y_ours)
    res["ours"] = dict(status="ok", t_check=t_check)
    y_f32 = None
    if fw is not None:
        # The float32 layer on the same routing: what the format costs in accuracy, and
        # the reference of ggml's own quantizations.
        y_f32 = grouped.moe_grouped(x0, w, ids, rw)
        res["ours"]["rel_rms_vs_f32"] = rel_rms(y_ours, y_f32, keep) if keep.any() else 0.0
    ref_case = None
    if "reference" in selected and "reference" not in state:
        sub, kw = peers.reference_case(wd, x0, ids, max_tokens=args.ref_tokens, budget_bytes=args.ref_gb * 1e9)
        t_ref, y_ref = timed(lambda: reference.moe_forward(x0[sub], **kw))
        diff = float(np.max(np.abs(y_ours[sub] - y_ref)))
        ok = bool(np.all(np.isfinite(y_ours)) and diff <= tolerance(y_ref))
        n_sub = len(sub)
        res["reference"] = dict(status="ok", t_check=t_ref, scale=T / n_sub, tokens_timed=n_sub,
                                experts_float64=int(kw["gate_proj"].shape[0]),
                                check=dict(vs="ours", max_diff=diff, tol=tolerance(y_ref), tokens=n_sub))
        if not ok:
            msg = f"{tag}: ours vs the float64 reference DISAGREE: {diff:.3e} > {tolerance(y_ref):.3e}"
            failures.append(msg)
            log(msg)
            res["ours"]["status"] = "WRONG vs reference"
        ref_case = (sub, kw)
    for name in selected:
        if name in ("ours", "reference"):
            continue
        if name in state:
            res[name] = dict(status=state[name])
            continue
        fn = impls[name]
        if name in last:
            T_prev, s_prev = last[name]
            predicted = s_prev * T / T_prev
            if predicted > args.max_call:
                res[name] = dict(status=f"skipped: ~{predicted:.0f} s per call predicted from T={T_prev} "
                                        f"(> --max-call {args.max_call:g} s)")
                log(f"{tag}: {name} {res[name]['status']}")
                continue
        try:
            t, y = timed(fn, x0)
        except Exception as exc:  # noqa: BLE001
            res[name] = dict(status=f"failed: {exc.__class__.__name__}: {exc}")
            failures.append(f"{tag}: {name} raised {exc.__class__.__name__}: {exc}")
            log(f"{tag}: {name} FAILED: {exc}")
            continue
        y = np.asarray(y, dtype=np.float32).reshape(T, w.H)
        loose = None
        if name in peers.GGML_PEERS and fw is not None and fw.fmt.ggml_type:
            loose = ("ours (same blocks)", y_ours, GGML_SAME_BLOCKS_REL_RMS)
        elif name in peers.GGML_PEERS:
            ref_y = y_f32 if y_f32 is not None else y_ours
            loose = ("float32 layer", ref_y, GGML_REL_RMS[fn.gtype])
        elif name.startswith("ours-"):
            # Another activation quantization of the same weights: what sets it apart from
            # ours is what sets ggml apart on the same blocks.
            loose = ("ours (same weights)", y_ours, GGML_SAME_BLOCKS_REL_RMS)
        elif name == "mlx" and fw is not None and fw.fmt.dense == "bfloat16":
            loose = ("ours", y_ours, MLX_BF16_REL_RMS)
        if loose is None:
            diff = float(np.max(np.abs(y - y_ours)[keep])) if keep.any() else 0.0
            ok = bool(np.all(np.isfinite(y[keep])) and diff <= tol)
            check = dict(vs="ours", max_diff=diff, tol=tol, tokens=int(keep.sum()))
            bad = f"max|y - ours| = {diff:.2e} > {tol:.2e}"
        else:
            vs, ref_y, rtol = loose
            err = rel_rms(y, ref_y, keep) if keep.any() else 0.0
            ok = bool(np.all(np.isfinite(y[keep])) and err <= rtol)
            check = dict(vs=vs, rel_rms=err, tol_rel_rms=rtol, tokens=int(keep.sum()))
            bad = f"relative RMS error vs the {vs} {err:.2e} > {rtol:.2e}"
        if not ok:
            res[name] = dict(status=f"WRONG: {bad}", check=check)
            failures.append(f"{tag}: {name} disagrees: {bad}")
            log(f"{tag}: {name} DISAGREES ({bad}); not timed")
            continue
        res[name] = dict(status="ok", t_check=t, check=check)
        if name.startswith("ours-") and y_f32 is not None:
            res[name]["rel_rms_vs_f32"] = rel_rms(y, y_f32, keep) if keep.any() else 0.0
        if name in peers.GGML_PEERS:
            res[name]["ggml_type"] = fn.gtype
            res[name]["expert_bytes"] = fn.expert_bytes()
            res[name]["placement"] = dict(fn.placement)
        if t > 2.0:
            log(f"{tag}: {name} checked ({t:.1f} s per call)")
    log(f"{tag}: checks done (" + ", ".join(
        f"{n} {r['t_check'] * 1e3:.1f} ms" for n, r in res.items() if r["status"] == "ok") + ")")

    # --- timing ------------------------------------------------------------------------
    calls = {}
    for name, r in res.items():
        if r["status"] != "ok":
            continue
        if name == "reference":
            sub, kw = ref_case
            calls[name] = lambda x, sub=sub, kw=kw: reference.moe_forward(x0[sub], **kw)
        else:
            calls[name] = impls[name]
        if r["t_check"] >= args.max_call / 3 and name != "reference":
            r["runs_planned"] = 0  # very slow: its check call (on a fresh input) is its one timed run
            r["note"] = "1 run (the check call)"
        else:
            r["runs_planned"] = plan_runs(r["t_check"], max_runs, args.budget)
    # Decode points get twice the rounds (shorter blocks): their calls take milliseconds and
    # this machine's speed moves by up to 1.7x from one block to the next, so more blocks
    # per implementation make its median less a matter of which phases it drew.
    want = args.rounds * (2 if T <= DECODE_MAX_T else 1)
    rounds = max(1, min(want, max((r.get("runs_planned", 0) for r in res.values()), default=1)))
    times = {n: ([res[n]["t_check"]] if res[n]["runs_planned"] == 0 else []) for n in calls}
    flush = flush or CacheFlush(0)
    clock = CLOCKS[getattr(args, "clock", "wall")]
    probes = []  # the native read probe in every round of a decode point: the roof at that moment
    reads = []  # seconds to read one call's bytes (its experts, router, shared), per round
    round_of = {n: [] for n in calls}  # the round of each timed run
    for rnd in range(rounds):
        if T <= DECODE_MAX_T and args.point_probe_mb and (p := roofline.native_read(args.point_probe_mb << 20, 2)):
            probes.append(p[0])
            # The call's own bytes read and nothing else, cold: the routing of ours' first
            # input of this round (the '% read' column).
            if "ours" in calls:
                j0 = rnd * -(-res["ours"]["runs_planned"] // rounds)
                ids = np.unique(ours.route(xs[2 + j0])[0])
                flush()
                if (t := roofline.native_read_time([a[e] for a in (fw or w).expert_arrays() for e in ids]
                                                   + w.fixed_arrays())):
                    reads.append(t[0])
        for name, fn in calls.items():
            n = res[name]["runs_planned"]
            per = -(-n // rounds)
            js = range(rnd * per, min(n, (rnd + 1) * per))
            if not js:
                continue
            time.sleep(args.settle)
            if res[name]["t_check"] < args.budget / 2:  # slower calls: the check call was their warm-up
                t_warm, n_warm = time.perf_counter(), 0
                while n_warm == 0 or time.perf_counter() - t_warm < args.warmup:
                    fn(warm_xs[n_warm % len(warm_xs)])
                    n_warm += 1
            for j in js:
                flush()
                t0 = clock()
                fn(xs[2 + j])
                times[name].append(clock() - t0)
                round_of[name].append(rnd)
        if rounds > 1:
            log(f"{tag}: timing round {rnd + 1}/{rounds} done")

    # --- results -----------------------------------------------------------------------
    used = max((len(v) for v in times.values()), default=1)
    distinct = [len(np.unique(ours.route(xs[2 + j])[0])) for j in range(max(1, used))]
    expert_bytes = w.expert_bytes() if fw is None else fw.expert_bytes()
    n_exp = float(np.mean(distinct))
    row = dict(shape=shape.name, family=shape.family, H=w.H, I=w.I, E=w.E, E_model=shape.experts,
               top_k=w.k, shared=shape.shared, activation=shape.activation, biases=shape.biases,
               scale_note=shape.scale_note if w.E != shape.experts else "", T=T,
               distinct_experts=n_exp, expert_bytes=expert_bytes,
               bytes_read=n_exp * expert_bytes + w.fixed_bytes(),
               point_probe_GBps=probes if len(probes) == rounds else None,
               call_read_s=reads if len(reads) == rounds else None,
               flush_bytes=flush.nbytes, flops=w.flops(T), near_tie_tokens=int((~keep).sum()), loadavg=loadavg(), impl={})
    for name in selected:
        r = res.get(name, dict(status="not selected"))
        if name in times and times[name]:
            scale = r.get("scale", 1.0)
            v = [t * scale * 1e3 for t in times[name]]
            r.update(ms=float(np.median(v)), ms_min=float(min(v)), runs=len(v), ms_all=v)
            if len(round_of.get(name, [])) == len(v):  # the check call, if it counts, has no round
                r["ms_rounds"] = [float(np.median([t for t, k in zip(v, round_of[name]) if k == rnd]))
                                  if rnd in round_of[name] else None for rnd in range(rounds)]
            last[name] = (T, float(np.median(v)) / 1e3)
        r.pop("runs_planned", None)
        ours_rounds = res["ours"].get("ms_rounds") if name != "ours" else None
        if ours_rounds and r.get("ms_rounds"):
            pairs = [m / o for m, o in zip(r["ms_rounds"], ours_rounds) if m and o]
            if pairs:
                r["paired_ratio"] = float(np.median(pairs))
                r["paired_ratio_rounds"] = pairs
        # Peer / ours-<mode> too, paired per round in the same way (--activations).
        for other in selected:
            other_rounds = res.get(other, {}).get("ms_rounds") if other.startswith("ours-") else None
            if other != name and other_rounds and r.get("ms_rounds"):
                pairs = [m / o for m, o in zip(r["ms_rounds"], other_rounds) if m and o]
                if pairs:
                    r.setdefault("paired_ratio_vs", {})[other] = float(np.median(pairs))
        if "expert_bytes" in r:  # ggml: its own type's bytes
            r["bytes_read"] = n_exp * r["expert_bytes"] + w.fixed_bytes()
        row["impl"][name] = r
    if fw is not None:
        row["format"] = fw.name
    ours_ms = row["impl"]["ours"].get("ms")
    log(f"{tag}: " + ", ".join(f"{n} {r['ms']:.2f} ms" for n, r in row["impl"].items() if "ms" in r)
        + (f"; ours {T / ours_ms * 1e3:.0f} tok/s" if ours_ms else "") + f" [load {row['loadavg']}]")
    return row
