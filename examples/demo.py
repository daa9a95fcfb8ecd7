#!/usr/bin/env python3
"""A real model's MoE layer in one native call: Qwen3-30B-A3B, float32 and 4-bit.

Builds one Qwen3-30B-A3B-shaped MoE layer (hidden 2048, expert width 768, 128 experts,
top-8, softmax router, norm_topk_prob=True, no shared expert) with seeded random
weights scaled like a real initialisation (normal, std 0.02), then

  * decode  (T = 1):   one token per call, the shape of generating text;
  * prefill (T = 256): a prompt's worth of tokens in one call;

checks both against the float64 NumPy reference (`moe_swift.reference`, the spec line
by line) with the spec tolerance |y - ref| <= 1e-4 * max|ref| + 1e-5, and prints
timings: the median of several calls after a warm-up, with the middle half of the calls
(the slowest call, often far above, is the machine's other work). Each time is one
layer's; the demo says what it implies for the whole model (48 such layers) and what share
of the machine's read bandwidth (moe_swift.read_bandwidth) a decode call uses.

Then the format people run: the same weights quantized as mlx-lm's 4-bit checkpoints
are (affine 4-bit in groups of 64, bfloat16 scales, the router 8-bit), written as a
checkpoint folder (0.34 GB, in a temporary folder deleted at the end) and loaded with
from_pretrained, which maps the file instead of copying it; checked against the
reference on the dequantized values, timed, and compared with float32: how much of the
difference is routing (the 8-bit router sends some tokens to other experts) and how much
the 4-bit experts, beside what rounding the same experts to bfloat16 changes.
Exits 1 if a check fails.

    python examples/demo.py               # the full layer: 2.4 GB of float32 experts, peak 5.3 GB
    python examples/demo.py --experts 32  # fewer experts: peak 1.7 GB, same per-token work
    python examples/demo.py --quick       # small smoke run for CI
    python examples/demo.py --no-4bit     # float32 only
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import moe_swift
from moe_swift import Quantized, formats, reference, synthetic

# Qwen3-30B-A3B (config.json): hidden_size, moe_intermediate_size, num_experts, num_experts_per_tok.
HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 128, 8
MODEL_LAYERS = 48  # num_hidden_layers: every one an MoE layer
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


def rss_anon_gb():
    """Anonymous resident memory of this process now, GB: what copies cost (file pages
    mapped in are the page cache's, not counted); nan where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return float("nan")


class DequantizedExperts:
    """experts[ids] -> the float64 values of experts `ids` of a quantized (E, rows, cols)
    tensor, dequantized on demand (all of them at once would be 4.8 GB)."""

    def __init__(self, q):
        self.q = q

    def __getitem__(self, ids):
        q = self.q
        return formats.dequantize(Quantized(q.weight[ids], q.scales[ids], q.biases[ids], bits=q.bits,
                                            group_size=q.group_size, scale_dtype=q.scale_dtype))


def median_ms(fn, runs, warmup=1, settle=0.5):
    """(median, first quartile, third quartile, max) wall time in ms of fn(i) over `runs`
    back-to-back calls (i = 0..runs-1), after a pause of `settle` s (NumPy's OpenBLAS
    threads, busy after the reference check, go idle; on a small machine they would steal
    a core) and `warmup` untimed calls. The quartiles bound the middle half of the calls:
    a max far above them is a call the machine's other work delayed, not the layer."""
    time.sleep(settle)
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(runs):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    q1, med, q3 = np.percentile(times, [25, 50, 75])
    return 1e3 * float(med), 1e3 * float(q1), 1e3 * float(q3), 1e3 * max(times)


def spread(q1, q3, hi, unit="ms", digits=2):
    """'middle half 3.1-3.4 ms, slowest 5.0': the run-to-run spread of median_ms."""
    return f"middle half {q1:.{digits}f}-{q3:.{digits}f} {unit}, slowest {hi:.{digits}f}"


def model_line(layer_ms, read_bytes, bandwidth):
    """What one layer's decode time implies for the whole model (MODEL_LAYERS MoE layers)
    and how much of the machine's read bandwidth it uses."""
    total = MODEL_LAYERS * layer_ms
    used = read_bytes / (layer_ms * 1e-3) / 1e9
    return (f"  model   Qwen3-30B-A3B has {MODEL_LAYERS} such layers: {total:.0f} ms per token for its experts alone, "
            f"at most {1e3 / total:.1f} tokens/s before attention, norms and the LM head\n"
            f"  reads   {read_bytes / 1e6:.0f} MB of weights per token and layer (router + {TOP_K} experts x 3 "
            f"matrices) -> {used:.1f} GB/s, {used / bandwidth:.0%} of this machine's read bandwidth "
            f"({bandwidth:.1f} GB/s, moe_swift.read_bandwidth()): "
            + ("decode is bound by reading the weights" if used >= 0.7 * bandwidth else
               "the products' arithmetic, not the reading, bounds this decode (for 4-bit codes, "
               "activation_quantization=\"q8\" multiplies them by 8-bit activations in integers, faster)"))


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


def expert_error(x, ids, weights, experts, rounded):
    """Relative RMS change of the experts' output on tokens x (n, H) with routing (ids,
    weights) when their float32 weights `experts` = (gate, up, down) become rounded(w);
    float64 reference arithmetic."""
    exact, moved = [], []
    for t in range(len(x)):
        chosen = [w[ids[t]] for w in experts]
        args = (x[t:t + 1], np.arange(len(ids[t]))[None], weights[t:t + 1])
        exact.append(reference.experts_forward(*args, *chosen))
        moved.append(reference.experts_forward(*args, *(rounded(w) for w in chosen)))
    exact, moved = np.concatenate(exact), np.concatenate(moved)
    return float(np.linalg.norm(moved - exact) / np.linalg.norm(exact))


def run_4bit(router, gate, up, down, checker32, pool, prompt, sub, y32, routing32, ms32, bandwidth,
             decode_runs, prefill_runs):
    """The 4-bit part: quantize, write the checkpoint, load it mapped, check, time, compare."""
    import shutil
    import tempfile

    E, H, I, k = len(router), HIDDEN, INTER, TOP_K
    print("\n4-bit, as mlx-lm stores it (mlx-community/Qwen3-30B-A3B-4bit): affine 4-bit experts in groups "
          "of 64, bfloat16 scales, the router 8-bit")
    t0 = time.perf_counter()
    q = [synthetic.quantize_experts(w) for w in (gate, up, down)]
    q_router = formats.quantize(router, bits=8, group_size=64, scale_dtype="bfloat16")
    folder = tempfile.mkdtemp(prefix="moe_swift_demo_")
    try:
        synthetic.write_qwen3_moe_4bit(folder, experts=E, weights=lambda i: (q_router, *q))
        size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
        print(f"  write   quantized and written in {time.perf_counter() - t0:.1f} s: a checkpoint of "
              f"{size / 1e9:.2f} GB (float32: {E * 3 * I * H * 4 / 1e9:.2f} GB)")
        anon = rss_anon_gb()
        t0 = time.perf_counter()
        layer = moe_swift.from_pretrained(folder, layer=0, backend="auto", progress=False)
        t_load = time.perf_counter() - t0
        grown = rss_anon_gb() - anon
        how = ("its 4-bit codes repacked for the cpu kernels, the rest read in place from the mapped file"
               if layer.backend == "cpu" else "the file mapped, every tensor read in place")
        print(f"  load    from_pretrained {t_load:.2f} s on {layer.backend!r}: anonymous memory +{grown:.2f} GB "
              f"({how})")

        checker = Checker(layer, formats.dequantize(q_router), *(DequantizedExperts(w) for w in q), k)
        y1 = layer(pool[:1])
        print(f"  decode  {checker.check('4-bit decode', pool[:1], y1)}")
        med, q1, q3, hi = median_ms(lambda i: layer(pool[(i + 1) % len(pool)][None]), decode_runs)
        # Per expert and matrix: 4-bit codes + a bf16 scale and bias per 64 weights.
        read = E * H + k * 3 * I * H * (0.5 + 4 / 64)  # the router in 8 bits (+ its scales, ignored)
        print(f"  layer   {med:.2f} ms per token ({spread(q1, q3, hi)}), {ms32['decode'] / med:.1f}x float32's "
              f"{ms32['decode']:.2f} ms: 7x fewer bytes to read")
        print(model_line(med, read, bandwidth))
        yT = layer(prompt)
        print(f"  prefill {checker.check('4-bit prefill', prompt[sub], yT[sub])}")
        med, q1, q3, hi = median_ms(lambda i: layer(prompt), prefill_runs)
        ratio = ms32["prefill"] / med
        print(f"  layer   {med:.1f} ms per call of {len(prompt)} tokens ({spread(q1, q3, hi, digits=1)}), "
              f"{ratio:.2f}x float32's {ms32['prefill']:.1f} ms")
        if ratio < 0.95:
            print("          slower than float32: prefill is bound by arithmetic, not by reading weights, and the "
                  "4-bit experts are first unpacked into float32 tiles for the BLAS product, work that float32's "
                  "weights, handed to BLAS as they are, do not need")

        # What the 4-bit error is made of, and its size against bfloat16's own rounding.
        ids32, w32 = routing32
        ids4, _ = layer.route(prompt)
        rerouted = int(np.sum(np.any(np.sort(ids4, axis=1) != np.sort(ids32, axis=1), axis=1)))
        dev = float(np.linalg.norm(yT - y32) / np.linalg.norm(y32))
        same_routing = layer.experts(prompt, ids32, w32)
        dev_experts = float(np.linalg.norm(same_routing - y32) / np.linalg.norm(y32))
        x = prompt[sub]
        bf16 = expert_error(x, ids32[sub], w32[sub], (gate, up, down),
                            lambda w: formats.bf16_to_float32(formats.float32_to_bf16(w)))
        print(f"  vs f32  output {dev:.1%} from float32's (relative RMS over the prefill): {rerouted} of {len(prompt)} "
              f"tokens chose other experts under the 8-bit router (a changed expert moves a token's output "
              f"a lot); with float32's routing, the 4-bit experts alone: {dev_experts:.1%}")
        print(f"          for scale: rounding the float32 experts to bfloat16, the format the model ships in, moves "
              f"the same experts' output by {bf16:.2%} (on {len(sub)} of the tokens); a 4-bit weight keeps 16 levels "
              f"per group of 64 where bfloat16 keeps 8 significant bits. These are random weights: what 4-bit costs "
              f"a real checkpoint shows in the model's answers, not in this figure")
        checker32.failures += checker.failures
        layer.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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
    p.add_argument("--no-4bit", action="store_true", help="skip the 4-bit layer mapped from a checkpoint")
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
    # The best of 10 reads of 512 MiB: one read disturbed by the machine's other work would
    # make a decode call seem faster than memory.
    bandwidth = moe_swift.read_bandwidth(512 << 20, 10)
    print(f"  backend {layer.backend!r} (available: {', '.join(moe_swift.available_backends())}), "
          f"{os.cpu_count()} CPU cores, memory read at {bandwidth:.1f} GB/s")

    checker = Checker(layer, router, gate, up, down, k)
    rng = np.random.default_rng([args.seed, 2])
    # Hidden states of unit scale, as after a transformer's RMSNorm.
    pool = rng.standard_normal((max(decode_runs + 1, 8), H), dtype=np.float32)
    prompt = rng.standard_normal((T, H), dtype=np.float32)

    # --- decode: T = 1, a different token each call ---------------------------------
    print(f"\ndecode (T = 1), median of {decode_runs} calls after a warm-up, a new token each call")
    y1 = layer(pool[:1])
    print(f"  check   {checker.check('decode', pool[:1], y1)}")
    med, q1, q3, hi = median_ms(lambda i: layer(pool[(i + 1) % len(pool)][None]), decode_runs)
    decode_ms = med
    read = (E * H + k * 3 * I * H) * 4  # router + the k chosen experts, float32
    print(f"  layer   {med:.2f} ms per token for this one layer ({spread(q1, q3, hi)})")
    print(model_line(med, read, bandwidth))

    # --- prefill: T tokens in one call -------------------------------------------------
    print(f"\nprefill (T = {T}), median of {prefill_runs} calls after a warm-up")
    yT = layer(prompt)
    n_check = T if args.check_tokens <= 0 else min(args.check_tokens, T)
    sub = np.unique(np.linspace(0, T - 1, n_check).round().astype(int))
    print(f"  check   {checker.check('prefill', prompt[sub], yT[sub])}")
    if len(sub) < T:
        print(f"          (reference run on {len(sub)} of the {T} tokens, evenly spaced; "
              f"the float64 reference loops over tokens in Python)")
    med, q1, q3, hi = median_ms(lambda i: layer(prompt), prefill_runs)
    prefill_ms = med
    routing = layer.route(prompt)
    touched = len(np.unique(routing[0]))
    flops = 2 * T * (E * H + k * 3 * I * H)
    print(f"  layer   {med:.1f} ms per call of {T} tokens ({spread(q1, q3, hi, digits=1)}): "
          f"{med * 1e3 / T:.0f} us per token and layer; all {MODEL_LAYERS} layers: {T / (MODEL_LAYERS * med * 1e-3):.0f} "
          f"tokens/s of prompt for the experts alone")
    print(f"  work    {T * k} (token, expert) pairs on {touched}/{E} experts, "
          f"{flops / 1e9:.1f} GFLOP  ->  {flops / (med * 1e-3) / 1e9:.1f} GFLOP/s: bound by arithmetic, each "
          f"expert's weights read once for all its tokens")
    print(f"  batching: a prefill token costs 1/{decode_ms / (med / T):.0f} of a decode token")

    if not args.no_4bit:
        # The float32 layer's results for the same tokens, then its memory back before the
        # 4-bit part (the peak stays the float32 part's).
        layer.close()
        run_4bit(router, gate, up, down, checker, pool, prompt, sub, yT, routing,
                 dict(decode=decode_ms, prefill=prefill_ms), bandwidth, decode_runs, prefill_runs)
    else:
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
