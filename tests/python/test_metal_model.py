"""The Metal speed model (benchmarks/moe_bench/metal_model.py, `bench_metal.py --model`):
its byte and FLOP accounting against sizes computed independently, and its dispatch plan against
the budgets of the Metal README."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moe_swift import formats
from moe_bench import metal_model as mm

H, I, E, K = 2048, 768, 128, 8


def quantized_nbytes(rows, cols, **quant):
    """Bytes of a (rows, cols) matrix as moe_swift.formats.quantize stores it."""
    q = formats.quantize(np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32), **quant)
    return sum(a.nbytes for a in (q.weight, q.scales, q.biases) if a is not None)


def test_q4_decode_reads_eight_experts_and_the_router():
    # One expert of the Qwen3-30B-A3B shape in mlx-lm's 4-bit format: gate and up (I, H), down (H, I).
    q4 = dict(bits=4, group_size=64, scale_dtype="float16")
    expert = 2 * quantized_nbytes(I, H, **q4) + quantized_nbytes(H, I, **q4)
    router = E * H * 4  # float32
    ds = mm.dispatches(mm.QWEN3, 1, "q4")
    assert sum(d.weight_bytes for d in ds) == pytest.approx(8 * expert + router, rel=1e-12)
    # Everything else a decode step moves is activations: a small fraction.
    dram = sum(d.dram_bytes for d in ds)
    assert 8 * expert + router < dram < 1.02 * (8 * expert + router)


@pytest.mark.parametrize("fmt,bits_per_weight", [("f32", 32), ("bf16", 16), ("q8", 8.5), ("q4", 4.5), ("mxfp4", 4.25)])
def test_format_sizes(fmt, bits_per_weight):
    assert mm.FORMATS[fmt].matrix_bytes(I, H) * 8 == I * H * bits_per_weight
    if fmt == "mxfp4":
        assert mm.FORMATS[fmt].matrix_bytes(I, H) == quantized_nbytes(I, H, mode="mxfp4")


def test_dispatch_plan_matches_the_budgets():
    decode = [d.kernel for d in mm.dispatches(mm.QWEN3, 1, "f32")]
    prefill = [d.kernel for d in mm.dispatches(mm.QWEN3, 512, "f32")]
    assert decode == ["router", "router_topk", "gate_up_gemv", "down_gemv", "combine"]
    assert prefill == ["router", "bucket", "gate_up_gemm", "down_gemm", "combine"]
    assert [d.kernel for d in mm.dispatches(mm.QWEN3, 4, "q4")] == decode  # MOE_DECODE_MAX_TOKENS
    # The decode router's logits (moe_router_gemv) are a threadgroup per 4 router rows, its
    # top-k a threadgroup per token; in prefill (moe_router) a threadgroup per 8 tokens.
    assert mm.dispatches(mm.QWEN3, 1, "q4")[0].threadgroups == E // 4 == 32
    assert mm.dispatches(mm.QWEN3, 4, "q4")[0].threadgroups == 32
    assert [mm.dispatches(mm.QWEN3, T, "q4")[1].threadgroups for T in (1, 4)] == [1, 4]
    assert mm.dispatches(mm.QWEN3, 5, "q4")[0].threadgroups == 1
    assert mm.dispatches(mm.QWEN3, 512, "q4")[0].threadgroups == 64
    assert mm.dispatches(mm.LayerShape(experts=30), 1, "q4")[0].threadgroups == 8


def test_decode_router_is_spread_over_the_cores():
    """Issue 12: at T = 1 the router weight (E x H float32, 1 MiB) is read by 32
    threadgroups, not one: on a 40-core M3 Max it is no longer the longest dispatch, and its
    time is the roofline of 32/40 of the chip plus the launch. The top-k is a dispatch of
    its own (issue 22: no hand-off between threadgroups of one dispatch): the serial tail
    and one launch more."""
    ds = mm.dispatches(mm.QWEN3, 1, "q4")
    router, topk = ds[0], ds[1]
    assert router.weight_bytes == E * H * 4 and topk.weight_bytes == 0
    assert (router.tail_us, topk.tail_us) == (0.0, mm.ROUTER_TAIL_US)
    # x is re-read by every threadgroup (from cache); the logits go out, and back in the top-k.
    assert router.requested_bytes == pytest.approx(E * H * 4 + 32 * H * 4 + E * 4)
    assert topk.requested_bytes == pytest.approx(E * 4 + K * 8 + 4)
    chip = next(c for c in mm.CHIPS if c.name == "M3 Max 40c")
    t = mm.dispatch_time_us(router, chip, 0.0)
    assert t == pytest.approx(router.dram_bytes / (400e9 * 32 / 40) * 1e6)
    assert t < min(mm.dispatch_time_us(d, chip, 0.0) for d in ds[2:4])
    assert mm.dispatch_time_us(topk, chip, 5.0) == pytest.approx(topk.dram_bytes / (400e9 / 40) * 1e6 + 2.0 + 5.0)


def test_prefill_flops_and_weights():
    ds = mm.dispatches(mm.QWEN3, 512, "f32")
    useful = 2.0 * 512 * (E * H + K * 3 * I * H)
    flops = sum(d.flops for d in ds)
    # Executed FLOPs include the zero rows of partial 32-row tiles: more than useful, not double.
    assert useful < flops < 2 * useful
    # At T = 512 every expert is chosen (P(an expert unused) = (15/16)^512 ~ 5e-15).
    assert sum(d.weight_bytes for d in ds) == pytest.approx(E * 3 * I * H * 4 + E * H * 4, rel=1e-9)


def test_routing_expectations():
    assert mm.expected_distinct(1, E, K) == pytest.approx(8)
    assert mm.expected_distinct(2, E, K) == pytest.approx(8 + 8 * 120 / 128)
    # Tiles: at least one per used expert and the pairs over 32; here by simulation.
    rng = np.random.default_rng(0)
    sims = []
    for _ in range(200):
        ids = np.argsort(rng.random((512, E)), axis=1)[:, :K]
        counts = np.bincount(ids.ravel(), minlength=E)
        sims.append(sum(math.ceil(c / 32) for c in counts))
    assert mm.expected_tiles(512, E, K) == pytest.approx(np.mean(sims), rel=0.02)


def test_times_follow_bandwidth():
    m = mm.model(formats=("q4",), tokens=(1,))
    case = m["cases"][0]
    by = {c["name"]: c for c in m["chips"]}
    lo = {name: v["forward_us"][0] for name, v in case["chips"].items()}
    assert by["M3 Max 30c"]["bandwidth_gbs"] < by["M3 Max 40c"]["bandwidth_gbs"] < by["M4 Max 40c"]["bandwidth_gbs"]
    assert lo["M3 Max 30c"] > lo["M3 Max 40c"] > lo["M4 Max 40c"] > 0
    assert m["mlx"]["per_layer_us"] == pytest.approx(1e6 / 113 / 48)


def test_bench_metal_model_writes_json(tmp_path):
    out = tmp_path / "model.json"
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_metal.py"
    r = subprocess.run([sys.executable, str(script), "--model", "--json", str(out)], capture_output=True, text=True,
                       check=True)
    assert "router" in r.stdout and "M3 Max 40c" in r.stdout and "Assumptions" in r.stdout
    data = json.loads(out.read_text())
    assert {(c["format"], c["tokens"]) for c in data["cases"]} == {(f, t) for f in mm.FORMATS for t in (1, 512)}


def test_constants_match_the_kernels():
    """The model's tile sizes are those of moe_kernel_params.h (read like the kernel tests do)."""
    from metal_kernels import CONST

    assert mm.GEMV_ROWS == CONST["MOE_GEMV_ROWS"] == 16
    assert mm.GEMV_ROWS_PER_SIMDGROUP == CONST["MOE_GEMV_ROWS_PER_SIMDGROUP"]
    assert mm.DECODE_MAX_TOKENS == CONST["MOE_DECODE_MAX_TOKENS"]
    assert mm.ROUTER_GEMV_SIMDGROUPS == CONST["MOE_ROUTER_GEMV_SIMDGROUPS"]
    assert mm.ROUTER_MAX_TOKENS == CONST["MOE_ROUTER_MAX_TOKENS"]
    assert mm.GEMM_BM == CONST["MOE_GEMM_BM"]
    assert mm.GEMM_GATE_UP_BN == CONST["MOE_GEMM_GATE_UP_BN"]
    assert mm.GEMM_DOWN_BN == CONST["MOE_GEMM_DOWN_BN"]
    assert mm.COMBINE_THREADS == CONST["MOE_COMBINE_THREADS"]


