"""Checkpoint folders written by an attacker: every case ends in a ValueError (or TypeError
for a wrong Python type) that names the file and key, never in a crash, a hang, a huge
allocation or a read outside the folder. Each case here was once a crash or a leak of
some kind (issue 24); tests/python/fuzz_checkpoints.py draws many more under
AddressSanitizer."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import moe_swift
from moe_swift.formats import quantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_checkpoints as fixtures  # noqa: E402


def read_tensors(folder):
    tensors = {}
    dtypes = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "U32": np.uint32, "U8": np.uint8}
    for path in sorted(Path(folder).glob("*.safetensors")):
        raw = path.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        for name, entry in json.loads(raw[8:8 + n]).items():
            begin, end = entry["data_offsets"]
            tensors[name] = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype=dtypes[entry["dtype"]]).reshape(
                entry["shape"])
    return tensors


def rewrite(folder, change_config=None, change_tensors=None):
    """Applies the changes to config.json and to the tensors (one model.safetensors)."""
    folder = Path(folder)
    if change_config:
        config = json.loads((folder / "config.json").read_text())
        change_config(config)
        (folder / "config.json").write_text(json.dumps(config))
    if change_tensors:
        tensors = read_tensors(folder)
        change_tensors(tensors)
        for path in folder.glob("*.safetensors"):
            path.unlink()
        (folder / "model.safetensors.index.json").unlink(missing_ok=True)
        fixtures.write_safetensors(folder / "model.safetensors", tensors)
    return folder


@pytest.fixture
def make(tmp_path):
    def make(case, name="ckpt"):
        return fixtures.make(case, tmp_path / name)
    return make


def refused(folder, *needles, layer=None, **kw):
    with pytest.raises(ValueError) as info:
        moe_swift.from_pretrained(folder, layer, backend="cpu", **kw)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


def refused_in_child(folder, layer, *needles, timeout):
    """`refused` in a child process, for cases whose regression could block, hang or
    corrupt the heap instead of failing."""
    code = textwrap.dedent(f"""
        import moe_swift
        try:
            moe_swift.from_pretrained({str(folder)!r}, {layer}, backend="cpu")
        except ValueError as e:
            print("refused:", e)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    output = result.stdout + result.stderr[-2000:]
    assert "refused:" in result.stdout, (result.returncode, output)
    for needle in needles:
        assert needle in result.stdout, output


# --- values of config.json ---------------------------------------------------------------

@pytest.mark.parametrize("value", [0, -1, 2**40, 1.5, "8", None])
def test_expert_count(make, value):
    folder = rewrite(make("qwen3_moe"), lambda c: c.update(num_experts=value))
    if value is None:  # no count at all
        refused(folder, "config.json", "num_experts")
    else:
        refused(folder, "num_experts")


@pytest.mark.parametrize("key,value", [("num_hidden_layers", -1), ("num_hidden_layers", 2**40),
                                       ("hidden_size", 0), ("hidden_size", -64), ("num_experts_per_tok", 0),
                                       ("moe_intermediate_size", 2**62), ("num_experts_per_tok", 99)])
def test_sizes(make, key, value):
    refused(rewrite(make("qwen3_moe"), lambda c: c.update({key: value})), key.replace("num_experts_per_tok", "top_k")
            if value == 99 else key)


def test_shared_expert_product_overflows(make):
    folder = rewrite(make("deepseek_v3"), lambda c: c.update(n_shared_experts=2**40, moe_intermediate_size=2**30))
    refused(folder, "n_shared_experts")


def test_a_huge_layer_count_is_answered_at_once(make):
    """The MoE layers are found among the tensors, never by walking num_hidden_layers. In a
    child process with 8 GiB of address space and a minute: a regression that lists
    2^31 layers fails here instead of filling the machine's memory."""
    folder = rewrite(make("qwen3_moe"), lambda c: c.update(num_hidden_layers=2**31 - 1))
    code = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        import moe_swift
        layers = moe_swift.from_pretrained({str(folder)!r}, backend="cpu")
        print("layers", sorted(layers))
        try:
            moe_swift.from_pretrained({str(folder)!r}, 7, backend="cpu")
        except ValueError as e:
            print("refused:", e)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr[-2000:]
    assert "layers [1]" in result.stdout, output  # decoder_sparse_step 2 of the fixture: layer 1 only
    assert "refused: layer 7" in result.stdout and "model.layers.7" in result.stdout, output


@pytest.mark.parametrize("overrides,needle", [
    (dict(routed_scaling_factor=10**400), "routed_scaling_factor"),
    (dict(top_k=float("nan")), "top_k"),
    (dict(top_k=2**70), "top_k"),
    (dict(swiglu_limit=float("inf")), "swiglu_limit"),
])
def test_override_values(make, overrides, needle):
    refused(make("qwen3_moe"), needle, layer=1, **overrides)


