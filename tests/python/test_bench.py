"""The benchmark suite (benchmarks/moe_bench) on tiny layers: the grouped NumPy baseline
and every installed peer compute the spec's layer, the checks and the timing loop produce
rows, the tables, JSON and plot are written. (torch, transformers and MLX are not CI dependencies: their tests
skip when the package is missing.)"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from moe_swift import reference
from moe_bench import grouped, peers, report, roofline
from moe_bench.__main__ import main, parse_args
from moe_bench.runner import bench_shape, tolerance
from moe_bench.shapes import SHAPES, Weights
from moe_bench.weightformats import FormatWeights


def tiny(name, E=8):
    """The shape's family settings with small sizes (I != H so layouts cannot be confused)."""
    s = SHAPES[name]
    return replace(s, hidden=48, inter=40, experts=E, default_experts=E, top_k=min(s.top_k, 4),
                   shared=80 if s.shared else 0)


def args(**kw):
    base = dict(seed=0, repeats=2, budget=0.05, max_call=30.0, rounds=2, settle=0.0, warmup=0.0, ref_tokens=3, ref_gb=0.1,
                point_probe_mb=0)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("name", list(SHAPES))
def test_grouped_matches_reference(name):
    w = Weights(tiny(name), 8)
    x = np.random.default_rng(1).standard_normal((13, w.H), dtype=np.float32)
    ids, wts = grouped.route(x, w.router, w.k, norm_topk_prob=w.shape.norm_topk_prob, router_bias=w.router_bias)
    y = grouped.moe_grouped(x, w)
    ref = reference.moe_forward(x, ids=ids, **{k: v for k, v in w.layer_kwargs().items()})
    assert np.max(np.abs(y - ref)) <= tolerance(ref)
    # the routing too (no near-ties on this data)
    ref_ids, ref_w = reference.route(x, w.router, top_k=w.k, norm_topk_prob=w.shape.norm_topk_prob,
                                     router_bias=w.router_bias)
    assert (ids == ref_ids).all()
    assert np.allclose(wts, ref_w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", list(SHAPES))
def test_reference_case_subset(name):
    """The reference on a token subset with only its experts (router rows permuted) gives
    the full reference's output for those tokens."""
    w = Weights(tiny(name), 8)
    x = np.random.default_rng(2).standard_normal((9, w.H), dtype=np.float32)
    ids, _ = grouped.route(x, w.router, w.k, norm_topk_prob=w.shape.norm_topk_prob, router_bias=w.router_bias)
    sub, kw = peers.reference_case(w, x, ids, max_tokens=3, budget_bytes=1e9)
    assert len(sub) == 3 and kw["gate_proj"].shape[0] <= 3 * w.k
    full = reference.moe_forward(x[sub], ids=ids[sub], **w.layer_kwargs())
    assert np.allclose(reference.moe_forward(x[sub], **kw), full, rtol=1e-12, atol=1e-12)


def test_bench_shape_rows():
    shape = tiny("deepseek-v2-lite")
    failures = []
    rows = bench_shape(shape, 8, [1, 16], ["ours", "numpy", "reference"], args(), lambda m: None, failures)
    assert failures == []
    assert [r["T"] for r in rows] == [1, 16]
    for r in rows:
        for n in ("ours", "numpy", "reference"):
            d = r["impl"][n]
            assert d["status"] == "ok" and d["ms"] > 0 and d["runs"] >= 1, (n, d)
        assert r["impl"]["reference"]["check"]["max_diff"] <= r["impl"]["reference"]["check"]["tol"]
    roof = dict(GBps=10.0, GFLOPs=100.0)
    report.add_fractions(rows, roof)
    assert rows[0]["bound"] == "bandwidth" and rows[1]["bound"] == "gemm"
    assert rows[0]["impl"]["ours"]["roofline_fraction"] > 0
    text = report.tables(rows, ["ours", "numpy", "reference"], roof)
    assert "deepseek-v2-lite" in text and "Roofline" in text


def test_decode_blocks_hold_enough_calls():
    """Decode points time at least DECODE_BLOCK_CALLS calls per block where the budget
    allows (the first calls after a block's pause are the cold ones); other points keep
    --repeats."""
    from moe_bench.runner import DECODE_BLOCK_CALLS
    rows = bench_shape(tiny("qwen3-30b-a3b"), 8, [1, 16], ["ours"], args(budget=5.0), lambda m: None, [])
    decode, other = (r["impl"]["ours"] for r in rows)
    assert decode["runs"] == 2 * 2 * DECODE_BLOCK_CALLS  # rounds=2, doubled for decode
    assert all(m is not None for m in decode["ms_rounds"]) and len(decode["ms_rounds"]) == 4
    assert other["runs"] == 2


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("peer", ["torch-eager", "torch-grouped", "mlx"])
def test_optional_peer_agrees_with_ours(name, peer):
    if peers.status(peer) is not None:
        pytest.skip(f"{peer}: {peers.status(peer)}")
    w = Weights(tiny(name), 8)
    x = np.random.default_rng(3).standard_normal((11, w.H), dtype=np.float32)
    ours = peers.Ours(w)
    try:
        if peer == "mlx":
            impl = peers.MLXLayer(w)
        else:
            impl = peers.TorchBlock(w).impl(peer)
        y, y_ours = impl(x), ours(x)
    finally:
        ours.close()
    assert np.max(np.abs(y - y_ours)) <= tolerance(y_ours)


def test_missing_peer_is_named(monkeypatch):
    monkeypatch.setitem(peers._STATUS, "mlx", "not installed (test)")
    shape = tiny("qwen3-30b-a3b")
    rows = bench_shape(shape, 8, [1], ["ours", "mlx"], args(), lambda m: None, [])
    assert rows[0]["impl"]["mlx"]["status"] == "not installed (test)"
    report.add_fractions(rows, dict(GBps=10.0, GFLOPs=100.0))
    text = report.tables(rows, ["ours", "mlx"], dict(GBps=10.0, GFLOPs=100.0))
    assert "not installed" in text and "mlx: not installed (test)" in text


def test_env_warning(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    assert any("OPENBLAS_CORETYPE" in w for w in roofline.env_warnings())
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    monkeypatch.delenv("OPENBLAS_L2_SIZE", raising=False)
    assert not any(w.startswith("WARNING") for w in roofline.env_warnings())


def test_cli_tiny_run(tmp_path, monkeypatch, capsys):
    """The command end to end on a tiny shape: table, JSON, and the PNG or the reason it
    was skipped."""
    import moe_bench.__main__ as cli
    monkeypatch.setitem(cli.SHAPES, "tiny-olmoe", replace(tiny("olmoe-1b-7b"), name="tiny-olmoe"))
    monkeypatch.setattr(cli.roofline, "measure", lambda **kw: dict(
        gemv_matrix_bytes=1 << 20, gemv_GBps_best=10.0, gemv_GBps_median=9.0, gemm_n=64,
        gemm_GFLOPs_best=100.0, gemm_GFLOPs_median=90.0, gemv_GBps_all=[10.0], gemm_GFLOPs_all=[100.0]))
    out = tmp_path / "b.json"
    rc = main(["--shapes", "tiny-olmoe", "--tokens", "1,4", "--peers", "ours,numpy,reference", "--json", str(out),
               "--repeats", "2", "--budget", "0.05", "--settle", "0", "--rounds", "1", "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "tiny-olmoe" in text and "torch-eager    not selected" in text
    data = json.loads(out.read_text())
    assert [r["T"] for r in data["rows"]] == [1, 4] and data["failures"] == []
    png = out.with_suffix(".png")
    if importlib.util.find_spec("matplotlib"):
        assert png.stat().st_size > 1000
    else:
        assert "plot skipped" in text


# --- weight formats (--formats), the ggml peer, the read probe -------------------------------

FORMAT_NAMES = ["f32", "bf16", "q8", "q4", "mxfp4"]


def tiny_formats(name="qwen3-30b-a3b", H=128, I=64, E=8):
    """A layer whose rows are multiples of the formats' group sizes (64)."""
    s = SHAPES[name]
    return replace(s, hidden=H, inter=I, experts=E, default_experts=E, top_k=min(s.top_k, 4),
                   shared=128 if s.shared else 0)


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "deepseek-v2-lite", "gpt-oss-20b"])
def test_every_format_runs_and_checks(name):
    """ours in every format against the float64 reference (on the format's exact values)
    and NumPy on the dequantized weights; rows carry the format and its bytes."""
    failures = []
    rows = bench_shape(tiny_formats(name), 8, [1, 5], ["ours", "numpy", "reference"], args(), lambda m: None,
                       failures, formats=FORMAT_NAMES)
    assert failures == []
    assert [(r["format"], r["T"]) for r in rows] == [(f, T) for f in FORMAT_NAMES for T in (1, 5)]
    per_expert = {r["format"]: r["expert_bytes"] for r in rows}
    assert per_expert["f32"] == 2 * per_expert["bf16"] - (0 if name != "gpt-oss-20b" else (2 * 64 + 128) * 4)
    assert per_expert["q4"] < per_expert["q8"] < per_expert["bf16"]
    assert per_expert["mxfp4"] < per_expert["q4"]
    for r in rows:
        for n in ("ours", "numpy", "reference"):
            d = r["impl"][n]
            assert d["status"] == "ok" and d["ms"] > 0, (r["format"], n, d)
        assert r["impl"]["reference"]["check"]["max_diff"] <= r["impl"]["reference"]["check"]["tol"]
        err = r["impl"]["ours"]["rel_rms_vs_f32"]
        assert err < {"f32": 1e-5, "bf16": 1e-2, "q8": 3e-2, "q4": 0.3, "mxfp4": 0.35}[r["format"]], (r["format"], err)
    roof = dict(GBps=10.0, GFLOPs=100.0, GEMV_GBps=10.0, stream_GBps=9.0)
    report.add_fractions(rows, roof)
    text = report.formats_tables(rows, ["ours", "numpy", "reference"], roof)
    for f in FORMAT_NAMES:
        assert f" {f} " in text


def test_missing_peers_are_named_in_formats(monkeypatch):
    for n in ("mlx", "ggml", "ggml-k"):
        monkeypatch.setitem(peers._STATUS, n, f"not installed ({n} test)")
    rows = bench_shape(tiny_formats(), 8, [1], ["ours", "mlx", "ggml", "ggml-k"], args(), lambda m: None, [],
                       formats=["q4"])
    roof = dict(GBps=10.0, GFLOPs=100.0)
    report.add_fractions(rows, roof)
    text = report.formats_tables(rows, ["ours", "mlx", "ggml", "ggml-k"], roof)
    for n in ("mlx", "ggml", "ggml-k"):
        assert rows[0]["impl"][n]["status"] == f"not installed ({n} test)"
        assert f"{n}: not installed ({n} test)" in text


def test_point_probe_gives_the_roof_at_the_moment():
    """A decode point runs the native read probe at the start of each round and reports
    each implementation's median per round against that round's probe, the median over
    the rounds (the '% now' column); a prefill point does not."""
    rows = bench_shape(tiny_formats(), 8, [1, 16], ["ours", "numpy"], args(point_probe_mb=64), lambda m: None,
                       [], formats=["q8"])
    decode, prefill = rows
    probes = decode["point_probe_GBps"]
    assert len(probes) == 4 and min(probes) > 0.5 and prefill["point_probe_GBps"] is None  # 2 x --rounds
    roof = dict(GBps=10.0, GFLOPs=100.0)
    report.add_fractions(rows, roof)
    for name in ("ours", "numpy"):
        d = decode["impl"][name]
        assert len(d["ms_rounds"]) == 4 and any(d["ms_rounds"])  # None: a round without runs of it
        per = [decode["bytes_read"] / (ms * 1e-3) / 1e9 / p for ms, p in zip(d["ms_rounds"], probes) if ms]
        assert d["point_probe_fraction"] == pytest.approx(np.median(per))
    assert "point_probe_fraction" not in prefill["impl"]["ours"]
    # '% read': each round's time to read the call's own bytes over ours' median in that round.
    reads = decode["call_read_s"]
    assert len(reads) == 4 and min(reads) > 0 and prefill["call_read_s"] is None
    ours = decode["impl"]["ours"]
    assert ours["call_read_fraction"] == pytest.approx(
        np.median([s * 1e3 / ms for ms, s in zip(ours["ms_rounds"], reads) if ms]))
    text = report.formats_tables(rows, ["ours"], roof)
    assert "% now" in text and f"{ours['point_probe_fraction'] * 100:.0f}%" in text
    assert "% read" in text and f"{ours['call_read_fraction'] * 100:.0f}%" in text


def test_point_probe_size_is_checked():
    with pytest.raises(SystemExit):
        parse_args(["--point-probe-mb", "8"])


def test_above_roof_is_flagged():
    rows = bench_shape(tiny_formats(), 8, [1], ["ours", "numpy"], args(), lambda m: None, [], formats=["q8"])
    roof = dict(GBps=1e-6, GFLOPs=100.0)
    report.add_fractions(rows, roof)
    assert rows[0]["impl"]["numpy"]["above_roof"]
    assert "WARNING: above the bandwidth roof" in report.formats_tables(rows, ["ours", "numpy"], roof)


GGML_TYPES = ["F32", "BF16", "Q8_0", "Q4_0", "Q4_K", "MXFP4"]


# The ggml builds and the peer that runs each (the native one is skipped until
# benchmarks/native/build_llama_cpp.sh has built it).
GGML_BUILD_PEERS = {"wheel": "ggml", "native": "ggml-native"}


def need_ggml(build="wheel"):
    name = GGML_BUILD_PEERS[build]
    if peers.status(name) is not None:
        pytest.skip(f"{name}: {peers.status(name)}")
    from moe_bench import ggml
    return ggml


@pytest.mark.parametrize("build", list(GGML_BUILD_PEERS))
@pytest.mark.parametrize("shape", ["qwen3-30b-a3b", "gpt-oss-20b"])
@pytest.mark.parametrize("gtype", GGML_TYPES)
def test_ggml_matches_reference(gtype, shape, build):
    """ggml's mul_mat_id graph on its own quantization of the float32 weights, with our
    routing, against the float32 layer (loosely: ggml quantizes weights and activations);
    gpt-oss with its expert biases (add_id) and swiglu_oai."""
    ggml = need_ggml(build)
    from moe_bench.runner import GGML_REL_RMS, rel_rms
    w = Weights(tiny_formats(shape, H=256, I=256), 8)
    x = np.random.default_rng(5).standard_normal((7, w.H), dtype=np.float32)
    ours = peers.Ours(w)
    layer = ggml.GGMLLayer(w, gtype, ours.route, 2, build=build)
    try:
        ids, wts = ours.route(x)
        y_ref = grouped.moe_grouped(x, w, ids, wts)
        y = layer(x)
        y1 = layer(x[:1])  # a second graph (other T) on the same weights
    finally:
        layer.close()
        ours.close()
    keep = np.ones(len(x), bool)
    assert rel_rms(y, y_ref, keep) <= GGML_REL_RMS[gtype]
    assert rel_rms(y1, y_ref[:1], keep[:1]) <= GGML_REL_RMS[gtype]
    if gtype == "F32":
        assert np.max(np.abs(y - y_ref)) <= tolerance(y_ref)
    else:  # a wrong layout would be as far off as the output is large
        assert rel_rms(y, y_ref, keep) > 1e-6


def test_ggml_not_applicable():
    ggml = need_ggml()
    assert "n/a" in ggml.supports(Weights(tiny_formats("deepseek-v2-lite"), 8), "Q4_0")
    assert ggml.supports(Weights(tiny_formats("gpt-oss-20b", H=256, I=256), 8), "Q4_0") is None
    assert "multiples of 256" in ggml.supports(Weights(tiny_formats(), 8), "Q4_K")


@pytest.mark.parametrize("build", list(GGML_BUILD_PEERS))
@pytest.mark.parametrize("gtype", ["Q4_0", "Q4_K", "MXFP4", "Q8_0", "F32"])
def test_ggml_weights_placed_as_llama_cpp_does(gtype, build):
    """Expert weights go to the CPU device's extra buffer type (CPU_REPACK) where the
    device takes the mul_mat_id on them, else host memory; repacked or not, the same
    blocks give the same layer; the threadpool is llama.cpp's (poll 50, not paused)."""
    ggml = need_ggml(build)
    L = ggml.lib(build)
    names = [n for _, n in L.extra_bufts()]
    w = Weights(tiny_formats(H=256, I=256), 8)
    x = np.random.default_rng(7).standard_normal((5, w.H), dtype=np.float32)
    ours = peers.Ours(w)
    blocks = tuple(ggml.quantize_experts(m, gtype, build=build) for m in (w.gate(), w.up(), w.down))
    packed = ggml.GGMLLayer(w, gtype, ours.route, 2, blocks=blocks, build=build)
    plain = ggml.GGMLLayer(w, gtype, ours.route, 2, blocks=blocks, repack=False, build=build)
    try:
        y, y_plain = packed(x), plain(x)
        assert set(plain.placement.values()) == {"CPU (host memory)"}
        assert packed.poll == 50 and not packed.paused_at_start and not hasattr(packed, "pause")
        where = set(packed.placement.values())
        if gtype in ("Q4_0", "Q4_K", "MXFP4") and "CPU_REPACK" in names and "avx2" in L.isa().split():
            assert where == {"CPU_REPACK"}, packed.describe()
        if gtype == "F32":
            assert where == {"CPU (host memory)"}
            assert np.array_equal(y, y_plain)
        else:  # the same blocks and 8-bit activations, summed in another order
            assert np.max(np.abs(y - y_plain)) <= 1e-3 * np.max(np.abs(y_plain))
    finally:
        packed.close()
        plain.close()
        ours.close()


def test_ggml_builds_side_by_side():
    """The wheel's ggml and the native build run in one process (the native one from
    copies renamed apart): two libraries, each its own version, and on the same blocks the
    same layer up to their 8-bit activations."""
    need_ggml("wheel")
    ggml = need_ggml("native")
    from moe_bench.runner import GGML_SAME_BLOCKS_REL_RMS, rel_rms
    wheel, native = ggml.lib("wheel"), ggml.lib("native")
    assert wheel.base._handle != native.base._handle and wheel.cpu._handle != native.cpu._handle
    assert "wheel" in ggml.origin("wheel") and "AVX2" in ggml.origin("wheel")
    assert native.version().decode() in ggml.origin("native")
    w = Weights(tiny_formats(H=256, I=256), 8)
    x = np.random.default_rng(8).standard_normal((6, w.H), dtype=np.float32)
    ours = peers.Ours(w)
    blocks = tuple(ggml.quantize_experts(m, "Q4_K") for m in (w.gate(), w.up(), w.down))
    layers = [ggml.GGMLLayer(w, "Q4_K", ours.route, 2, blocks=blocks, build=b) for b in ("wheel", "native")]
    try:
        y_wheel, y_native = (layer(x) for layer in layers)
        assert "OpenMP" in layers[1].describe() or "threadpool" in layers[1].describe()
    finally:
        for layer in layers:
            layer.close()
        ours.close()
    assert rel_rms(y_native, y_wheel, np.ones(len(x), bool)) <= GGML_SAME_BLOCKS_REL_RMS


def test_ggml_native_missing_names_the_build_command(tmp_path, monkeypatch):
    """Without a native build the ggml-native peers say how to make one, and so does
    llama_bench; --ggml-native-lib points the peers at another directory."""
    from moe_bench import ggml, llama_bench
    monkeypatch.setattr(ggml, "_LIBS", {})
    monkeypatch.setattr(ggml, "_ERRS", {})
    monkeypatch.setattr(ggml, "native_root", lambda: tmp_path / "llama.cpp-native")
    monkeypatch.delenv(ggml.NATIVE_LIB_ENV, raising=False)
    why = ggml.status("native")
    assert why.startswith("not built") and ggml.NATIVE_BUILD_COMMAND in why
    with pytest.raises(FileNotFoundError, match="build_llama_cpp.sh"):
        llama_bench.llama_bench(tmp_path / "x.gguf", prompt=8, generate=4, threads=1, repetitions=1)
    monkeypatch.setattr(ggml, "_ERRS", {})
    monkeypatch.setenv(ggml.NATIVE_LIB_ENV, "unset by parse_args")
    parse_args(["--ggml-native-lib", str(tmp_path)])
    assert ggml.native_lib_dir() == tmp_path
    assert ggml.NATIVE_LIB_ENV in ggml.status("native")
    assert set(peers.GGML_PEERS) <= set(peers.PEERS) and {b for b, _ in peers.GGML_PEERS.values()} == set(ggml.BUILDS)


def test_llama_bench_reads_its_json(tmp_path, monkeypatch):
    """llama_bench() runs llama-bench with -o json and returns its pp and tg tokens/s (a
    stand-in binary prints what llama-bench prints)."""
    from moe_bench import ggml, llama_bench
    rows = [dict(build_commit="abc1234", build_number=1, cpu_info="some CPU", model_type="qwen3moe 30B.A3B Q4_K - Medium",
                 model_size=2_000_000_000, model_n_params=3_000_000_000, n_threads=2, n_prompt=n_p, n_gen=n_g,
                 avg_ts=ts, stddev_ts=sd, samples_ts=[ts - sd, ts + sd])
            for n_p, n_g, ts, sd in ((64, 0, 100.0, 2.0), (0, 16, 10.0, 0.5))]
    exe = tmp_path / "llama-bench"
    exe.write_text("#!/bin/sh\necho \"$@\" > " + str(tmp_path / "args") + "\ncat <<'EOF'\n" + json.dumps(rows)
                   + "\nEOF\n")
    exe.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setenv(ggml.NATIVE_LIB_ENV, str(tmp_path))
    monkeypatch.setattr(ggml, "_LIBS", {})  # the build string looks for ggml beside the binary
    monkeypatch.setattr(ggml, "_ERRS", {})
    res = llama_bench.llama_bench(model, prompt=64, generate=16, threads=2, repetitions=2)
    assert (tmp_path / "args").read_text().split() == ["-m", str(model), "-p", "64", "-n", "16", "-t", "2", "-r", "2",
                                                       "-o", "json"]
    assert (res["prefill_tps"], res["prefill_sd"], res["decode_tps"], res["decode_sd"]) == (100.0, 2.0, 10.0, 0.5)
    assert res["decode_samples"] == [9.5, 10.5] and res["build"].startswith("llama.cpp abc1234")
    assert "pp64" in llama_bench.table(res) and "tg16" in llama_bench.table(res)
    with pytest.raises(ValueError):
        llama_bench.llama_bench(model, prompt=0, generate=0, threads=2, repetitions=1)
    exe.write_text("#!/bin/sh\necho 'llama_model_load: error loading model' >&2\nexit 1\n")
    with pytest.raises(RuntimeError, match="error loading model"):
        llama_bench.llama_bench(model, prompt=8, generate=0, threads=1, repetitions=1)


def test_llama_bench_runs_a_made_model(tmp_path):
    """The native llama-bench loads make_gguf_model.py's file (its Qwen3-style tokenizer
    included) and runs pp and tg on it. Skipped without the native build."""
    from moe_bench import ggml, llama_bench
    if not llama_bench.binary().exists():
        pytest.skip(f"llama-bench not built ({ggml.NATIVE_BUILD_COMMAND})")
    need_ggml()
    pytest.importorskip("gguf")
    import make_gguf_model as mk
    c = dict(mk.QWEN3_30B_A3B, layers=2, hidden=256, expert_inter=256, experts=8, experts_used=2, heads=8,
             heads_kv=2, head_dim=32, vocab=264, dense_inter=512)
    path = tmp_path / "tiny.gguf"
    mk.write(path, c, log=lambda m: None)
    res = llama_bench.llama_bench(path, prompt=8, generate=4, threads=1, repetitions=1, timeout=120)
    assert res["prefill_tps"] > 0 and res["decode_tps"] > 0 and "qwen3moe" in res["model_type"]


def test_ggml_dequantize_is_ggml_s():
    """The exact values of the ggml formats (what the NumPy peer and the reference get)
    are ggml's own dequantization: bit for bit the gguf package's NumPy code."""
    ggml = need_ggml()
    gguf = pytest.importorskip("gguf")
    from gguf import quants
    m = np.random.default_rng(3).standard_normal((2, 3, 512), dtype=np.float32)
    for gtype in ("Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "MXFP4", "IQ4_NL"):
        b = ggml.quantize_experts(m, gtype)
        d = ggml.dequantize(b, gtype, 512)
        ref = quants.dequantize(b, gguf.GGMLQuantizationType[gtype]).astype(np.float32)
        assert d.shape == m.shape and np.array_equal(d.view(np.uint32), ref.view(np.uint32)), gtype
    with pytest.raises(ValueError, match="rows of"):
        ggml.dequantize(b[..., :-1], "IQ4_NL", 512)


def test_ggml_formats_are_the_option_rows():
    """--formats accepts every ggml block row of moe_swift.options.FORMATS, by its name."""
    from moe_swift import options
    from moe_bench import weightformats
    rows = {f for f, _, _ in options.GGML_TYPES.values()} - {"float32", "float16", "bfloat16"}
    assert rows and rows <= set(weightformats.FORMATS)
    for f in rows:
        fmt = weightformats.FORMATS[f]
        assert fmt.ggml_type and fmt.ggml == (fmt.ggml_type, None)
    assert weightformats.FORMATS["q4_K"].bits_per_weight == 4.5
    assert weightformats.FORMATS["mxfp4_ggml"].ggml_type == "MXFP4"


@pytest.mark.parametrize("fmt", ["q4_K", "q8_0", "mxfp4_ggml", "q6_K"])
def test_ggml_format_same_blocks(fmt):
    """In a ggml format ours and ggml's mul_mat_id read the very same blocks: ours matches
    the float64 reference on ggml's dequantization, ggml matches ours up to its 8-bit
    activations. Skipped until this build's layer takes ggml blocks on the cpu backend."""
    need_ggml()
    from moe_bench import weightformats
    if weightformats.status(fmt):
        pytest.skip(f"{fmt}: {weightformats.status(fmt)}")
    failures = []
    rows = bench_shape(tiny_formats(H=256, I=256), 8, [1, 5], ["ours", "numpy", "reference", "mlx", "ggml"], args(),
                       lambda m: None, failures, formats=[fmt])
    assert not failures, failures
    for r in rows:
        assert r["format"] == fmt
        assert r["impl"]["reference"]["status"] == "ok" and r["impl"]["numpy"]["status"] == "ok"
        g = r["impl"]["ggml"]
        assert g["status"] == "ok" and g["check"]["vs"] == "ours (same blocks)", g
        assert r["impl"]["mlx"]["status"].startswith("n/a")


def test_cache_flush_and_paired_ratios():
    """A flush before every timed call (recorded in the row), and every peer's ratio to
    ours paired per round."""
    from moe_bench.runner import CacheFlush, flush_bytes, l3_bytes
    assert l3_bytes() >= 1 << 20
    assert flush_bytes(SimpleNamespace(flush_mb=None)) == 2 * l3_bytes()
    assert flush_bytes(SimpleNamespace(flush_mb=0)) == 0 and flush_bytes(SimpleNamespace(flush_mb=3)) == 3 << 20
    f = CacheFlush(4 << 20)
    f()
    f.close()
    rows = bench_shape(tiny_formats(), 8, [1], ["ours", "numpy"], args(flush_mb=4), lambda m: None, [])
    r = rows[0]
    assert r["flush_bytes"] == 4 << 20
    n, o = r["impl"]["numpy"], r["impl"]["ours"]
    pairs = [a / b for a, b in zip(n["ms_rounds"], o["ms_rounds"]) if a and b]
    assert n["paired_ratio"] == pytest.approx(np.median(pairs)) and "paired_ratio" not in o


@pytest.mark.parametrize("fmt", ["q8", "q4", "mxfp4"])
def test_mlx_quantized_agrees_with_ours(fmt):
    if peers.status("mlx") is not None:
        pytest.skip(f"mlx: {peers.status('mlx')}")
    from moe_bench.weightformats import FormatWeights
    w = Weights(tiny_formats(), 8)
    fw = FormatWeights(w, fmt)
    x = np.random.default_rng(6).standard_normal((9, w.H), dtype=np.float32)
    ours = peers.Ours(w, fw)
    try:
        y, y_ours = peers.MLXLayer(w, fw)(x), ours(x)
    finally:
        ours.close()
    assert np.max(np.abs(y - y_ours)) <= tolerance(y_ours)


def test_stream_read_probe():
    r = roofline.stream_read(np.ones(1 << 22, np.float32), runs=2, settle=0.0)
    assert r["best"] > 0 and "threads" in r["method"]
    c = roofline.combine(dict(gemv_GBps_best=5.0, stream_GBps_best=7.0, gemm_GFLOPs_best=1.0),
                         dict(gemv_GBps_best=6.0, stream_GBps_best=6.5, gemm_GFLOPs_best=2.0))
    assert c == dict(GBps=7.0, GEMV_GBps=6.0, stream_GBps=7.0, GFLOPs=2.0)


def test_native_read_probe():
    """moe_measure_read_bandwidth, the native part of the roof: a rate on 64 MiB with the
    CPU kernels' loads, and each bad argument named."""
    import moe_swift
    from moe_swift import _native
    ffi, lib, _ = _native.load()
    out = ffi.new("double *")
    assert lib.moe_measure_read_bandwidth(64 << 20, 2, out) == lib.MOE_OK and out[0] > 0.1
    gbps, isa = roofline.native_read(64 << 20, 1)
    assert gbps > 0.1 and isa == moe_swift.cpu_instruction_set()
    for args, words in [((1 << 20, 1, out), "at least 64 MiB"), ((64 << 20, 0, out), "repeats"),
                        ((64 << 20, 1, ffi.NULL), "gb_per_s is NULL")]:
        assert lib.moe_measure_read_bandwidth(*args) == lib.MOE_ERROR_INVALID_ARGUMENT
        assert words in ffi.string(lib.moe_last_error()).decode()


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gpt-oss-20b"])
def test_call_read_covers_every_format(name):
    """'% read' reads each format's expert arrays in place (gpt-oss's float32 gate and up
    are interleaved views of one array: the master's rows are read), and the bytes a row
    reports are those arrays' per expert."""
    fmts = ["f32", "q4"] + ([] if peers.status("ggml") else ["q4_0"])  # ggml makes the q4_0 blocks
    rows = bench_shape(tiny_formats(name), 8, [1], ["ours"], args(point_probe_mb=64), lambda m: None, [],
                       formats=fmts)
    assert [r["format"] for r in rows] == fmts
    for r in rows:
        assert r["call_read_s"] and min(r["call_read_s"]) > 0
    shape = tiny_formats(name)
    w = Weights(shape, 8)
    for f in fmts:
        fw = FormatWeights(w, f)
        arrays = fw.expert_arrays()
        assert all(a.flags.c_contiguous and a.shape[0] == 8 for a in arrays)
        assert fw.expert_bytes() == sum(a.nbytes for a in arrays) // 8
    assert FormatWeights(w, "f32").expert_bytes() == w.expert_bytes() == 3 * shape.inter * shape.hidden * 4 + (
        (2 * shape.inter + shape.hidden) * 4 if shape.biases else 0)


def test_native_read_time():
    """moe_measure_read_time, the roof of one call: the library's threads read the given
    regions once, each from its first 64-byte boundary in whole 256-byte steps; each bad
    argument named."""
    from moe_swift import _native
    ffi, lib, _ = _native.load()
    a = np.ones(3 << 20, np.uint8)
    regions = [a[1:1 + 100_000], a[1 << 20:(1 << 20) + 256], a[2 << 20:(2 << 20) + 255], a[:0]]
    seconds, nbytes = roofline.native_read_time(regions)

    def whole(r):  # the bytes read of region r
        skip = -r.ctypes.data % 64
        return max(0, (r.nbytes - skip) // 256 * 256)
    assert seconds > 0 and nbytes == sum(whole(r) for r in regions) and nbytes > 99_000
    assert roofline.native_read_time([])[1] == 0
    with pytest.raises(ValueError, match="contiguous"):
        roofline.native_read_time([a[::2]])
    out, n = ffi.new("double *"), ffi.new("int64_t *")
    start = ffi.new("void *[]", [ffi.cast("void *", a.ctypes.data)])
    for args, words in [((start, ffi.new("int64_t[]", [-1]), 1, out, n), "bytes[0] is negative"),
                        ((ffi.new("void *[]", [ffi.NULL]), ffi.new("int64_t[]", [64]), 1, out, n), "starts[0] is NULL"),
                        ((start, ffi.new("int64_t[]", [64]), -1, out, n), "count must not be negative"),
                        ((ffi.NULL, ffi.NULL, 1, out, n), "must not be NULL"),
                        ((start, ffi.new("int64_t[]", [64]), 1, ffi.NULL, n), "seconds is NULL")]:
        assert lib.moe_measure_read_time(*args) == lib.MOE_ERROR_INVALID_ARGUMENT
        assert words in ffi.string(lib.moe_last_error()).decode()


def _tiny_cli(monkeypatch):
    """The CLI with the shape "tiny-qwen" and a fixed roofline (no measuring)."""
    import moe_bench.__main__ as cli
    monkeypatch.setitem(cli.SHAPES, "tiny-qwen", replace(tiny_formats(), name="tiny-qwen"))
    monkeypatch.setattr(cli.roofline, "measure", lambda **kw: dict(
        gemv_matrix_bytes=1 << 20, gemv_GBps_best=10.0, gemv_GBps_median=9.0, stream_GBps_best=12.0,
        stream_GBps_median=11.0, stream_method="test", gemm_n=64, gemm_GFLOPs_best=100.0,
        gemm_GFLOPs_median=90.0, gemv_GBps_all=[10.0], gemm_GFLOPs_all=[100.0]))


def test_cli_formats(tmp_path, monkeypatch, capsys):
    _tiny_cli(monkeypatch)
    out = tmp_path / "f.json"
    rc = main(["--shapes", "tiny-qwen", "--tokens", "1", "--formats", "f32,q4", "--peers", "ours,numpy",
               "--json", str(out), "--repeats", "1", "--budget", "0.02", "--settle", "0", "--rounds", "1",
               "--quiet", "--no-plot"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "% roof" in text and "read probe" in text
    data = json.loads(out.read_text())
    assert [r["format"] for r in data["rows"]] == ["f32", "q4"]
    assert data["settings"]["formats"] == ["f32", "q4"] and data["roofline"]["used"]["GBps"] == 12.0


def test_cli_activations(tmp_path, monkeypatch, capsys):
    """--activations none,q8: ours-q8 is timed in the same rounds as ours, checked against
    ours, with the peers' paired ratios against it too."""
    _tiny_cli(monkeypatch)
    out = tmp_path / "a.json"
    rc = main(["--shapes", "tiny-qwen", "--tokens", "1", "--formats", "q4", "--peers", "ours,numpy",
               "--activations", "none,q8", "--json", str(out), "--repeats", "1", "--budget", "0.02",
               "--settle", "0", "--rounds", "1", "--quiet", "--no-plot"])
    assert rc == 0
    assert "ours-q8 ms" in capsys.readouterr().out
    q4, = json.loads(out.read_text())["rows"]
    q8 = q4["impl"]["ours-q8"]
    assert q8["status"] == "ok" and q8["ms"] > 0 and 0 < q8["check"]["rel_rms"] <= q8["check"]["tol_rel_rms"]
    assert q8["rel_rms_vs_f32"] > 0
    assert "ours-q8" in q4["impl"]["numpy"]["paired_ratio_vs"]
    with pytest.raises(SystemExit):
        parse_args(["--activations", "q4"])


def test_make_gguf_model_writes_qwen3moe_q4_k_m(tmp_path):
    """benchmarks/make_gguf_model.py on a tiny config: llama.cpp's qwen3moe names, keys and
    the Q4_K_M mix (Q6_K ffn_down_exps / attn_v in use_more_bits layers), readable by the
    gguf package, the experts' values near the normal(0, 0.02) they were drawn from."""
    need_ggml()
    gguf = pytest.importorskip("gguf")
    import make_gguf_model as mk
    c = dict(mk.QWEN3_30B_A3B, layers=2, hidden=256, expert_inter=256, experts=4, experts_used=2, heads=8,
             heads_kv=2, head_dim=32, vocab=264, dense_inter=512)
    path = tmp_path / "tiny.gguf"
    info = mk.write(path, c, log=lambda m: None)
    r = gguf.GGUFReader(path)
    assert r.fields["general.architecture"].contents() == "qwen3moe"
    assert r.fields["qwen3moe.expert_count"].contents() == 4
    assert r.fields["qwen3moe.expert_used_count"].contents() == 2
    assert r.fields["general.file_type"].contents() == mk.FTYPE_MOSTLY_Q4_K_M
    # The tokenizer as Qwen3's converter writes it: byte-level BPE, every merge makes a token.
    assert r.fields["tokenizer.ggml.model"].contents() == "gpt2" and r.fields["tokenizer.ggml.pre"].contents() == "qwen2"
    tokens, merges = r.fields["tokenizer.ggml.tokens"].contents(), r.fields["tokenizer.ggml.merges"].contents()
    assert len(tokens) == len(set(tokens)) == 264 and tokens[220] == "Ġ" and tokens[198] == "Ċ"
    assert all(m.replace(" ", "") in set(tokens) for m in merges) and len(merges) == 264 - 256 - 3
    assert tokens[r.fields["tokenizer.ggml.eos_token_id"].contents()] == "<|im_end|>"
    assert r.fields["tokenizer.ggml.token_type"].contents()[-3:] == [3, 3, 3]
    assert r.fields["tokenizer.ggml.add_bos_token"].contents() is False
    with pytest.raises(ValueError, match="at least 259"):
        mk.tokenizer(64)
    got = {t.name: (t.tensor_type.name, [int(n) for n in t.shape]) for t in r.tensors}
    assert {n: t for n, (t, _) in got.items()} == info["types"]
    assert [mk.use_more_bits(i, 2) for i in range(2)] == [False, True]
    assert got["blk.0.ffn_down_exps.weight"] == ("Q4_K", [256, 256, 4])
    assert got["blk.1.ffn_down_exps.weight"][0] == "Q6_K" and got["blk.1.attn_v.weight"][0] == "Q6_K"
    assert got["blk.0.ffn_gate_inp.weight"] == ("F32", [256, 4]) and got["output.weight"][0] == "Q6_K"
    t = next(t for t in r.tensors if t.name == "blk.1.ffn_up_exps.weight")
    d = gguf.quants.dequantize(t.data, t.tensor_type)
    assert d.shape == (4, 256, 256) and 0.015 < float(d.std()) < 0.025
    assert [mk.use_more_bits(i, 48) for i in (0, 5, 6, 7, 8, 9, 40, 41, 42, 47)] == \
        [True, True, False, False, True, False, False, True, True, True]


def test_cpu_clock():
    """--clock cpu times calls in the process's CPU time (a sleep costs none of it)."""
    import time
    from moe_bench.runner import CLOCKS
    t0 = CLOCKS["cpu"]()
    time.sleep(0.05)
    assert CLOCKS["cpu"]() - t0 < 0.04
    assert parse_args(["--clock", "cpu"]).clock == "cpu" and parse_args([]).clock == "wall"
    with pytest.raises(SystemExit):
        parse_args(["--clock", "gpu"])
    rows = bench_shape(tiny_formats(), 8, [1], ["ours", "numpy"], args(clock="cpu"), lambda m: None, [])
    assert rows[0]["impl"]["ours"]["ms"] > 0 and rows[0]["impl"]["numpy"]["paired_ratio"] > 0