def test_decode_gemvs_read_inputs_once_per_four_rows():
    """Issue 12: a GEMV threadgroup is 16 rows (4 simdgroups x 4 rows); a simdgroup loads
    each token's inputs once for its 4 rows, so the requested input bytes are a quarter of
    one read per row."""
    gate_up, down = mm.dispatches(mm.QWEN3, 1, "q4")[2:4]
    assert (gate_up.threadgroups, down.threadgroups) == (8 * I // 16, 8 * H // 16) == (384, 1024)
    P = K  # T = 1
    assert gate_up.requested_bytes == pytest.approx(gate_up.weight_bytes + P * (I // 4) * H * 4 + P * I * 4)
    assert down.requested_bytes == pytest.approx(down.weight_bytes + P * (H // 4) * I * 4 + P * 4 + P * H * 4)
    assert (gate_up.flops, down.flops) == (2.0 * 2 * P * I * H, 2.0 * P * H * I)  # I, H multiples of 16
    # Rows past the end are computed and dropped: I = 770 executes 784 rows.
    odd = mm.dispatches(mm.LayerShape(inter=770), 1, "q4")[2]
    assert odd.threadgroups == 8 * 49 and odd.flops == 2.0 * 2 * P * 784 * H


def test_prefill_gemm_tiles():
    """Gate/up: 32 columns of gate and up per threadgroup; down: 64 columns (half the
    threadgroups and half the input re-reads of 32)."""
    gate_up, down = mm.dispatches(mm.QWEN3, 512, "q4")[2:4]
    tiles = mm.expected_tiles(512, E, K)
    assert gate_up.threadgroups == round(tiles * I / 32)
    assert down.threadgroups == round(tiles * H / 64)
    assert down.requested_bytes == pytest.approx(tiles * down.weight_bytes / E + tiles * (H // 64) * 32 * I * 4
                                                 + 512 * K * (H + 1) * 4)