@pytest.mark.parametrize("layer", [2**40, -2**40, -1])
def test_layer_index(make, layer):
    refused(make("qwen3_moe"), "layer", layer=layer)


# --- quantization of config.json (mlx-lm's layout) -----------------------------------------

SHARED_GATE = "model.layers.1.mlp.shared_expert_gate"


@pytest.mark.parametrize("settings,needle", [({"bits": 0, "group_size": 64}, "bits"),
                                             ({"bits": 8, "group_size": 0}, "group_size"),
                                             ({"bits": 8, "group_size": 16}, "group_size"),
                                             ({"bits": "8", "group_size": 64}, "bits"),
                                             ({"bits": 8, "group_size": 64, "mode": "nf4"}, "nf4")])
def test_quantized_shared_gate_settings(make, settings, needle):
    folder = rewrite(make("qwen2_moe_mlx"), lambda c: c["quantization"].update({SHARED_GATE: settings}))
    refused(folder, needle, layer=1)


def test_quantized_shared_gate_without_biases(make):
    folder = rewrite(make("qwen2_moe_mlx"), change_tensors=lambda t: t.pop(SHARED_GATE + ".biases"))
    refused(folder, "biases", layer=1)


@pytest.mark.parametrize("shape", [(1, 0), (2, 1), (1, 2)])
def test_quantized_shared_gate_scales_of_another_size(make, shape):
    def change(t):
        for part in ("scales", "biases"):
            t[f"{SHARED_GATE}.{part}"] = np.zeros(shape, ml_dtypes.bfloat16)
    refused(rewrite(make("qwen2_moe_mlx"), change_tensors=change), "shared_expert_gate", layer=1)


def test_quantized_weight_of_the_wrong_dtype(make):
    def change(t):
        name = "model.layers.1.mlp.switch_mlp.gate_proj.weight"
        t[name] = t[name].view(np.uint8)
    refused(rewrite(make("qwen3_moe_mlx"), change_tensors=change), "gate_proj.weight", "U32", layer=1)


# --- gpt-oss MXFP4 blocks ----------------------------------------------------------------

