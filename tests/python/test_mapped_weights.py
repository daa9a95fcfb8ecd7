"""Weights read in place from the mapped checkpoint files, against copies of them, and the
MemoryError raised before a layer's copies are allocated."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import moe_swift

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_checkpoints as fixtures  # noqa: E402

# Every stored format: bf16 (fused 3-D), float32, float16, mlx-lm's affine 4-bit (with an
# 8-bit router and a shared expert), gpt-oss's MXFP4 (restacked: copied either way), and
# one tensor per expert (bf16: qwen2_moe with a shared expert, deepseek_v3; float32: olmoe),
# read through the backends' per-expert tables.
CASES = ["qwen3_moe", "mixtral_fused", "glm4_moe", "qwen2_moe_mlx", "gpt_oss_mxfp4", "olmoe", "qwen2_moe",
         "deepseek_v3"]
BACKENDS = [b for b in ("cpu", "softmetal", "metal") if b in moe_swift.available_backends()]
MAPS = Path("/proc/self/maps")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("mapped")
    return {name: str(fixtures.make(name, root / name)) for name in CASES}


def _first_moe_layer(folder):
    return min(moe_swift.from_pretrained(folder, backend="cpu", copy_weights=True))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES)
def test_mapped_equals_copied_bit_for_bit(checkpoints, case, backend):
    folder = checkpoints[case]
    index = _first_moe_layer(folder)
    mapped = moe_swift.from_pretrained(folder, index, backend=backend)
    copied = moe_swift.from_pretrained(folder, index, backend=backend, copy_weights=True)
    rng = np.random.default_rng(1)
    # Decode and a prefill (both expert paths of the Metal backends).
    for tokens in (1, 40):
        x = rng.standard_normal((tokens, mapped.hidden_size), dtype=np.float32)
        y_mapped, y_copied = mapped(x), copied(x)
        assert np.all(np.isfinite(y_mapped))
        np.testing.assert_array_equal(y_mapped, y_copied)
        ids_m, w_m = mapped.route(x)
        ids_c, w_c = copied.route(x)
        np.testing.assert_array_equal(ids_m, ids_c)
        np.testing.assert_array_equal(w_m, w_c)


def _mapped_files(folder):
    return {line.split()[-1] for line in MAPS.read_text().splitlines() if folder in line}


@pytest.mark.skipif(not MAPS.exists(), reason="needs /proc")
@pytest.mark.parametrize("backend,case", [
    ("cpu", "qwen3_moe"),            # bf16: the kernels read it as stored
    ("cpu", "qwen2_moe_mlx"),        # the 8-bit router is read in place, 4-bit experts repacked
    ("softmetal", "qwen2_moe_mlx"),  # every format as stored
    ("cpu", "gpt_oss_mxfp4"),        # experts restacked and copied; the bf16 router read in place
])
def test_layer_holds_the_mapping_while_it_reads_it(checkpoints, backend, case):
    if backend not in BACKENDS:
        pytest.skip(f"{backend} is not available here")
    folder = checkpoints[case]
    index = _first_moe_layer(folder)
    layer = moe_swift.from_pretrained(folder, index, backend=backend)
    assert _mapped_files(folder)
    copied = moe_swift.from_pretrained(folder, index, backend=backend, copy_weights=True)
    layer.close()
    assert not _mapped_files(folder)  # the copied layer holds nothing
    x = np.ones((2, copied.hidden_size), np.float32)
    assert np.all(np.isfinite(copied(x)))


def _needed(error):
    match = re.search(r"needs (\d+) bytes", str(error))
    assert match, str(error)
    return int(match.group(1))


def _expert_bytes(folder, index):
    """Bytes of the stored expert tensors of layer `index` (what a copy must hold at least)."""
    total = 0
    for path in Path(folder).glob("*.safetensors"):
        with open(path, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, entry in header.items():
            if name.startswith(f"model.layers.{index}.") and (".switch_mlp." in name or ".experts." in name):
                total += entry["data_offsets"][1] - entry["data_offsets"][0]
    return total


@pytest.mark.parametrize("backend,case", [("cpu", "qwen3_moe"), ("softmetal", "qwen2_moe_mlx")])
def test_memory_limit_below_the_copies_fails_before_allocating_and_mapped_loads(checkpoints, backend, case):
    if backend not in BACKENDS:
        pytest.skip(f"{backend} is not available here")
    folder = checkpoints[case]
    index = _first_moe_layer(folder)
    experts = _expert_bytes(folder, index)
    limit = experts - 1
    with pytest.raises(MemoryError) as caught:
        moe_swift.from_pretrained(folder, index, backend=backend, copy_weights=True, memory_limit=limit)
    needed = _needed(caught.value)
    assert needed > limit and needed >= experts
    assert f"only {limit} bytes" in str(caught.value) and "memory_limit" in str(caught.value)
    assert moe_swift.last_stats()["allocated_bytes"] == 0
    layer = moe_swift.from_pretrained(folder, index, backend=backend, memory_limit=limit)
    x = np.ones((1, layer.hidden_size), np.float32)
    assert np.all(np.isfinite(layer(x)))


def test_memory_limit_of_a_layer_from_arrays():
    E, H, I = 4, 64, 32
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s, dtype=np.float32) for s in ((E, H), (E, I, H), (E, I, H), (E, H, I))]
    copies = 4 * (E * H + 3 * E * I * H)
    with pytest.raises(MemoryError, match=rf"needs {copies} bytes .* only {copies - 1} bytes"):
        moe_swift.MoELayer(*weights, top_k=2, backend="cpu", memory_limit=copies - 1)
    layer = moe_swift.MoELayer(*weights, top_k=2, backend="cpu", memory_limit=copies)
    assert layer(np.ones((1, H), np.float32)).shape == (1, H)
    with pytest.raises(ValueError, match="positive"):
        moe_swift.MoELayer(*weights, top_k=2, memory_limit=0)
    with pytest.raises(TypeError, match="memory_limit"):
        moe_swift.MoELayer(*weights, top_k=2, memory_limit=1.5)


def test_synthetic_4bit_checkpoint_is_what_its_quantized_weights_say(tmp_path):
    """moe_swift.synthetic (the demo's and the benchmark's checkpoints): the layer loaded
    from what it writes computes the reference on the dequantized values it was given."""
    from moe_swift import formats, reference, synthetic

    E, H, I, k = 8, 128, 64, 2
    rng = np.random.default_rng(3)
    router = rng.standard_normal((E, H), dtype=np.float32) / np.sqrt(H)
    experts = [rng.standard_normal(s, dtype=np.float32) * 0.05 for s in ((E, I, H), (E, I, H), (E, H, I))]
    q = [synthetic.quantize_experts(w) for w in experts]
    q_router = formats.quantize(router, bits=8, group_size=64, scale_dtype="bfloat16")
    folder = synthetic.write_qwen3_moe_4bit(tmp_path / "q4", layers=2, experts=E, hidden=H, intermediate=I, top_k=k,
                                            weights=lambda i: (q_router, *q))
    x = rng.standard_normal((5, H), dtype=np.float32)
    ref = reference.moe_forward(x, formats.dequantize(q_router), *(formats.dequantize(w) for w in q), top_k=k,
                                norm_topk_prob=True)
    for index, layer in moe_swift.from_pretrained(folder, backend="cpu").items():
        np.testing.assert_allclose(layer(x), ref, rtol=0, atol=1e-4 * np.abs(ref).max() + 1e-5)
    # quantize_experts is mx.quantize's affine quantization: within half a step of the values.
    step = formats.dequantize(q[0]) - experts[0]
    assert np.abs(step).max() <= np.abs(experts[0]).max() * 2 / 15
    random = synthetic.write_qwen3_moe_4bit(tmp_path / "random", experts=E, hidden=H, intermediate=I, top_k=k)
    y = moe_swift.from_pretrained(random, 0, backend="cpu")(x)
    assert np.all(np.isfinite(y)) and np.abs(y).max() > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_memory_is_read_in_place(backend):
    """MoELayer(weight_memory=): weights that are views of it are read there — no copies
    (a memory_limit below their bytes does not stop the layer; the same arrays copied do),
    a change to them shows in the next call, and the memory is let go when the library no
    longer reads it. bfloat16 (a dense tensor) and float32 (the float field) both."""
    from moe_swift import layer as layer_module

    E, H, I, k = 8, 2048, 64, 2
    rng = np.random.default_rng(3)
    router = rng.standard_normal((E, H), dtype=np.float32) * 0.02
    gate_up32 = rng.standard_normal((E, 2 * I, H), dtype=np.float32) * 0.02
    down32 = rng.standard_normal((E, H, I), dtype=np.float32) * 0.02
    gate_up_bf16 = (gate_up32.view(np.uint32) >> 16).astype(np.uint16)
    memory = moe_swift.aligned_buffer(gate_up_bf16.nbytes + down32.nbytes)
    assert memory.ctypes.data % moe_swift.options.MAPPED_ALIGNMENT == 0
    gate_up = memory[:gate_up_bf16.nbytes].view(np.uint16).reshape(gate_up_bf16.shape)
    down = memory[gate_up_bf16.nbytes:gate_up_bf16.nbytes + down32.nbytes].view(np.float32).reshape(down32.shape)
    gate_up[...], down[...] = gate_up_bf16, down32
    import ml_dtypes

    as_bf16 = lambda a: a.view(ml_dtypes.bfloat16)  # noqa: E731
    limit = (gate_up.nbytes + down.nbytes) // 4
    held = len(layer_module._HELD)
    layer = moe_swift.MoELayer(router, gate_up_proj=as_bf16(gate_up), down_proj=down, top_k=k, backend=backend,
                               weight_memory=memory, memory_limit=limit)
    assert len(layer_module._HELD) == held + 1
    with pytest.raises(MemoryError, match="copies of the weights"):
        moe_swift.MoELayer(router, gate_up_proj=as_bf16(gate_up.copy()), down_proj=down.copy(), top_k=k,
                           backend=backend, memory_limit=limit)
    copied = moe_swift.MoELayer(router, gate_up_proj=as_bf16(gate_up.copy()), down_proj=down.copy(), top_k=k,
                                backend=backend)
    x = rng.standard_normal((3, H), dtype=np.float32)
    np.testing.assert_array_equal(layer(x), copied(x))
    down *= 2
    np.testing.assert_allclose(layer(x), 2 * copied(x), rtol=1e-5, atol=1e-6)
    layer.close()
    assert len(layer_module._HELD) == held


def test_weight_memory_bad_inputs():
    from moe_swift import layer as layer_module

    E, H, I = 4, 64, 32
    router = np.zeros((E, H), np.float32)
    gate, down = np.zeros((E, I, H), np.float32), np.zeros((E, H, I), np.float32)
    held = len(layer_module._HELD)
    page = moe_swift.options.MAPPED_ALIGNMENT
    for memory, error, match in ((moe_swift.aligned_buffer(2 * page)[1:page + 1], ValueError, "multiples of 16384"),
                                 (moe_swift.aligned_buffer(2 * page)[:page + 8], ValueError, "multiples of 16384"),
                                 (moe_swift.aligned_buffer(2 * page)[::2], ValueError, "contiguous"),
                                 ("memory", TypeError, "NumPy array")):
        with pytest.raises(error, match=match):
            moe_swift.MoELayer(router, gate, gate, down, top_k=1, backend="cpu", weight_memory=memory)
    # A failure inside the library releases the memory too.
    with pytest.raises(ValueError, match="top_k"):
        moe_swift.MoELayer(router, gate, gate, down, top_k=9, backend="cpu", weight_memory=moe_swift.aligned_buffer(1))
    assert len(layer_module._HELD) == held
    with pytest.raises(ValueError, match="positive"):
        moe_swift.aligned_buffer(0)


_MEASURE = """
import json, sys
from pathlib import Path
import numpy as np
import moe_swift

