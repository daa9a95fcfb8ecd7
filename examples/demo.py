#!/usr/bin/env python3
"""A real model's MoE layer in one native call: Qwen3-30B-A3B on the CPU backend.

Builds one Qwen3-30B-A3B-shaped MoE layer (hidden 2048, expert width 768, 128 experts,
top-8, softmax router, norm_topk_prob=True, no shared expert) with seeded random
weights scaled like a real initialisation (normal, std 0.02), then

  * decode  (T = 1):   one token per call, the shape of generating text;
  * prefill (T = 256): a prompt's worth of tokens in one call;

checks both against the float64 NumPy reference (`moe_swift.reference`, the spec line
by line) with the spec tolerance |y - ref| <= 1e-4 * max|ref| + 1e-5, and prints
timings (median of several runs after a warm-up).  Exits 1 if a check fails.

    python examples/demo.py               # the full layer: 2.4 GB of float32 experts, peak 5.3 GB
    python examples/demo.py --experts 32  # fewer experts: peak 1.7 GB, same per-token work
    python examples/demo.py --quick       # small smoke run for CI
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import moe_swift
from moe_swift import reference

# Qwen3-30B-A3B (config.json): hidden_size, moe_intermediate_size, num_experts, num_experts_per_tok.
HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 128, 8
INIT_STD = 0.02  # the models' initializer_range


def atol_for(ref):
    """The spec's tolerance for one comparison: 1e-4 * max|ref| + 1e-5."""
    return 1e-4 * float(np.max(np.abs(ref))) + 1e-5


def random_weights(E, H, I, seed):
    """router (E, H), gate/up (E, I, H), down (E, H, I): float32 normal(0, INIT_STD).

    Each expert has its own seeded generator, so the weights do not depend on the
    thread count; two threads fill them (NumPy releases the GIL while it fills)."""
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


def peak_gb(E):
    """The demo's expected peak memory with E experts, GB: the float32 weights twice (ours
    and the layer's copy) and about 0.5 GB besides (Python, NumPy, the library and one
    token's experts in float64 for the reference), as measured on Linux."""
    return 2 * E * 3 * INTER * HIDDEN * 4 / 1e9 + 0.5


def rss_gb():
    """Peak resident memory of this process so far, GB (Linux ru_maxrss is in KiB)."""
    try:
        import resource
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return kib * (1 if sys.platform != "darwin" else 1 / 1024) / 1e6
    except Exception:
        return float("nan")


def median_ms(fn, runs, warmup=1, settle=0.5):
    """Median wall time of fn(i) over `runs` back-to-back calls (i = 0..runs-1), after a
    pause of `settle` s (NumPy's OpenBLAS threads, busy after the reference check, go
    idle; on a small machine they would steal a core) and `warmup` untimed calls."""
    time.sleep(settle)
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(runs):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times)), 1e3 * min(times), 1e3 * max(times)