def test_mxfp4_blocks_of_a_hidden_size_that_is_not_a_multiple_of_32(make):
    """Every tensor fits hidden_size except that the gate_up blocks hold hidden_size // 32
    blocks per row, fewer than hidden_size / 2 bytes: once a heap overflow of the
    de-interleaved copy."""
    for hidden in (48, 40, 33):
        def change(t):
            for name in list(t):
                if not name.startswith("model.layers.0.mlp."):
                    continue
                if name.endswith("gate_up_proj_blocks") or name.endswith("gate_up_proj_scales"):
                    t[name] = np.ascontiguousarray(t[name][:, :, :hidden // 32])
                elif name.endswith("down_proj_blocks") or name.endswith("down_proj_scales"):
                    t[name] = np.ascontiguousarray(t[name][:, :hidden])
                elif name.endswith("router.weight"):
                    t[name] = np.ascontiguousarray(t[name][:, :hidden])
                elif name.endswith("down_proj_bias"):
                    t[name] = np.ascontiguousarray(t[name][:, :hidden])
        folder = rewrite(make("gpt_oss_mxfp4", f"h{hidden}"), lambda c: c.update(hidden_size=hidden), change)
        # In a child process: a regression here corrupts the heap, which may hang as well as crash.
        refused_in_child(folder, 0, "hidden_size", "multiple of 32", timeout=120)


def test_mxfp4_scales_of_the_wrong_dtype(make):
    def change(t):
        name = "model.layers.0.mlp.experts.down_proj_scales"
        t[name] = t[name].astype(np.float32)
    refused(rewrite(make("gpt_oss_mxfp4"), change_tensors=change), "down_proj_scales", layer=0)


# --- files that are not what they say ------------------------------------------------------

def test_config_that_is_a_device(make):
    folder = make("qwen3_moe")
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to("/dev/zero")
    refused(folder, "config.json", "outside")


def test_config_that_is_too_large(make):
    folder = make("qwen3_moe")
    config = json.loads((folder / "config.json").read_text())
    config["padding"] = "x" * (64 << 20)
    (folder / "config.json").write_text(json.dumps(config))
    refused(folder, "config.json", "large")


def test_config_that_is_a_fifo_does_not_block(tmp_path):
    folder = fixtures.make("qwen3_moe", tmp_path / "fifo")
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    refused_in_child(folder, 1, "regular file", timeout=60)


def test_shard_that_is_a_directory(make):
    folder = make("mixtral")
    index = folder / "model.safetensors.index.json"
    shard = json.loads(index.read_text())["weight_map"].popitem()[1]
    (folder / shard).unlink()
    (folder / shard).mkdir()
    refused(folder, shard, "regular file")


def test_a_file_that_is_not_safetensors_is_not_quoted(make):
    folder = make("qwen3_moe")
    (folder / "model.safetensors").write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    message = refused(folder, "model.safetensors", "not a safetensors file")
    assert "root:x" not in message and "3475222254926655346" not in message


def test_empty_weight_map(make):
    folder = make("mixtral")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    refused(folder, "model.safetensors.index.json", "weight_map")


@pytest.mark.parametrize("name", ["../elsewhere.safetensors", "../../../../etc/passwd", "/etc/passwd",
                                  "sub/../../x.safetensors", "", "a\x00b"])
def test_shard_names_stay_in_the_folder(make, tmp_path, name):
    folder = make("mixtral")
    fixtures.write_safetensors(tmp_path / "elsewhere.safetensors", {"x": np.zeros(4, np.float32)})
    weight_map = {n: "model.safetensors" for n in read_tensors(folder)}
    weight_map["model.layers.0.block_sparse_moe.gate.weight"] = name
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    message = refused(folder, "model.safetensors.index.json")
    assert "root:x" not in message


def test_symlinks_that_leave_the_folder(make, tmp_path):
    folder = make("qwen3_moe")
    outside = tmp_path / "outside.safetensors"
    shutil.move(folder / "model.safetensors", outside)
    (folder / "model.safetensors").symlink_to(outside)
    refused(folder, "model.safetensors", "outside")


def test_hugging_face_cache_layout_loads(make, tmp_path):
    """models--org--name/snapshots/<rev>/<file> -> ../../blobs/<hash>: the Hub's cache."""
    source = make("mixtral")
    repo = tmp_path / "models--org--name"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, path in enumerate(sorted(source.iterdir())):
        blob = repo / "blobs" / f"{i:040x}"
        shutil.copy(path, blob)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    expected = moe_swift.from_pretrained(source, backend="cpu")
    got = moe_swift.from_pretrained(snapshot, backend="cpu")
    x = np.random.default_rng(0).standard_normal((3, fixtures.H)).astype(np.float32)
    assert sorted(expected) == sorted(got)
    for i in expected:
        np.testing.assert_array_equal(expected[i](x), got[i](x))


def test_folder_name_that_is_not_utf8(make, tmp_path):
    source = make("qwen3_moe")
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    shutil.copytree(source, folder)
    with moe_swift.from_pretrained(folder, 1, backend="cpu") as layer:
        assert layer.num_experts == 8


@pytest.mark.parametrize("path", ["", "/nonexistent/folder"])
def test_paths_that_are_no_folder(path):
    with pytest.raises(ValueError, match="folder|directory|empty"):
        moe_swift.from_pretrained(path, 0)


def test_path_that_is_a_file(make):
    refused(make("qwen3_moe") / "config.json", "not a folder")


# --- out= overlapping the inputs -----------------------------------------------------------

@pytest.mark.parametrize("backend", moe_swift.available_backends())
@pytest.mark.parametrize("shift", [1, -1, 3])
def test_out_partially_overlapping_x(backend, shift):
    rng = np.random.default_rng(1)
    E, H, I, T = 4, 64, 32, 6
    layer = moe_swift.MoELayer(router_weight=rng.standard_normal((E, H)).astype(np.float32), top_k=2,
                               gate_proj=rng.standard_normal((E, I, H)).astype(np.float32) * 0.1,
                               up_proj=rng.standard_normal((E, I, H)).astype(np.float32) * 0.1,
                               down_proj=rng.standard_normal((E, H, I)).astype(np.float32) * 0.1, backend=backend)
    storage = rng.standard_normal((T + 3, H)).astype(np.float32)
    x_at, out_at = (0, shift) if shift > 0 else (-shift, 0)
    x = storage[x_at:x_at + T]
    expected = layer(x.copy(), residual="input")
    out = storage[out_at:out_at + T]
    got = layer(x, residual="input", out=out)
    assert got is out
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    # Overlapping the residual given as an array.
    storage = rng.standard_normal((T + 3, H)).astype(np.float32)
    x = rng.standard_normal((T, H)).astype(np.float32)
    residual = storage[x_at:x_at + T]
    expected = layer(x, residual=residual.copy())
    out = storage[out_at:out_at + T]
    layer(x, residual=residual, out=out)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    layer.close()


# --- Quantized after construction ----------------------------------------------------------

def test_quantized_is_immutable():
    q = quantize(np.ones((4, 64), np.float32), bits=4, group_size=32)
    for name, value in [("weight", q.weight[:1]), ("bits", 8), ("scale_dtype", "bfloat16"), ("scales", q.scales[:1]),
                        ("group_size", 64), ("shape", (1, 1)), ("mode", "mxfp4"), ("biases", None), ("new", 1)]:
        with pytest.raises(AttributeError):
            setattr(q, name, value)
    with pytest.raises(AttributeError):
        del q.weight
