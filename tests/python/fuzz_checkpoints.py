"""Structure-aware fuzzing of checkpoint folders: a valid folder of every family and layout
of tests/fixtures/make_checkpoints.py, then a few mutations that keep most of it valid so
that each one reaches deep into the loader: config.json values of every type and size,
per-module quantization settings, tensors removed, retyped, reshaped, truncated or moved,
safetensors headers with lengths and offsets that lie, index files that name other files;
and GGUF files of every architecture (tests/fixtures/make_gguf.py, ggml's block types
mixed) whose metadata values, tensor infos and header bytes lie.
Every case must load and run, or raise ValueError / TypeError / MemoryError: a signal, a
sanitizer report or a hang fails it.

Not collected by pytest directly (no test_ prefix): test_fuzz_checkpoints.py runs this
file in a child process against libMoESwift built with AddressSanitizer and UBSan.
MOE_FUZZ_EXAMPLES sets the examples (default 150) for longer runs by hand:

    MOE_FUZZ_EXAMPLES=20000 python -m pytest -q -p no:cacheprovider tests/python/fuzz_checkpoints.py
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import moe_swift

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_checkpoints as fixtures  # noqa: E402
import make_gguf  # noqa: E402

EXAMPLES = int(os.environ.get("MOE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
EXPECTED = (ValueError, TypeError, MemoryError)

# The folder of the case being loaded stays in ROOT/case: after a crash, it is the reproducer.
ROOT = Path(os.environ.get("MOE_FUZZ_DIR") or tempfile.mkdtemp(prefix="moe-fuzz-checkpoints-"))
BASES = {case: fixtures.make(case, ROOT / "bases" / case) for case in fixtures.CASES}
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2,
         "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}

# Everything a family's configure step reads, and then some.
CONFIG_KEYS = ["hidden_size", "num_hidden_layers", "num_experts", "num_local_experts", "n_routed_experts",
               "num_experts_per_tok", "moe_intermediate_size", "intermediate_size",
               "shared_expert_intermediate_size", "n_shared_experts", "norm_topk_prob", "routed_scaling_factor",
               "n_group", "topk_group", "topk_method", "scoring_func", "hidden_act", "first_k_dense_replace",
               "moe_layer_freq", "decoder_sparse_step", "mlp_only_layers", "swiglu_limit", "model_type",
               "quantization", "quantization_config"]
NUMBERS = [0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 48, 63, 64, 65, 96, 128, 2**31 - 1, 2**31, 2**32, 2**40, 2**53,
           2**62, 2**63 - 1, -1, -2, -2**31, -2**63, 0.5, 1.5, 64.0, 1e308, -1e308, 1e-310]
VALUES = st.sampled_from(NUMBERS) | st.sampled_from(
    ["x", "", "silu", "gelu", "gelu_pytorch_tanh", "swiglu", "softmax", "sigmoid", "noaux_tc", "greedy",
     "group_limited_greedy", "mixtral", "qwen2_moe", "gpt_oss", "deepseek_v2", None, True, False, [], {},
     [0], [0, 1, 2], [-1], [2**40], ["0"], {"bits": 4}]) | st.integers() | st.floats()


def read_folder(folder):
    """(config dict, index dict or None, {name: [dtype, shape, bytes]})."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        raw = path.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        for name, entry in json.loads(raw[8:8 + n]).items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            tensors[name] = [entry["dtype"], list(entry["shape"]), raw[8 + n + begin:8 + n + end]]
    return config, index, tensors


