"""from_pretrained: MoE layers of a Hugging Face / mlx-lm checkpoint folder, loaded natively.

The loader is the library's own (Sources/MoEKernels/Checkpoint): it memory-maps the
safetensors files, maps config.json and the tensor names of the model_type onto a layer,
and hands each tensor to the layer in its stored format. This module only calls it.
"""

from __future__ import annotations

import numbers
import os
import re

import numpy as np

from . import _native
from .layer import ACTIVATION_QUANTIZATIONS, ACTIVATIONS, BACKENDS, SCORINGS, MoELayer, _choice, _flag, _memory_limit, _real
from .progress import Progress

__all__ = ["from_pretrained", "OVERRIDES"]

def _override_integer(name, value):
    """An integer override (a float is accepted when it is a whole number, as JSON has it)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if isinstance(value, numbers.Integral):
        value = int(value)
    elif isinstance(value, numbers.Real) and np.isfinite(float(value)) and float(value).is_integer():
        value = int(value)
    else:
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if abs(value) >= 2**31:
        raise ValueError(f"{name} must be a 32-bit integer, got {value}")
    return float(value)


# Options that may replace config.json's, and how each becomes the number the C ABI takes.
OVERRIDES = {
    "top_k": _override_integer,
    "norm_topk_prob": lambda name, v: 1.0 if _flag(name, v) else 0.0,
    "routed_scaling_factor": _real,
    "scoring": lambda name, v: _choice(name, v, SCORINGS),
    "n_group": _override_integer,
    "topk_group": _override_integer,
    "activation": lambda name, v: _choice(name, v, ACTIVATIONS),
    "swiglu_alpha": _real,
    "swiglu_limit": _real,
    "activation_quantization": lambda name, v: _choice(name, v, ACTIVATION_QUANTIZATIONS),
}


# What a Hub download needs of a repository: nothing but the loader's files.
HUB_FILES = ["config.json", "model.safetensors.index.json", "*.safetensors"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def resolve(path, revision=None, cache_dir=None):
    """The local folder of `path`: itself when it is a folder, else, for a Hugging Face
    Hub id ("org/name"), its snapshot in the Hub cache, downloaded if needed (only the
    files of HUB_FILES; HF_HUB_OFFLINE=1 and the cache work as for transformers)."""
    if isinstance(path, str) and path.lower().endswith(".gguf") and revision is None:
        return path  # a GGUF file's path, never a Hub id
    if isinstance(path, os.PathLike) or os.path.isdir(path) or revision is None and not (
            isinstance(path, str) and _REPO_ID.match(path) and not os.path.exists(path)):
        return path
    if not isinstance(path, str) or not _REPO_ID.match(path):
        raise ValueError(f"{path!r} is neither a folder nor a Hugging Face Hub id (org/name)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError(f"{path!r} is not a folder here; to load it as a Hugging Face Hub id, install "
                         "huggingface_hub (pip install huggingface_hub)") from None
    try:
        return snapshot_download(repo_id=path, revision=revision, cache_dir=cache_dir, allow_patterns=HUB_FILES)
    except Exception as error:  # offline without the files, unknown repository, no network...
        raise ValueError(f"cannot get {path!r}{'' if revision is None else f' at revision {revision!r}'} from the "
                         f"Hugging Face Hub: {type(error).__name__}: {error}") from error


def from_pretrained(path, layer=None, *, backend="auto", revision=None, cache_dir=None, progress=None,
                    copy_weights=False, memory_limit=None, **overrides):
    """The MoE layer `layer` (index into model.layers, or GGUF's blk.N) of the checkpoint
    `path`, or a dict {index: MoELayer} of all its MoE layers when `layer` is None.

    `path` may be a GGUF file ("model.gguf"), one split of a split model
    ("model-00001-of-00003.gguf": every split is read), or a folder holding one GGUF model;
    llama.cpp's architectures qwen3moe, qwen2moe, llama (with experts: Mixtral), olmoe,
    deepseek2, glm4moe and gpt-oss, their options read from the file's metadata
    (docs/checkpoints.md, "GGUF").

    `path` holds config.json and model.safetensors (or shards listed in
    model.safetensors.index.json), or is a Hugging Face Hub id ("Qwen/Qwen3-30B-A3B",
    with `revision` and `cache_dir` as in huggingface_hub): its config, index and
    safetensors files are fetched into the Hub cache (or found there, HF_HUB_OFFLINE=1
    included), which needs huggingface_hub installed. model_types: mixtral, qwen2_moe, qwen3_moe, olmoe,
    deepseek_v2, deepseek_v3, glm4_moe, gpt_oss; transformers' layouts (per-expert, fused
    3-D, gpt-oss's bf16 and MXFP4) and mlx-lm's (quantized too). Weights keep their stored
    format. `overrides` replace config.json options: top_k, norm_topk_prob,
    routed_scaling_factor, scoring ("softmax"/"sigmoid"), n_group, topk_group, activation,
    swiglu_alpha, swiglu_limit, and activation_quantization ("none"/"q8", MoELayer's),
    which config.json never sets. Errors (dense layer, unknown model_type, missing tensor...)
    raise ValueError with the library's message.

    The safetensors files stay mapped and each layer reads its tensors there in place
    wherever its backend's kernels read the stored layout (metal and softmetal: every
    format; cpu: all but 4-bit codes, which it repacks when the copy fits), so loading
    costs no copy of them and a checkpoint larger than memory still loads (its pages are
    read from disk as the forwards touch them). `copy_weights=True` copies everything
    instead. `memory_limit` (bytes) bounds each layer's copies: a layer whose copies exceed
    it, or what the system has available then, raises MemoryError naming the bytes needed,
    before anything of it is allocated.

    Loading that lasts over two seconds shows a bar of the layers loaded on a terminal, or
    logs to the "moe_swift" logger (moe_swift.progress): `progress=False` or
    MOE_SWIFT_PROGRESS=0 silences it, `progress=True` shows it from the first layer."""
    unknown = set(overrides) - set(OVERRIDES)
    if unknown:
        raise TypeError(f"from_pretrained got unknown options {sorted(unknown)}; overridable: {sorted(OVERRIDES)}")
    backend_code = _choice("backend", backend, BACKENDS)
    label = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path
    converted = [OVERRIDES[k](k, v) for k, v in overrides.items()]
    if layer is not None:
        if isinstance(layer, (bool, np.bool_)) or not isinstance(layer, numbers.Integral):
            raise TypeError(f"layer must be an int or None, got {type(layer).__name__}")
        layer = int(layer)
        if not 0 <= layer < 2**31:
            raise ValueError(f"layer must be a layer index (0 <= layer < 2**31), got {layer}")
    path = os.fsencode(os.fspath(resolve(path, revision, cache_dir)))
    if not path:
        raise ValueError("from_pretrained needs the checkpoint folder's path, got an empty path")
    if not isinstance(copy_weights, (bool, np.bool_)):
        raise TypeError(f"copy_weights must be a bool, got {type(copy_weights).__name__}")
    limit = _memory_limit(memory_limit)
    ffi, lib, _ = _native.load()
    options = ffi.new("moe_load_options *")
    lib.moe_load_options_init(options)
    options.copy_weights = 1 if copy_weights else 0
    options.memory_limit = limit
    names = [ffi.new("char[]", name.encode()) for name in overrides]
    name_array = ffi.new("const char *[]", names) if names else ffi.NULL
    values = ffi.new("double[]", converted) if names else ffi.NULL

    out = ffi.new("moe_checkpoint **")
    _native.check(lib.moe_checkpoint_open(path, out))
    checkpoint = out[0]
    try:
        if layer is None:
            count = ffi.new("int32_t *")
            _native.check(lib.moe_checkpoint_moe_layers(checkpoint, ffi.NULL, 0, count))
            indices = ffi.new("int32_t[]", max(count[0], 1))
            _native.check(lib.moe_checkpoint_moe_layers(checkpoint, indices, count[0], count))
            wanted = [int(indices[i]) for i in range(count[0])]
        else:
            wanted = [layer]
        layers = {}
        try:
            with Progress(f"moe_swift: loading the MoE layers of {label}", len(wanted), progress=progress) as bar:
                for index in wanted:
                    made = ffi.new("moe_layer **")
                    _native.check(lib.moe_layer_create_from_checkpoint_ex(
                        checkpoint, index, backend_code, len(names), name_array, values, options, made))
                    layers[index] = MoELayer._from_handle(made[0])
                    bar.update()
        except BaseException:
            for made_layer in layers.values():
                made_layer.close()
            raise
    finally:
        # Layers that read the files in place hold their mappings; the rest is released here.
        lib.moe_checkpoint_close(checkpoint)
    return layers if layer is None else layers[layer]
