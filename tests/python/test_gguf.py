"""moe_swift.from_pretrained on GGUF files: every llama.cpp MoE architecture the loader
reads (files written by the gguf package's GGUFWriter, tests/fixtures/make_gguf.py)
against the float64 reference run on the same tensors, read back here with the gguf
package's own reader and dequantized by its NumPy code (ggml's dequantization); split
files and folders; and hostile files, each a clear ValueError."""

from __future__ import annotations

import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import moe_swift
from moe_swift import reference

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_gguf as fixtures  # noqa: E402


@pytest.fixture(scope="session")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    made = {}
    for case in fixtures.CASES:
        made[case] = fixtures.make(case, root / case, split=3 if case.endswith("_split") else 0)
    return made


def read_tensors(path):
    """Every tensor of the GGUF file(s) at `path` (a file, or the first of its splits), as
    float32 arrays in row-major (ne reversed) shape, dequantized by the gguf package."""
    path = Path(path)
    paths = sorted(path.parent.glob(path.name.replace("-00001-of-", "-*-of-"))) if "-00001-of-" in path.name else [path]
    tensors = {}
    for p in paths:
        for t in gguf.GGUFReader(p).tensors:
            tensors[t.name] = np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(tuple(reversed(t.shape)))
    return tensors


def reference_layer(tensors, index, opts):
    """The arguments of reference.moe_forward for MoE layer `index`, as llama.cpp runs it."""
    t, p, I = tensors, f"blk.{index}.", fixtures.I
    down = t.get(p + "ffn_down_exps.weight")
    if opts.get("fused"):
        gu = t[p + "ffn_gate_up_exps.weight"]
        gate, up = gu[:, :I], gu[:, I:]
    elif opts.get("per_expert"):
        gate, up, down = (np.stack([t[p + f"ffn_{n}.{x}.weight"] for x in range(fixtures.E)]) for n in ("gate", "up", "down"))
    else:
        gate, up = t[p + "ffn_gate_exps.weight"], t[p + "ffn_up_exps.weight"]
    kw = {k: v for k, v in opts.items() if k in ("top_k", "scoring", "norm_topk_prob", "routed_scaling_factor",
                                                 "n_group", "topk_group", "activation")}
    if opts.get("selection_bias"):
        kw["selection_bias"] = t[p + "exp_probs_b.bias"]
    if opts.get("shared"):
        kw["shared_expert"] = {n: t[p + f"ffn_{n[:-5]}_shexp.weight"] for n in ("gate_proj", "up_proj", "down_proj")}
        if opts["shared"] == "gated":
            kw["shared_expert"]["sigmoid_gate"] = t[p + "ffn_gate_inp_shexp.weight"]
    if opts.get("biases"):
        kw.update(router_bias=t[p + "ffn_gate_inp.bias"], gate_bias=t[p + "ffn_gate_exps.bias"],
                  up_bias=t[p + "ffn_up_exps.bias"], down_bias=t[p + "ffn_down_exps.bias"])
    return (t[p + "ffn_gate_inp.weight"], gate, up, down), kw


def check_close(layer, tensors, index, opts, T):
    (router, gate, up, down), kw = reference_layer(tensors, index, opts)
    x = np.random.default_rng(T + 10 * index).standard_normal((T, fixtures.H)).astype(np.float32)
    want = reference.moe_forward(x, router, gate, up, down, **kw)
    got = layer(x)
    assert got.shape == x.shape
    tol = 1e-4 * np.abs(want).max() + 1e-5
    assert np.abs(got - want).max() <= tol, f"layer {index}: max error {np.abs(got - want).max()} > {tol}"


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("case", [c for c in fixtures.CASES if not c.endswith("_split")])
def test_every_architecture_matches_reference(files, case, T):
    path, layers = files[case]
    loaded = moe_swift.from_pretrained(path, backend="cpu")
    assert sorted(loaded) == sorted(layers), case
    tensors = read_tensors(path)
    for index, layer in loaded.items():
        check_close(layer, tensors, index, layers[index], T)