def safetensors_bytes(tensors, lie=None):
    """A safetensors file of `tensors`; `lie(header)` may change the header's entries."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if lie:
        lie(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


@st.composite
def tensor_mutation(draw, tensors):
    """Changes one tensor of `tensors` in place, usually keeping its byte count."""
    if not tensors:
        return
    name = draw(st.sampled_from(sorted(tensors)))
    dtype, shape, data = tensors[name]
    what = draw(st.sampled_from(["delete", "retype", "reshape", "truncate", "grow", "scalar", "rename", "empty"]))
    if what == "delete":
        del tensors[name]
    elif what == "retype":  # same bytes, another dtype: the shape's last dim scaled to match
        new = draw(st.sampled_from(sorted(SIZES)))
        elements = len(data) // SIZES[new]
        tensors[name] = [new, shape[:-1] + [elements // max(int(np.prod(shape[:-1])), 1)] if shape else [elements],
                         data[:elements * SIZES[new]]]
        dtype, shape, data = tensors[name]
        count = int(np.prod(shape)) * SIZES[new]
        tensors[name][2] = data[:count] + b"\0" * max(0, count - len(data))
    elif what == "reshape":  # the same elements in other dimensions
        n = int(np.prod(shape)) if shape else 1
        options = [[n], [1, n], [n, 1], list(reversed(shape)), shape + [1], shape[1:] if shape else [],
                   [2, n // 2] if n % 2 == 0 else [n], [n // 32, 32] if n % 32 == 0 else [n]]
        tensors[name][1] = draw(st.sampled_from(options))
        if int(np.prod(tensors[name][1])) != n:
            tensors[name][1] = shape
    elif what in ("truncate", "grow"):  # a dimension cut or extended, bytes to match
        if not shape:
            return
        axis = draw(st.integers(0, len(shape) - 1))
        new_shape = list(shape)
        new_shape[axis] = draw(st.sampled_from([0, 1, max(shape[axis] // 2, 1), shape[axis] - 1]) if what == "truncate"
                               else st.sampled_from([shape[axis] + 1, shape[axis] * 2, shape[axis] + 32]))
        new_shape[axis] = max(new_shape[axis], 0)
        count = int(np.prod(new_shape)) * SIZES[dtype]
        tensors[name] = [dtype, new_shape, (data * (count // max(len(data), 1) + 1))[:count] if data else b"\0" * count]
    elif what == "scalar":
        tensors[name] = [dtype, [], data[:SIZES[dtype]].ljust(SIZES[dtype], b"\0")]
    elif what == "empty":
        tensors[name] = [dtype, [0] + shape[1:], b""]
    elif what == "rename":  # the same tensor under a neighbouring layer's or expert's name
        other = name.replace(".0.", ".1.", 1) if ".0." in name else name.replace(".1.", ".0.", 1)
        tensors[other] = tensors.pop(name)


@st.composite
def header_lie(draw):
    """A change to a header's entries that the bytes no longer back."""
    kind = draw(st.sampled_from(["offsets", "dtype", "shape", "junk", "metadata", None]))

    def lie(header):
        names = sorted(header)
        if not names or kind is None:
            return
        entry = header[names[draw(st.integers(0, len(names) - 1))]]
        if kind == "offsets":
            entry["data_offsets"] = draw(st.sampled_from(
                [[0, 0], [-1, 4], [4, 2], [0, 2**63 - 1], [0, 2**64], [2**62, 2**62 + 4], [1, 5], [0, 1.5], "x", [0]]))
        elif kind == "dtype":
            entry["dtype"] = draw(st.sampled_from(["F4", "", 3, None, "BF16", "U32", "U8", "F8_E4M3"]))
        elif kind == "shape":
            entry["shape"] = draw(st.sampled_from([[-1], [2**62, 2**62], [2**31, 2**31, 4], "x", [1.5], [None],
                                                   [0], [], [[1]], [1] * 64]))
        elif kind == "junk":
            header[draw(st.sampled_from(["", "__metadata__", "x" * 300, "\u0000"]))] = draw(VALUES)
        elif kind == "metadata":
            header["__metadata__"] = draw(VALUES)
    return lie


@st.composite
def cases(draw):
    base = draw(st.sampled_from(sorted(BASES)))
    config, index, tensors = read_folder(BASES[base])
    for _ in range(draw(st.integers(0, 3))):  # config.json
        key = draw(st.sampled_from(CONFIG_KEYS))
        if draw(st.integers(0, 5)) == 0:
            config.pop(key, None)
        else:
            config[key] = draw(VALUES)
    if draw(st.integers(0, 3)) == 0:  # quantization, global or for one module
        q = config.setdefault("quantization", {})
        if isinstance(q, dict):
            target = q
            if draw(st.booleans()):
                module = draw(st.sampled_from(sorted({n.rsplit(".", 1)[0] for n in tensors}) or ["m"]))
                target = q.setdefault(module, {}) if draw(st.integers(0, 4)) else q
                if target is q:
                    q[module] = draw(st.sampled_from([False, None, 4, "x"]))
            if isinstance(target, dict):
                for key in draw(st.lists(st.sampled_from(["bits", "group_size", "mode"]), max_size=3)):
                    target[key] = draw(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 8, 16, 32, 64, 128, 7, 48, -4, 2**40,
                                                        "affine", "mxfp4", "nf4", None, 4.5]))
    for _ in range(draw(st.integers(0, 3))):
        draw(tensor_mutation(tensors))
    shards = draw(st.sampled_from([1, 1, 2, 3]))
    names = sorted(tensors)
    parts = [{n: tensors[n] for n in names[s::shards]} for s in range(shards)]
    files = {}
    if shards == 1 and index is None and draw(st.integers(0, 3)):
        files["model.safetensors"] = safetensors_bytes(parts[0], draw(header_lie()))
    else:
        weight_map = {}
        for s, part in enumerate(parts):
            file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            files[file] = safetensors_bytes(part, draw(header_lie()) if s == 0 else None)
            weight_map.update({n: file for n in part})
        if draw(st.integers(0, 4)) == 0 and weight_map:
            weight_map[sorted(weight_map)[0]] = draw(st.sampled_from(
                ["../outside.safetensors", "/etc/hostname", "missing.safetensors", "", "sub/x.safetensors", ".",
                 "config.json", "model.safetensors.index.json", 5, None, "a\u0000b"]))
        files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    if draw(st.integers(0, 6)) == 0:  # bytes cut off the end of one file
        victim = draw(st.sampled_from(sorted(files)))
        files[victim] = files[victim][:draw(st.integers(0, len(files[victim])))]
    files["config.json"] = json.dumps(config).encode()
    layer = draw(st.sampled_from([None, None, 0, 1, 2, 3, -1, 2**31 - 1]))
    return files, layer