class Checker:
    """Our layer vs the float64 reference on the same tokens.

    The experts stay float32 here: each token's reference converts only its own top_k
    experts to float64, since a float64 copy of all of them would double the demo's peak
    memory (4.8 GB more for the full layer)."""

    def __init__(self, layer, router, gate, up, down, top_k):
        self.layer = layer
        self.router64 = router.astype(np.float64)
        self.gate, self.up, self.down = gate, up, down
        self.top_k = top_k
        self.failures = []

    def check(self, label, x, y):
        """x (n, H) tokens, y (n, H) our outputs for them. Returns a one-line summary."""
        failures_before = len(self.failures)
        ids, w = self.layer.route(x)
        ref_ids, _ = reference.route(x, self.router64, top_k=self.top_k)

        # Routing: the same experts in the same order, or a float64 near-tie between the
        # experts that differ (then both choices are right; outputs use our ids).
        scores = x.astype(np.float64) @ self.router64.T  # float64 logits
        same = np.all(ids == ref_ids, axis=1)
        ties = 0
        for t in np.flatnonzero(~same):
            ours, theirs = np.sort(scores[t, ids[t]]), np.sort(scores[t, ref_ids[t]])
            if np.max(np.abs(ours - theirs)) <= 1e-6 * np.max(np.abs(scores[t])):
                ties += 1
            else:
                self.failures.append(f"{label}: token {t} routed to {ids[t].tolist()}, "
                                     f"reference {ref_ids[t].tolist()}")
        # Routing weights of our ids, float32 vs float64.
        _, ref_w = reference.route(x, self.router64, top_k=self.top_k, ids=ids)
        w_err = float(np.max(np.abs(w - ref_w)))
        if w_err > 1e-5:
            self.failures.append(f"{label}: routing weights differ by {w_err:.2e}")

        ref = np.concatenate([
            reference.experts_forward(x[t:t + 1], np.arange(self.top_k)[None], ref_w[t:t + 1],
                                      self.gate[ids[t]], self.up[ids[t]], self.down[ids[t]])
            for t in range(len(x))])
        err = float(np.max(np.abs(y.astype(np.float64) - ref)))
        tol = atol_for(ref)
        ok = np.all(np.isfinite(y)) and err <= tol
        if not ok:
            self.failures.append(f"{label}: max|y - ref| = {err:.3e} > tolerance {tol:.3e}")
        ok = len(self.failures) == failures_before
        routed = f"{int(same.sum())}/{len(same)} tokens routed identically"
        if ties:
            routed += f", {ties} float64 near-tie(s)"
        return (f"{'PASS' if ok else 'FAIL'}  max|y-ref| = {err:.2e}  (tolerance {tol:.2e}, "
                f"max|ref| = {np.max(np.abs(ref)):.3f}); {routed}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experts", type=int, default=None,
                   help=f"number of routed experts (default {EXPERTS}, the real model; 16 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 16 experts, prefill T=32, fewer timing runs")
    p.add_argument("--prefill", type=int, default=None, help="prefill tokens (default 256; 32 with --quick)")
    p.add_argument("--check-tokens", type=int, default=32,
                   help="prefill tokens checked against the reference (default 32; 0 = all)")
    p.add_argument("--runs", type=int, default=None, help="timed runs per phase (default 9 / 5 prefill; 3 with --quick)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    E = args.experts if args.experts is not None else (16 if args.quick else EXPERTS)
    T = args.prefill if args.prefill is not None else (32 if args.quick else 256)
    decode_runs = args.runs or (3 if args.quick else 9)
    prefill_runs = args.runs or (3 if args.quick else 5)
    H, I, k = HIDDEN, INTER, TOP_K
    if not TOP_K <= E:
        p.error(f"--experts must be at least top_k = {TOP_K}")
    if T < 1:
        p.error("--prefill must be at least 1")

    t_start = time.perf_counter()
    print("moe-swift demo: one Qwen3-30B-A3B MoE layer in one native call")
    print(f"  shape   H={H} I={I} E={E} top_k={k}, softmax router, norm_topk_prob=True, SwiGLU, no shared expert")
    if E != EXPERTS:
        print(f"  NOTE    {E} experts instead of the model's {EXPERTS} (--experts/--quick); "
              f"per-token work is the same, prefill touches fewer distinct experts")
    expert_bytes = E * 3 * I * H * 4
    print(f"  weights float32, normal(0, {INIT_STD}), seed {args.seed}: {expert_bytes / 1e9:.2f} GB of experts")
    print(f"  memory  about {peak_gb(E):.1f} GB at the peak: the weights, the layer's copy and the reference's"
          + (f"; --experts 32 lowers it to {peak_gb(32):.1f} GB" if E > 32 else ""))

    t0 = time.perf_counter()
    router, gate, up, down = random_weights(E, H, I, args.seed)
    t_gen = time.perf_counter() - t0
    t0 = time.perf_counter()
    layer = moe_swift.MoELayer(router, gate, up, down, top_k=k, backend="auto",
                               scoring="softmax", norm_topk_prob=True)
    t_create = time.perf_counter() - t0
    print(f"  setup   weights {t_gen:.1f} s, MoELayer (copies them) {t_create:.1f} s")
    print(f"  backend {layer.backend!r} (available: {', '.join(moe_swift.available_backends())}), "
          f"{os.cpu_count()} CPU cores")

    checker = Checker(layer, router, gate, up, down, k)
    rng = np.random.default_rng([args.seed, 2])
    # Hidden states of unit scale, as after a transformer's RMSNorm.
    pool = rng.standard_normal((max(decode_runs + 1, 8), H), dtype=np.float32)
    prompt = rng.standard_normal((T, H), dtype=np.float32)

    # --- decode: T = 1, a different token each call ---------------------------------
    print(f"\ndecode (T = 1), median of {decode_runs} calls after a warm-up, a new token each call")
    y1 = layer(pool[:1])
    print(f"  check   {checker.check('decode', pool[:1], y1)}")
    med, lo, hi = median_ms(lambda i: layer(pool[(i + 1) % len(pool)][None]), decode_runs)
    decode_ms = med
    read = (E * H + k * 3 * I * H) * 4  # router + the k chosen experts, float32
    print(f"  time    {med:.2f} ms per token (min {lo:.2f}, max {hi:.2f})  ->  {1e3 / med:.0f} tokens/s")
    print(f"  reads   {read / 1e6:.0f} MB of weights per token (router + {k} experts x 3 matrices)"
          f"  ->  {read / (med * 1e-3) / 1e9:.1f} GB/s effective")

    # --- prefill: T tokens in one call -------------------------------------------------
    print(f"\nprefill (T = {T}), median of {prefill_runs} calls after a warm-up")
    yT = layer(prompt)
    n_check = T if args.check_tokens <= 0 else min(args.check_tokens, T)
    sub = np.unique(np.linspace(0, T - 1, n_check).round().astype(int))
    print(f"  check   {checker.check('prefill', prompt[sub], yT[sub])}")
    if len(sub) < T:
        print(f"          (reference run on {len(sub)} of the {T} tokens, evenly spaced; "
              f"the float64 reference loops over tokens in Python)")
    med, lo, hi = median_ms(lambda i: layer(prompt), prefill_runs)
    ids, _ = layer.route(prompt)
    touched = len(np.unique(ids))
    flops = 2 * T * (E * H + k * 3 * I * H)
    print(f"  time    {med:.1f} ms per call (min {lo:.1f}, max {hi:.1f})  ->  "
          f"{med * 1e3 / T:.0f} us per token, {T / (med * 1e-3):.0f} tokens/s")
    print(f"  work    {T * k} (token, expert) pairs on {touched}/{E} experts, "
          f"{flops / 1e9:.1f} GFLOP  ->  {flops / (med * 1e-3) / 1e9:.1f} GFLOP/s")
    print(f"  batching: a prefill token costs 1/{decode_ms / (med / T):.0f} of a decode token")

    layer.close()
    total = time.perf_counter() - t_start
    print(f"\npeak memory {rss_gb():.1f} GB, total {total:.1f} s")
    if checker.failures:
        print("FAILED:")
        for f in checker.failures:
            print(f"  {f}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