# ggml's block types the layer reads, each as every expert matrix of a file, and the mix of
# a Q4_K_M file (llama.cpp keeps routers in F32; attention-side and shared tensors differ).
GGML_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"]
Q4_K_M = {"gate": "Q4_K", "up": "Q4_K", "down": "Q6_K", "shexp": "Q8_0"}


@pytest.mark.parametrize("type_name", GGML_TYPES)
def test_every_ggml_type_matches_reference(tmp_path, type_name):
    path, layers = fixtures.make("olmoe", tmp_path, types=dict.fromkeys(("gate", "up", "down"), type_name))
    tensors = read_tensors(path)
    for T in (1, 6):
        check_close(moe_swift.from_pretrained(path, 1, backend="cpu"), tensors, 1, layers[1], T)


@pytest.mark.parametrize("case, types", [("deepseek2", Q4_K_M), ("qwen2moe", Q4_K_M), ("glm4moe", Q4_K_M),
                                         ("gpt-oss", dict.fromkeys(("gate", "up", "down"), "MXFP4")),
                                         ("fused_gate_up", {"gate": "Q5_K", "down": "Q8_0", "router": "F16"}),
                                         ("mixtral_per_expert", {"gate": "Q4_0", "up": "Q4_0", "down": "Q8_0"})])
def test_mixed_types_match_reference(tmp_path, case, types):
    path, layers = fixtures.make(case, tmp_path, types=types)
    tensors = read_tensors(path)
    for index, layer in moe_swift.from_pretrained(path, backend="cpu").items():
        check_close(layer, tensors, index, layers[index], 4)


def test_split_files_and_folders(files):
    path, layers = files["qwen3moe_split"]
    splits = sorted(path.parent.glob("*.gguf"))
    assert len(splits) > 1 and path == splits[0]
    tensors = read_tensors(path)
    # The first split, a later one, and the folder all name the same model.
    for given in (path, splits[-1], path.parent, str(path)):
        loaded = moe_swift.from_pretrained(given, backend="cpu")
        assert sorted(loaded) == sorted(layers)
        check_close(loaded[2], tensors, 2, layers[2], 3)
    single, _ = files["olmoe"]
    assert sorted(moe_swift.from_pretrained(single.parent, backend="cpu")) == [0, 1]


def test_layer_errors(files):
    path, _ = files["deepseek2"]
    with pytest.raises(ValueError, match=r"dense MLP layer.*leading_dense_block_count = 1"):
        moe_swift.from_pretrained(path, 0, backend="cpu")
    with pytest.raises(ValueError, match="out of range"):
        moe_swift.from_pretrained(path, 3, backend="cpu")
    glm, _ = files["glm4moe"]
    # Its last block is the next-token-prediction layer: not one of the model's layers.
    with pytest.raises(ValueError, match="out of range"):
        moe_swift.from_pretrained(glm, 3, backend="cpu")
    layer = moe_swift.from_pretrained(path, 1, backend="cpu", top_k=1, routed_scaling_factor=1.0)
    assert layer.top_k == 1


def test_missing_split_and_ambiguous_folder(files, tmp_path):
    path, _ = files["qwen3moe_split"]
    folder = tmp_path / "partial"
    folder.mkdir()
    for p in sorted(path.parent.glob("*.gguf"))[:-1]:
        (folder / p.name).symlink_to(p)
    with pytest.raises(ValueError, match="is missing from"):
        moe_swift.from_pretrained(folder / path.name, backend="cpu")
    both = tmp_path / "both"
    both.mkdir()
    for case in ("olmoe", "mixtral"):
        (both / files[case][0].name).symlink_to(files[case][0])
    with pytest.raises(ValueError, match="GGUF files of 2 models"):
        moe_swift.from_pretrained(both, backend="cpu")
    with pytest.raises(ValueError, match="no such file"):
        moe_swift.from_pretrained(tmp_path / "absent.gguf", backend="cpu")


@pytest.mark.parametrize("case, types", [("qwen2moe", None), ("gpt-oss", None), ("deepseek2", Q4_K_M),
                                         ("gpt-oss", dict.fromkeys(("gate", "up", "down"), "MXFP4")),
                                         ("olmoe", {"gate": "Q5_1", "up": "IQ4_NL", "down": "Q3_K"})])
