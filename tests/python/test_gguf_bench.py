"""benchmarks/bench_gguf_file.py on a tiny file of make_gguf_model.py's Q4_K_M mix (two
layers: Q4_K down in one, Q6_K in the other): it loads both sides from the file, checks
them against each other, and writes its table and JSON."""

from __future__ import annotations

import json

import pytest

from moe_bench import peers


def test_bench_gguf_file_on_a_tiny_file(tmp_path, capsys):
    if peers.status("ggml") is not None:
        pytest.skip(f"ggml: {peers.status('ggml')}")
    pytest.importorskip("gguf")
    import bench_gguf_file
    import make_gguf_model as mk
    c = dict(mk.QWEN3_30B_A3B, layers=2, hidden=256, expert_inter=256, experts=4, experts_used=2, heads=8,
             heads_kv=2, head_dim=32, vocab=264, dense_inter=512)
    path = tmp_path / "tiny.gguf"
    mk.write(path, c, log=lambda m: None)
    out = tmp_path / "table.txt"
    assert bench_gguf_file.main([str(path), "--rounds", "1", "--tokens", "1,8", "--passes", "1:1,8:1",
                                 "--probe-mb", "64", "--out", str(out)]) == 0
    text = out.read_text()
    assert "ggml/ours" in text and "ggml/ours-q8" in text and "Q4_K/Q4_K/Q4_K, Q4_K/Q4_K/Q6_K" in text
    data = json.loads(out.with_suffix(".json").read_text())
    assert [r["T"] for r in data["rows"]] == [1, 8] and data["layers"] == [0, 1]
    assert all(0 < e <= 0.05 for e in data["checks_rel_rms"].values())  # ggml's 8-bit activations, not 0
    assert all(r["ours"]["ms"] > 0 and r["ggml"]["ms"] > 0 and r["ratio"] > 0 for r in data["rows"])
    assert all(r["ours-q8"]["ms"] > 0 and r["ratio_ours-q8"] > 0 for r in data["rows"])  # both modes by default
    assert "written:" in capsys.readouterr().out