def write(files):
    folder = ROOT / "case"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    (ROOT / "outside.safetensors").write_bytes(safetensors_bytes({"x": ["F32", [1], b"\0" * 4]}))
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


@FUZZ
@given(cases())
def test_checkpoint_folders(case):
    files, layer = case
    folder = write(files)
    load_and_run(folder, layer)


def load_and_run(path, layer):
    """Loads `path` (all its MoE layers when `layer` is None) and runs each layer once, or
    returns on an expected error."""
    try:
        loaded = moe_swift.from_pretrained(path, layer, backend="cpu")
    except EXPECTED:
        return
    layers = loaded if layer is None else {layer: loaded}
    for made in layers.values():
        x = np.linspace(-1, 1, 3 * made.hidden_size, dtype=np.float32).reshape(3, made.hidden_size)
        assert made(x).shape == x.shape
        made.close()


# GGUF files: each base's metadata values (where they lie in the file, from the gguf
# package's reader) and the header around them, overwritten.
# Block types keep the files small (each example writes one); F32 routers and vectors stay.
GGUF_BASES = {case: make_gguf.make(case, ROOT / "gguf" / case, types=types)[0] for case, types in [
    ("qwen2moe", {"gate": "Q4_K", "up": "Q4_K", "down": "Q6_K", "shexp": "Q8_0"}),
    ("deepseek2", {"gate": "Q5_K", "up": "IQ4_XS", "down": "Q3_K", "shexp": "Q2_K"}),
    ("glm4moe", {"gate": "Q4_0", "up": "Q4_1", "down": "Q5_0", "shexp": "Q4_K"}),
    ("gpt-oss", {"gate": "MXFP4", "up": "MXFP4", "down": "MXFP4"}),
    ("mixtral_per_expert", {"gate": "Q4_0", "up": "Q5_1", "down": "IQ4_NL"}),
    ("fused_gate_up", {"gate": "Q8_0", "down": "Q6_K"})]}
# A third of the examples: a GGUF example writes and maps a file of about a megabyte.
GGUF_FUZZ = settings(FUZZ, max_examples=max(1, EXAMPLES // 3))


def gguf_layout(path):
    """(file bytes, data offset, [(offset, size) of each scalar metadata value])."""
    from gguf import GGUFReader
    reader = GGUFReader(path)
    values = []
    for field in reader.fields.values():
        if len(field.types) == 1 and field.types[0].value not in (8, 9):  # scalars: not strings, not arrays
            at = field.offset + 8 + len(field.name.encode()) + 4
            values.append((at, field.parts[-1].nbytes))
    return bytearray(Path(path).read_bytes()), reader.data_offset, values


GGUF_LAYOUTS = {case: gguf_layout(path) for case, path in GGUF_BASES.items()}


@st.composite
def gguf_cases(draw):
    raw, data_offset, values = GGUF_LAYOUTS[draw(st.sampled_from(sorted(GGUF_LAYOUTS)))]
    raw = bytearray(raw)
    for _ in range(draw(st.integers(0, 3))):  # a metadata value replaced by another number
        at, size = draw(st.sampled_from(values))
        n = draw(st.sampled_from([v for v in NUMBERS if isinstance(v, int)]))
        raw[at:at + size] = (n % 2 ** (8 * size)).to_bytes(size, "little")
    for _ in range(draw(st.integers(0, 3))):  # header bytes: lengths, counts, types, dimensions, offsets
        at = draw(st.integers(4, data_offset - 1))
        width = draw(st.sampled_from([1, 4, 8]))
        value = draw(st.sampled_from([0, 1, 2, 5, 31, 255, 2**31, 2**32 - 1, 2**63, 2**64 - 1]))
        raw[at:at + width] = (value % 2 ** (8 * width)).to_bytes(width, "little")[:len(raw[at:at + width])]
    if draw(st.integers(0, 6)) == 0:
        raw = raw[:draw(st.integers(0, len(raw)))]
    layer = draw(st.sampled_from([None, None, 0, 1, 2, 3, -1]))
    return bytes(raw), layer


@GGUF_FUZZ
@given(gguf_cases())
def test_gguf_files(case):
    raw, layer = case
    folder = ROOT / "case"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    (folder / "model.gguf").write_bytes(raw)
    load_and_run(folder / "model.gguf", layer)
