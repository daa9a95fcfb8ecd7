"""A model of the Metal backend's speed on Apple GPUs, derived from the shapes - no Apple
GPU is reachable from this project, so nothing here is measured.

For one forward of one layer it lists the dispatches that MetalLayerEncoder encodes (the
Metal README's "Dispatches per forward"), and for each: threadgroups, the bytes it must
move from device memory, the bytes its threadgroups request (re-reads that the GPU
caches should serve), the FLOPs it executes, and a roofline time per chip:

    time = max(dram_bytes / (bandwidth * occupancy), flops / (fp32 peak * occupancy)) + launch

where occupancy = min(1, threadgroups / GPU cores): a dispatch of fewer threadgroups than
cores gets that share of the chip (an assumption: one core may pull more than its share
of the bandwidth, so this overestimates small dispatches such as the single-threadgroup
bucketing); the decode router's top-k dispatch adds a serial tail (softmax and arg-max
rounds that no bandwidth bounds).
A forward adds one command-buffer commit + wait; `run_layers` of n layers pays it once.

    python benchmarks/bench_metal.py --model          # prints the tables, writes benchmarks/results/metal_model.json

Routing is taken to be uniform (each token picks k distinct experts at random): an
expert's pair count is Binomial(T, k/E), which gives the distinct experts of a decode
step and the 32-row GEMM tiles of prefill. `tests/python/test_metal_model.py` checks the
accounting against independently computed sizes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

# The kernels' constants (Sources/MoEKernels/Metal/moe_kernel_params.h).
ROUTER_MAX_TOKENS = 8
ROUTER_GEMV_SIMDGROUPS = 4   # decode router: router rows per threadgroup (one per simdgroup)
DECODE_MAX_TOKENS = 4
GEMV_ROWS = 16                 # decode GEMVs: output rows per threadgroup (4 simdgroups x 4 rows)
GEMV_ROWS_PER_SIMDGROUP = 4    # a simdgroup reads each token's inputs once for its 4 rows
GEMM_BM = 32                   # prefill GEMMs: bucket rows per tile
GEMM_GATE_UP_BN = 32           # gate/up: 32 gate + the same 32 up columns per threadgroup
GEMM_DOWN_BN = 64              # down: 64 output columns per threadgroup
COMBINE_THREADS = 256
F32 = 4


@dataclass(frozen=True)
class Chip:
    name: str
    bandwidth_gbs: float  # Apple's published unified-memory bandwidth
    gpu_cores: int
    clock_ghz: float      # GPU clock: not published by Apple (see ASSUMPTIONS)

    @property
    def fp32_tflops(self) -> float:
        """128 FP32 ALUs per core, one FMA (2 FLOPs) per ALU per clock."""
        return self.gpu_cores * 128 * 2 * self.clock_ghz / 1e3


CHIPS = [
    Chip("M2 Max 38c", 400, 38, 1.398),
    Chip("M3 Max 30c", 300, 30, 1.398),
    Chip("M3 Max 40c", 400, 40, 1.398),
    Chip("M4 Max 32c", 410, 32, 1.578),
    Chip("M4 Max 40c", 546, 40, 1.578),
]

# Per-dispatch and per-command-buffer costs: (low, high) in microseconds.
LAUNCH_US = (5.0, 10.0)
COMMIT_WAIT_US = (50.0, 100.0)
# The decode router's top-k dispatch: its serial work after reading the logits (an
# assumption, see ASSUMPTIONS).
ROUTER_TAIL_US = 2.0

ASSUMPTIONS = {
    "bandwidth": "Apple's published memory bandwidth per chip bin: M2 Max 400 GB/s; M3 Max 300 GB/s "
                 "(14-core CPU / 30-core GPU) and 400 GB/s (16 / 40); M4 Max 410 GB/s (14 / 32) and 546 GB/s (16 / 40). "
                 "The roofline uses all of it (real kernels reach perhaps 70-90%).",
    "fp32_peak": "cores x 128 FP32 ALUs x 2 FLOPs x GPU clock. The clocks are assumptions from third-party "
                 "reports (Apple publishes none): 1.398 GHz for M2 and M3 (M2 Max 38-core = 13.6 TFLOPs), "
                 "1.578 GHz for M4. simdgroup_float8x8 GEMMs reach a fraction of this peak.",
    "occupancy": "a dispatch of n threadgroups runs at min(1, n / cores) of the chip's bandwidth and FLOPs "
                 "(an assumption; pessimistic for single-threadgroup dispatches).",
    "launch": f"{LAUNCH_US[0]:g}-{LAUNCH_US[1]:g} us per dependent dispatch in one serial compute encoder. "
              "The low end is a third party's measurement on an Apple GPU (github.com/antonellof/ferrox "
              "issue 149: 832 extra dispatches cost 5.16 us each of GPU time); the high end is an assumption.",
    "commit_wait": f"{COMMIT_WAIT_US[0]:g}-{COMMIT_WAIT_US[1]:g} us per command buffer commit + waitUntilCompleted "
                   "round trip: an assumption (no measurement here).",
    "router_tail": f"{ROUTER_TAIL_US:g} us added to the decode router's top-k dispatch (T <= 4; a threadgroup per "
                   "token): softmax/sigmoid and k rounds of a simdgroup arg-max over the token's E logits "
                   "(an assumption). The top-k is a dispatch of its own, after the logits, because MSL 3.1 orders "
                   "no hand-off between threadgroups of one dispatch: it costs one launch more than a "
                   "last-threadgroup hand-off would.",
    "routing": "uniform: each token picks k distinct experts at random; expert loads Binomial(T, k/E).",
    "kernels": "every dispatch is taken to reach the roofline of its occupancy. What makes a kernel get there "
               "(loads in flight, inputs read once per 4 GEMV rows, 32 x 64 double-buffered GEMM tiles: issue 12) "
               "shows in requested_bytes and threadgroups, not in the modelled time.",
    "caches": "dram_bytes counts each buffer's bytes once (re-reads hit the GPU caches); requested_bytes "
              "counts what the threadgroups ask for.",
}

# MLX's figure to compare with (given in issue 12, not verified here): Qwen3-30B-A3B 4-bit,
# decode, M4 Max. Its per-layer time includes attention, norms and the model's share of
# embedding / lm_head, not just the MoE block.
MLX_FIGURE = dict(chip="M4 Max 40c", tokens_per_s=113.0, layers=48,
                  source="the figure quoted in issue 12 for mlx-lm, Qwen3-30B-A3B 4-bit; not verified here")


@dataclass(frozen=True)
class Format:
    name: str
    bits: int
    group: int = 0        # elements per scale (0: dense)
    scale_bytes: int = 0  # bytes of one scale + its bias (affine: two float16; mxfp4: one E8M0 byte)

    def matrix_bytes(self, rows: int, cols: int) -> int:
        """Bytes of a (rows, cols) matrix stored in this format: codes + scales (+ biases)."""
        n = rows * cols * self.bits // 8
        if self.group:
            n += rows * (cols // self.group) * self.scale_bytes
        return n


FORMATS = {
    "f32": Format("f32", 32),
    "bf16": Format("bf16", 16),
    "q8": Format("q8", 8, 64, 4),      # MLX affine, float16 scale + float16 bias per 64
    "q4": Format("q4", 4, 64, 4),      # mlx-lm's default
    "mxfp4": Format("mxfp4", 4, 32, 1),
}


@dataclass(frozen=True)
class LayerShape:
    hidden: int = 2048
    inter: int = 768
    experts: int = 128
    top_k: int = 8
    name: str = "qwen3-30b-a3b"


QWEN3 = LayerShape()


@dataclass
class Dispatch:
    kernel: str
    threadgroups: int
    dram_bytes: float        # compulsory device-memory traffic
    requested_bytes: float   # what the threadgroups read and write, re-reads included
    weight_bytes: float      # the weight part of dram_bytes
    flops: float             # executed (GEMM tiles padded to 32 rows)
    times_us: dict = field(default_factory=dict)   # chip -> (low, high)
    tail_us: float = 0.0     # serial work after the roofline part (the decode router's top-k)


def expected_distinct(T: int, E: int, k: int) -> float:
    """Expected number of experts chosen by at least one of T tokens."""
    return E * (1.0 - (1.0 - k / E) ** T)


def expected_tiles(T: int, E: int, k: int, bm: int = GEMM_BM) -> float:
    """Expected sum over experts of ceil(pairs_e / bm), pairs_e ~ Binomial(T, k/E)."""
    p = k / E
    total = 0.0
    for n in range(1, T + 1):
        logp = (math.lgamma(T + 1) - math.lgamma(n + 1) - math.lgamma(T - n + 1)
                + n * math.log(p) + (T - n) * math.log1p(-p)) if p < 1 else (0.0 if n == T else -math.inf)
        total += math.exp(logp) * math.ceil(n / bm)
    return E * total


def dispatches(shape: LayerShape, T: int, fmt: str, router_fmt: str = "f32") -> list[Dispatch]:
    """The dispatches of one forward of T tokens (no shared expert, no norms, no residual),
    as MetalLayerEncoder encodes them."""
    H, I, E, k = shape.hidden, shape.inter, shape.experts, shape.top_k
    f, rf = FORMATS[fmt], FORMATS[router_fmt]
    P = T * k
    out = []

    rw = rf.matrix_bytes(E, H)
    io = T * H * F32 + P * 8 + T * F32
    if T <= DECODE_MAX_TOKENS:
        # moe_router_gemv: one router row per simdgroup, 4 rows per threadgroup, every token
        # in every threadgroup (x re-read per threadgroup); it writes the logits. Then
        # moe_router_topk, a threadgroup per token, reads them and writes the routing.
        groups = -(-E // ROUTER_GEMV_SIMDGROUPS)
        logits = T * E * F32
        x = T * H * F32
        out.append(Dispatch("router", groups, rw + x + logits, rw + groups * x + logits, rw, 2.0 * T * E * H))
        topk = logits + P * 8 + T * F32
        out.append(Dispatch("router_topk", T, topk, topk, 0.0, 0.0, tail_us=ROUTER_TAIL_US))
    else:
        # moe_router: up to 8 tokens per threadgroup (fewer when E is large); each reads the whole router.
        per_group = max(1, min(T, ROUTER_MAX_TOKENS, 6144 // (3 * E + 1)))
        groups = -(-T // per_group)
        out.append(Dispatch("router", groups, rw + io, groups * rw + io, rw, 2.0 * T * E * H))

    gate_up_w = f.matrix_bytes(I, H) * 2   # one expert's gate + up
    down_w = f.matrix_bytes(H, I)
    if T <= DECODE_MAX_TOKENS:
        # GEMVs: a threadgroup per (16 rows, pair); duplicates of an expert exit, so each
        # distinct expert's rows are read once for all its tokens. A simdgroup reads each of
        # its tokens' inputs once for its 4 rows (requested: inputs x rows / 4); rows past
        # the end of the last threadgroup are computed and dropped (executed FLOPs).
        d = expected_distinct(T, E, k)
        w = d * gate_up_w
        io = T * H * F32 + P * I * F32
        rows = -(-I // GEMV_ROWS) * GEMV_ROWS
        out.append(Dispatch("gate_up_gemv", round(d * -(-I // GEMV_ROWS)), w + io,
                            w + P * (rows // GEMV_ROWS_PER_SIMDGROUP) * H * F32 + P * I * F32, w,
                            2.0 * 2 * P * rows * H))
        w = d * down_w
        io = P * I * F32 + P * F32 + P * H * F32
        rows = -(-H // GEMV_ROWS) * GEMV_ROWS
        out.append(Dispatch("down_gemv", round(d * -(-H // GEMV_ROWS)), w + io,
                            w + P * (rows // GEMV_ROWS_PER_SIMDGROUP) * I * F32 + io - P * I * F32, w,
                            2.0 * P * rows * I))
    else:
        tiles = expected_tiles(T, E, k)
        hit = expected_distinct(T, E, k)
        io = P * F32 * 3 + (E + 1) * F32 + tiles * 8 + 32
        out.append(Dispatch("bucket", 1, io, io + P * F32, 0.0, 0.0))
        # GEMMs: a threadgroup per (32-row tile, column tile); each reads its tile's inputs
        # (re-read per column tile) and its columns' weights (re-read per row tile). FLOPs
        # as executed: padded rows of partial tiles and padded columns of the last tile.
        ct = -(-I // GEMM_GATE_UP_BN)
        w = hit * gate_up_w
        io = T * H * F32 + P * I * F32
        out.append(Dispatch("gate_up_gemm", round(tiles * ct), w + io,
                            tiles * gate_up_w + tiles * ct * GEMM_BM * H * F32 + P * I * F32, w,
                            2.0 * 2 * tiles * GEMM_BM * (ct * GEMM_GATE_UP_BN) * H))
        ct = -(-H // GEMM_DOWN_BN)
        w = hit * down_w
        io = P * I * F32 + P * F32 + P * H * F32
        out.append(Dispatch("down_gemm", round(tiles * ct), w + io,
                            tiles * down_w + tiles * ct * GEMM_BM * I * F32 + P * (H + 1) * F32, w,
                            2.0 * tiles * GEMM_BM * (ct * GEMM_DOWN_BN) * I))
    io = P * H * F32 + T * H * F32
    out.append(Dispatch("combine", -(-H // COMBINE_THREADS) * T, io, io, 0.0, float(P * H)))
    return out


def dispatch_time_us(d: Dispatch, chip: Chip, launch_us: float) -> float:
    occupancy = min(1.0, d.threadgroups / chip.gpu_cores)
    memory = d.dram_bytes / (chip.bandwidth_gbs * 1e9 * occupancy)
    compute = d.flops / (chip.fp32_tflops * 1e12 * occupancy)
    return max(memory, compute) * 1e6 + d.tail_us + launch_us


def bound(d: Dispatch, chip: Chip) -> str:
    return "mem" if d.dram_bytes / (chip.bandwidth_gbs * 1e9) >= d.flops / (chip.fp32_tflops * 1e12) else "flop"


def model(shape: LayerShape = QWEN3, tokens=(1, 512), formats=tuple(FORMATS), chips=CHIPS,
          router_fmt: str = "f32", stack_layers: int = 48) -> dict:
    """Every (format, T): the dispatches with their times per chip, and per chip the
    layer's time as one forward (+ commit + wait) and as one of `stack_layers` layers of
    one run_layers call (commit + wait shared)."""
    cases = []
    for fmt in formats:
        for T in tokens:
            ds = dispatches(shape, T, fmt, router_fmt)
            per_chip = {}
            for chip in chips:
                lo = [dispatch_time_us(d, chip, LAUNCH_US[0]) for d in ds]
                hi = [dispatch_time_us(d, chip, LAUNCH_US[1]) for d in ds]
                for d, a, b in zip(ds, lo, hi):
                    d.times_us[chip.name] = (a, b)
                per_chip[chip.name] = dict(
                    forward_us=(sum(lo) + COMMIT_WAIT_US[0], sum(hi) + COMMIT_WAIT_US[1]),
                    stacked_layer_us=(sum(lo) + COMMIT_WAIT_US[0] / stack_layers,
                                      sum(hi) + COMMIT_WAIT_US[1] / stack_layers),
                    bounds=[bound(d, chip) for d in ds])
            cases.append(dict(format=fmt, tokens=T, dispatches=[asdict(d) for d in ds],
                              dram_bytes=sum(d.dram_bytes for d in ds), weight_bytes=sum(d.weight_bytes for d in ds),
                              flops=sum(d.flops for d in ds), chips=per_chip))
    mlx_layer_us = 1e6 / MLX_FIGURE["tokens_per_s"] / MLX_FIGURE["layers"]
    return dict(shape=asdict(shape), router_format=router_fmt, stack_layers=stack_layers,
                chips=[dict(asdict(c), fp32_tflops=c.fp32_tflops) for c in chips],
                launch_us=LAUNCH_US, commit_wait_us=COMMIT_WAIT_US, assumptions=ASSUMPTIONS,
                mlx=dict(MLX_FIGURE, per_layer_us=mlx_layer_us), cases=cases)


def _mb(x: float) -> str:
    return f"{x / 1e6:.3f}" if x < 1e7 else f"{x / 1e6:.1f}"


def _us(pair) -> str:
    a, b = pair
    return f"{a:.0f}-{b:.0f}" if b >= 100 else f"{a:.1f}-{b:.1f}"


def report(m: dict) -> str:
    """The model as text tables."""
    s = m["shape"]
    chips = [c["name"] for c in m["chips"]]
    lines = [f"Model of the Metal backend (nothing measured): {s['name']} H={s['hidden']} I={s['inter']} "
             f"E={s['experts']} k={s['top_k']}, router {m['router_format']}, no shared expert", ""]
    lines.append("chips: " + "; ".join(f"{c['name']} {c['bandwidth_gbs']:g} GB/s {c['fp32_tflops']:.1f} TFLOPs"
                                        for c in m["chips"]))
    lines.append("")
    for case in m["cases"]:
        lines.append(f"-- {case['format']}, T={case['tokens']}: dram {_mb(case['dram_bytes'])} MB "
                     f"(weights {_mb(case['weight_bytes'])} MB), {case['flops'] / 1e9:.3f} GFLOP; time per dispatch in us "
                     f"(launch {m['launch_us'][0]:g}-{m['launch_us'][1]:g} us included)")
        head = f"{'dispatch':14s} {'TGs':>6s} {'dram MB':>9s} {'req MB':>9s} {'GFLOP':>8s} " + " ".join(f"{c:>13s}" for c in chips)
        lines.append(head)
        for d in case["dispatches"]:
            lines.append(f"{d['kernel']:14s} {d['threadgroups']:6d} {_mb(d['dram_bytes']):>9s} {_mb(d['requested_bytes']):>9s} "
                         f"{d['flops'] / 1e9:8.3f} " + " ".join(f"{_us(d['times_us'][c]):>13s}" for c in chips))
        lines.append(f"{'forward':14s} {'':6s} {'':9s} {'':9s} {'':8s} "
                     + " ".join(f"{_us(case['chips'][c]['forward_us']):>13s}" for c in chips)
                     + f"   (+ commit/wait {m['commit_wait_us'][0]:g}-{m['commit_wait_us'][1]:g} us)")
        lines.append(f"{'layer of ' + str(m['stack_layers']):14s} {'':6s} {'':9s} {'':9s} {'':8s} "
                     + " ".join(f"{_us(case['chips'][c]['stacked_layer_us']):>13s}" for c in chips)
                     + "   (one run_layers call of the stack)")
        lines.append("")
    mlx = m["mlx"]
    lines.append(f"Decode, one token, per layer (us; {m['stack_layers']} layers in one run_layers call):")
    lines.append(f"{'format':8s} " + " ".join(f"{c:>13s}" for c in chips))
    for case in m["cases"]:
        if case["tokens"] == 1:
            lines.append(f"{case['format']:8s} " + " ".join(f"{_us(case['chips'][c]['stacked_layer_us']):>13s}" for c in chips))
    lines.append(f"MLX: {mlx['tokens_per_s']:g} tokens/s on the {mlx['chip']} = 1/{mlx['tokens_per_s']:g} s / "
                 f"{mlx['layers']} layers = {mlx['per_layer_us']:.0f} us per layer, attention and the rest of the "
                 f"layer included; {mlx['source']}.")
    lines.append("llama.cpp: no published figure for this model and chip is known here.")
    lines.append("")
    lines.append("Assumptions:")
    lines += [f"- {k}: {v}" for k, v in m["assumptions"].items()]
    return "\n".join(lines)