def anonymous():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

folder, backend = sys.argv[1], sys.argv[2]
moe_swift.from_pretrained(folder, 0, backend=backend).close()  # the backend's one-time start-up
growth = {}
for copy in (False, True):
    before = anonymous()
    layer = moe_swift.from_pretrained(folder, 0, backend=backend, copy_weights=copy)
    growth["copied" if copy else "mapped"] = anonymous() - before
    assert np.isfinite(layer(np.random.default_rng(0).standard_normal((2, 2048)).astype(np.float32))).all()
    layer.close()
print(json.dumps(growth))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
@pytest.mark.parametrize("backend", [b for b in ("cpu", "softmetal") if b in BACKENDS])
def test_per_expert_bf16_checkpoint_costs_no_copy(tmp_path, monkeypatch, backend):
    """A Qwen3-MoE-shaped layer stored one bf16 tensor per expert, as the originals are
    published (H = 2048, I = 768, 16 experts: 151 MB of experts), loads without copying
    them: anonymous memory grows by at most 15% of the experts' bytes, where the copied
    layer's grows by all of them. Measured in a fresh process (freed memory that an
    earlier test left resident would hide a copy)."""
    import subprocess

    monkeypatch.setattr(fixtures, "H", 2048)
    monkeypatch.setattr(fixtures, "LAYERS", 1)
    monkeypatch.setitem(fixtures.CASES, "qwen3_per_expert", ("qwen3_moe", "per_expert", "bfloat16", 16, 2, 768,
                                                              {"norm_topk_prob": True, "mlp_only_layers": []}))
    folder = str(fixtures.make("qwen3_per_expert", tmp_path / "q"))
    experts = _expert_bytes(folder, 0)
    assert experts == 3 * 16 * 768 * 2048 * 2
    run = subprocess.run([sys.executable, "-c", _MEASURE, folder, backend], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    growth = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"{backend}: anonymous memory +{growth['mapped'] / 1e6:.1f} MB mapped, +{growth['copied'] / 1e6:.1f} MB "
          f"copied ({experts / 1e6:.0f} MB of experts)")
    assert growth["mapped"] <= 0.15 * experts, growth
    assert growth["copied"] >= 0.9 * experts, growth