def test_softmetal(tmp_path, case, types):
    if "softmetal" not in moe_swift.available_backends():
        pytest.skip("softmetal is not available here")
    path, layers = fixtures.make(case, tmp_path, types=types)
    index = max(layers)
    layer = moe_swift.from_pretrained(path, index, backend="softmetal")
    assert layer.backend == "softmetal"
    check_close(layer, read_tensors(path), index, layers[index], 3)


# Hostile files, written byte by byte (the gguf package writes only valid ones). Each must
# be a ValueError that says what is wrong: no crash, no hang, no allocation sized by a lie.

def _str(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def _kv(key, kind, payload):
    return _str(key) + struct.pack("<I", kind) + payload


def kv_u32(key, v):
    return _kv(key, 4, struct.pack("<I", v))


def kv_string(key, v):
    return _kv(key, 8, _str(v))


def tensor_info(name, ne, kind, offset):
    return _str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne) + struct.pack("<IQ", kind, offset)


H_SMALL, E_SMALL, I_SMALL = 32, 2, 32


def hostile(**change):
    """A small valid qwen3moe file (H = I = 32, 2 experts, f32), with `change` applied:
    kvs / infos (lists of bytes), data, version, counts, magic, alignment."""
    kvs = [kv_string("general.architecture", "qwen3moe"), kv_u32("qwen3moe.block_count", 1),
           kv_u32("qwen3moe.embedding_length", H_SMALL), kv_u32("qwen3moe.expert_count", E_SMALL),
           kv_u32("qwen3moe.expert_used_count", 1), kv_u32("qwen3moe.expert_feed_forward_length", I_SMALL)]
    shapes = [("blk.0.ffn_gate_inp.weight", [H_SMALL, E_SMALL]), ("blk.0.ffn_gate_exps.weight", [H_SMALL, I_SMALL, E_SMALL]),
              ("blk.0.ffn_up_exps.weight", [H_SMALL, I_SMALL, E_SMALL]), ("blk.0.ffn_down_exps.weight", [I_SMALL, H_SMALL, E_SMALL])]
    infos, offset = [], 0
    for name, ne in shapes:
        infos.append(tensor_info(name, ne, 0, offset))
        offset += int(np.prod(ne)) * 4
    kvs = change.get("kvs", kvs) + change.get("more_kvs", [])
    infos = change.get("infos", infos)
    data = change.get("data", np.random.default_rng(0).standard_normal(offset // 4).astype(np.float32).tobytes())
    head = (change.get("magic", b"GGUF") + struct.pack("<I", change.get("version", 3))
            + struct.pack("<QQ", change.get("n_tensors", len(infos)), change.get("n_kv", len(kvs)))
            + b"".join(kvs) + b"".join(infos))
    align = change.get("alignment", 32)
    return head + b"\0" * (-len(head) % align) + data


def _load(tmp_path, raw, name="m.gguf"):
    path = tmp_path / name
    path.write_bytes(raw)
    return moe_swift.from_pretrained(path, backend="cpu")


def test_hostile_baseline_loads(tmp_path):
    assert sorted(_load(tmp_path, hostile())) == [0]


def _info(i, **kw):
    """Tensor info `i` of the baseline with fields replaced."""
    names = ["blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"]
    ne = [[H_SMALL, E_SMALL], [H_SMALL, I_SMALL, E_SMALL], [H_SMALL, I_SMALL, E_SMALL], [I_SMALL, H_SMALL, E_SMALL]]
    offsets = [0, 64, 64 + 2048, 64 + 4096]
    infos = [tensor_info(names[j], ne[j], 0, offsets[j] * 4) for j in range(4)]
    infos[i] = tensor_info(kw.get("name", names[i]), kw.get("ne", ne[i]), kw.get("kind", 0),
                           kw.get("offset", offsets[i] * 4))
    return infos


HOSTILE = {
    "not GGUF": (dict(magic=b"GGML"), "not a GGUF file"),
    "version 1": (dict(version=1), "version 1"),
    "version 9": (dict(version=9), "version 9 is not supported"),
    "big-endian": (dict(version=3 << 24), "big-endian"),
    "tensor count overflows": (dict(n_tensors=2**63), "tensor count"),
    "key count overflows": (dict(n_kv=2**64 - 1), "key/value count"),
    "more keys than there are": (dict(n_kv=1000), "truncated"),
    "huge key length": (dict(more_kvs=[struct.pack("<Q", 2**62) + b"x"]), "truncated"),
    "huge string value": (dict(more_kvs=[_str("a.b") + struct.pack("<IQ", 8, 2**63)]), "truncated"),
    "huge array": (dict(more_kvs=[_str("a.b") + struct.pack("<IIQ", 9, 0, 2**60)]), "truncated"),
    "huge string array": (dict(more_kvs=[_str("a.b") + struct.pack("<IIQ", 9, 8, 2**40)]), "truncated"),
    "arrays nested too deep": (dict(more_kvs=[_str("a.b") + struct.pack("<II", 9, 9) + b"".join(
        struct.pack("<QI", 1, 9) for _ in range(10)) + struct.pack("<Q", 0)]), "nests arrays"),
    "unknown value type": (dict(more_kvs=[_kv("a.b", 13, b"")]), "unknown value type 13"),
    "duplicate key": (dict(more_kvs=[kv_u32("qwen3moe.expert_count", 2)]), "appears twice"),
    "alignment not a power of two": (dict(more_kvs=[kv_u32("general.alignment", 24)]), "power of two"),
    "alignment of the wrong type": (dict(more_kvs=[kv_string("general.alignment", "32")]), "general.alignment"),
    "five dimensions": (dict(infos=_info(1, ne=[H_SMALL, I_SMALL, E_SMALL, 1, 1])), "5 dimensions"),
    "no dimensions": (dict(infos=_info(1, ne=[])), "0 dimensions"),
    "dimensions overflow": (dict(infos=_info(1, ne=[2**40, 2**40, 2])), "overflows"),
    "dimension beyond int64": (dict(infos=_info(1, ne=[2**64 - 1, 1, 1])), "too large"),
    "unknown tensor type": (dict(infos=_info(1, kind=99)), "unknown ggml type 99"),
    "rows not whole blocks": (dict(infos=_info(1, kind=12)), "not whole blocks of 256"),
    "misaligned offset": (dict(infos=_info(2, offset=64 * 4 + 4)), "not a multiple of the alignment"),
    "data outside the file": (dict(infos=_info(3, offset=2**20)), "outside the file's data section"),
    "offset overflows": (dict(infos=_info(3, offset=2**64 - 32)), "outside the file"),
    "duplicate tensor": (dict(infos=_info(2, name="blk.0.ffn_gate_exps.weight")), "appears twice"),
    "name too long": (dict(infos=_info(0, name="x" * 64)), "64 bytes long"),
    "wrong dims for the metadata": (dict(infos=_info(1, ne=[H_SMALL, I_SMALL // 2, E_SMALL])), r"has shape \(2, 16, 32\)"),
    "type the layer does not read": (dict(infos=_info(1, kind=9)), "Q8_1, which this layer does not read"),
    "no architecture": (dict(kvs=[kv_u32("qwen3moe.block_count", 1)]), "general.architecture"),
    "unsupported architecture": (dict(kvs=[kv_string("general.architecture", "bert")]), "not supported"),
    "count beyond int64": (dict(kvs=[kv_string("general.architecture", "qwen3moe"), kv_u32("qwen3moe.block_count", 1),
                                     kv_u32("qwen3moe.embedding_length", H_SMALL),
                                     _kv("qwen3moe.expert_count", 10, struct.pack("<Q", 2**64 - 1)),
                                     kv_u32("qwen3moe.expert_used_count", 1),
                                     kv_u32("qwen3moe.expert_feed_forward_length", I_SMALL)]),
                           r"qwen3moe\.expert_count must be in \d+\.\.\.\d+, got 18446744073709551615"),
    "more tensors declared than described": (dict(n_tensors=10),
                                             r"tensor 5 of the 10 the header declares has an empty name: .* its tensor "
                                             r"count \(10\) is larger than the tensors it describes"),
    "count of the wrong type": (dict(kvs=[kv_string("general.architecture", "qwen3moe"), kv_u32("qwen3moe.block_count", 1),
                                          kv_string("qwen3moe.embedding_length", "32"),
                                          kv_u32("qwen3moe.expert_count", E_SMALL), kv_u32("qwen3moe.expert_used_count", 1),
                                          kv_u32("qwen3moe.expert_feed_forward_length", I_SMALL)]),
                                "embedding_length must be an integer"),
}


def test_huge_block_count_costs_what_the_file_holds(tmp_path):
    """block_count is the file's word (up to 2^31 - 1): listing the MoE layers must cost what
    the file holds (one router here), not a loop over the count. In a child process with a
    timeout, so that a regression fails instead of hanging the suite."""
    kvs = [kv_string("general.architecture", "qwen3moe"), kv_u32("qwen3moe.block_count", 2**31 - 1),
           kv_u32("qwen3moe.embedding_length", H_SMALL), kv_u32("qwen3moe.expert_count", E_SMALL),
           kv_u32("qwen3moe.expert_used_count", 1), kv_u32("qwen3moe.expert_feed_forward_length", I_SMALL)]
    path = tmp_path / "m.gguf"
    path.write_bytes(hostile(kvs=kvs))
    code = f"import moe_swift; print(sorted(moe_swift.from_pretrained({str(path)!r}, backend='cpu')))"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == "[0]"


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_file_is_a_clear_error(tmp_path, name):
    change, message = HOSTILE[name]
    with pytest.raises(ValueError, match=message):
        _load(tmp_path, hostile(**change))


def test_truncated_anywhere_is_a_clear_error(tmp_path):
    raw = hostile()
    header_end = raw.index(b"\0" * 8, 200)
    cuts = sorted(set(range(0, header_end + 8, 7)) | {len(raw) - 1, len(raw) - 1000})
    for cut in cuts:
        with pytest.raises(ValueError, match="truncated|not a GGUF file|outside the file"):
            _load(tmp_path, raw[:cut])


def test_split_names_as_gguf_split_writes_them(tmp_path):
    """Splits are <name>-<k>-of-<n>.gguf with 1 <= k <= n; the extension in any case."""
    raw = hostile()
    (tmp_path / "upper").mkdir()
    (tmp_path / "upper" / "M-00001-of-00001.GGUF").write_bytes(raw)
    assert sorted(moe_swift.from_pretrained(tmp_path / "upper" / "M-00001-of-00001.GGUF", backend="cpu")) == [0]
    assert sorted(moe_swift.from_pretrained(tmp_path / "upper", backend="cpu")) == [0]  # found in the folder too
    (tmp_path / "k").mkdir()
    for name in ("m-00001-of-00002.gguf", "m-00002-of-00002.gguf", "m-00007-of-00002.gguf"):
        (tmp_path / "k" / name).write_bytes(raw)
    # k > n is not a split's name: the file alone, not splits 1 and 2.
    assert sorted(moe_swift.from_pretrained(tmp_path / "k" / "m-00007-of-00002.gguf", backend="cpu")) == [0]


def test_split_with_a_tensor_twice(tmp_path):
    raw = hostile()
    (tmp_path / "m-00001-of-00002.gguf").write_bytes(raw)
    (tmp_path / "m-00002-of-00002.gguf").write_bytes(raw)
    with pytest.raises(ValueError, match="is in both"):
        moe_swift.from_pretrained(tmp_path / "m-00001-of-00002.gguf", backend="cpu")


def test_random_corruptions_of_the_header(tmp_path):
    """Bytes of the header overwritten at random: the file loads or is a ValueError, never
    a crash (a crash ends this process and fails the run)."""
    raw = bytearray(hostile())
    header_end = raw.index(b"\0" * 8, 200)
    rng = np.random.default_rng(26)
    errors = 0
    for _ in range(300):
        bad = bytearray(raw)
        for at in rng.integers(4, header_end, rng.integers(1, 4)):
            bad[at] = int(rng.choice([0, 0xFF, 0x7F, 0x80, rng.integers(0, 256)]))
        try:
            _load(tmp_path, bytes(bad))
        except ValueError:
            errors += 1
    assert errors > 200  # most corruptions are errors, not silent loads


def test_activation_quantization_reaches_every_layer(tmp_path):
    """from_pretrained(..., activation_quantization="q8") gives every layer 8-bit activations:
    each output moves off the float-exact one by about what 8 bits allow, no further."""
    path, layers = fixtures.make("qwen2moe", tmp_path, types=Q4_K_M)
    tensors = read_tensors(path)
    exact = moe_swift.from_pretrained(path, backend="cpu")
    q8 = moe_swift.from_pretrained(path, backend="cpu", activation_quantization="q8")
    assert sorted(q8) == sorted(exact) == sorted(layers)
    x = np.random.default_rng(1).standard_normal((3, fixtures.H)).astype(np.float32)
    for index in layers:
        (router, gate, up, down), kw = reference_layer(tensors, index, layers[index])
        want = reference.moe_forward(x, router, gate, up, down, **kw)
        got, float_exact = q8[index](x), exact[index](x)
        assert not np.array_equal(got, float_exact)
        assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
    with pytest.raises(ValueError, match="activation_quantization must be one of"):
        moe_swift.from_pretrained(path, backend="cpu", activation_quantization="int8")


# --- metadata forms llama.cpp accepts ---------------------------------------------------------


def _per_layer_file(path, arch, widths, keys):
    """A file of len(widths) blocks, block i an MoE layer of expert width widths[i] (0: a
    dense block), with each of `keys` written as llama.cpp's get_key_or_arr reads it: an
    array of one value per block (keys maps a key to its array)."""
    w = fixtures._Writer(path, arch, None, seed=7)
    w.key("embedding_length", fixtures.H)
    w.key("expert_count", fixtures.E)
    w.key("expert_used_count", fixtures.K)
    w.key("block_count", len(widths))
    for key, values in keys.items():
        w.w.add_array(f"{arch}.{key}", values)
    for i, width in enumerate(widths):
        if width:
            w.I = width
            w.moe(i, shared=keys.get("expert_shared_feed_forward_length", [0] * len(widths))[i],
                  gated_shared=arch == "qwen2moe")
        else:
            w.dense_mlp(i)
    w.close()
    return path


@pytest.mark.parametrize("arch, keys", [
    ("qwen3moe", lambda widths: {"expert_feed_forward_length": widths}),
    # No expert width key: each layer's I is its feed_forward_length / expert_used_count.
    ("qwen3moe", lambda widths: {"feed_forward_length": [max(w, 1) * fixtures.K for w in widths]}),
    ("olmoe", lambda widths: {"feed_forward_length": [max(w, 1) for w in widths]}),
    ("qwen2moe", lambda widths: {"feed_forward_length": [max(w, 1) * fixtures.K for w in widths],
                                 "expert_shared_feed_forward_length": [0, 96, 160]}),
])
def test_per_layer_array_keys(tmp_path, arch, keys):
    """Keys given as an array of one value per block, the blocks of different widths and
    the first one dense: each layer must read its own entry (an index off by one, or the
    first entry for all, gives another shape and a clear error, or another layer)."""
    widths = [0, 32, 64] if arch != "olmoe" else [64, 32, 96]
    path = _per_layer_file(tmp_path / "m.gguf", arch, widths, keys(widths))
    tensors = read_tensors(path)
    layers = moe_swift.from_pretrained(path, backend="cpu")
    assert sorted(layers) == [i for i, w in enumerate(widths) if w]
    for index, layer in layers.items():
        assert layer.intermediate_size == widths[index]
        opts = dict(top_k=fixtures.K, norm_topk_prob=arch in ("qwen3moe",))
        if arch == "qwen2moe":
            opts["shared"] = "gated"
            assert layer.shared_intermediate_size == [0, 96, 160][index]
        if arch == "qwen2moe":
            fixtures_I = fixtures.I
            fixtures.I = widths[index]  # reference_layer splits fused tensors by it (not used here)
            try:
                check_close(layer, tensors, index, opts, 3)
            finally:
                fixtures.I = fixtures_I
        else:
            check_close(layer, tensors, index, opts, 3)
        layer.close()


def test_a_per_layer_array_too_short_is_an_error(tmp_path):
    path = _per_layer_file(tmp_path / "m.gguf", "qwen3moe", [0, 32, 32], {"expert_feed_forward_length": [0, 32]})
    with pytest.raises(ValueError, match=r"expert_feed_forward_length must be an integer or an array of integers "
                                         r"with one per layer"):
        moe_swift.from_pretrained(path, 2, backend="cpu")


# What llama.cpp requires of each architecture's MoE block beyond the router and the three
# expert tensors (llama-model.cpp's create_tensor without TENSOR_NOT_REQUIRED), per case.
REQUIRED = {
    "qwen2moe": ["ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight",
                 "ffn_gate_inp_shexp.weight"],
    "deepseek2": ["ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"],
    "glm4moe": ["exp_probs_b.bias", "ffn_gate_shexp.weight"],
    "gpt-oss": ["ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"],
}
EXPERTS = ["ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"]


@pytest.mark.parametrize("case, tensor", [(c, t) for c in ("qwen3moe", "olmoe", "mixtral") for t in EXPERTS]
                         + [(c, t) for c, ts in REQUIRED.items() for t in ts])
def test_a_required_tensor_missing_is_an_error_naming_it(tmp_path, case, tensor):
    """Both sides: the file without it is an error naming it, the file with it loads."""
    _, layers = fixtures.make(case, tmp_path / "whole")
    index = sorted(layers)[-1]
    path, _ = fixtures.make(case, tmp_path / "drop", drop={f"blk.{index}.{tensor}"})
    with pytest.raises(ValueError, match=re.escape(f"blk.{index}.{tensor.rsplit('.', 1)[0]}")):
        moe_swift.from_pretrained(path, index, backend="cpu")
    moe_swift.from_pretrained(tmp_path / "whole" / f"{case}.gguf", index, backend="cpu").close()


def test_deepseek2_selection_bias_is_optional(tmp_path):
    """DeepSeek-V2's files have no exp_probs_b (llama.cpp: TENSOR_NOT_REQUIRED): without it
    the layer is the one with no selection bias; with it, another."""
    path, layers = fixtures.make("deepseek2", tmp_path / "drop", drop={"blk.1.exp_probs_b.bias"})
    tensors = read_tensors(path)
    layer = moe_swift.from_pretrained(path, 1, backend="cpu")
    check_close(layer, tensors, 1, {k: v for k, v in layers[1].items() if k != "selection_bias"}, 5)
    whole, _ = fixtures.make("deepseek2", tmp_path / "whole")
    x = np.random.default_rng(0).standard_normal((200, fixtures.H)).astype(np.float32)
    with_bias = moe_swift.from_pretrained(whole, 1, backend="cpu")
    assert np.any(layer.route(x)[0] != with_bias.route(x)[0])  # the bias moves some choices


def test_a_huge_expert_count_with_per_expert_tensors_is_an_error_not_an_allocation(tmp_path):
    """expert_count 2^31 - 1 in a file of per-expert tensors (older Mixtral files): the
    reader's list grows with the tensors the file holds, not by the count (the checkpoint
    fuzzer found a 223 GB allocation there that aborted the process). In a child process,
    so that a regression fails this test instead of ending the run."""
    path, _ = fixtures.make("mixtral_per_expert", tmp_path / "m", meta={"expert_count": 2**31 - 1})
    code = ("import moe_swift, sys\n"
            "try:\n    moe_swift.from_pretrained(sys.argv[1], progress=False)\n"
            "except ValueError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "no tensor blk.0.ffn_gate.4.weight" in out.stdout, out.stdout
