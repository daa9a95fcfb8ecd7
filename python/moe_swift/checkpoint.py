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
from .layer import (ACTIVATION_QUANTIZATIONS, ACTIVATIONS, BACKENDS, SCORINGS, MoELayer, _choice, _flag, _integer,
                    _local_experts, _memory_limit, _real, creating, expert_share)
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
# "org/name:Q4_K_M", as llama.cpp's -hf and Ollama name a GGUF quant of a Hub repository.
_REPO_QUANT = re.compile(r"^([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*):([\w.-]+)$")
# The quant a GGUF file's name ends in (before any -0000k-of-0000n), as llama.cpp's
# quantizer names them and uploaders (unsloth's "UD-" included) write them.
_QUANT = re.compile(r"(?:^|[-._])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|TQ\d_\d|BF16|F16|F32|MXFP4(?:_MOE)?))$", re.I)
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.I)


def _quant_of(path):
    """(quant, model key) of a GGUF file's path in a repository: the model key names a file
    or, for a split, all its splits; quant is None when the name says none."""
    split = _SPLIT.search(path)
    stem = path[:split.start()] if split else path[:-len(".gguf")]
    parts = stem.split("/")
    # A name that says no quant may sit in a folder named after it.
    found = _QUANT.search(parts[-1]) or (len(parts) > 1 and _QUANT.search(parts[-2]))
    return (found.group(1).upper() if found else None), stem


def pick_gguf(files, quant, repo="the repository"):
    """The paths of `files` (a repository's listing) that hold its GGUF model in `quant`:
    one file, or every split of a split model (in a folder named after the quant, as
    unsloth and bartowski lay them out, or not). ValueError, naming the quants there are,
    when none or more than one model matches."""
    models, present = {}, set()
    for f in files:
        if not f.lower().endswith(".gguf") or "mmproj" in f.rsplit("/", 1)[-1].lower():
            continue  # a vision projector is not a model
        q, key = _quant_of(f)
        if q is not None:
            present.add(q)
        if q == quant.upper():
            models.setdefault(key, []).append(f)
    if not models:
        listed = ", ".join(sorted(present)) or "none"
        raise ValueError(f"{repo} has no GGUF file in {quant!r}; quants there: {listed}")
    if len(models) > 1:
        raise ValueError(f"{repo} has {len(models)} GGUF models in {quant!r}: "
                         f"{', '.join(sorted(min(v) for v in models.values()))}; name the one file's path instead")
    (chosen,) = models.values()
    chosen.sort()
    counts = {_SPLIT.search(f).group(2) if _SPLIT.search(f) else None for f in chosen}
    if counts != {None}:
        n = int(max(c for c in counts if c))
        have = {int(_SPLIT.search(f).group(1)) for f in chosen if _SPLIT.search(f)}
        if len(counts) != 1 or have != set(range(1, n + 1)):
            raise ValueError(f"{repo}: the splits of {quant!r} are incomplete ({', '.join(chosen)}; "
                             f"expected 1 to {n} of {n})")
    return chosen


def _hub(not_here):
    """The huggingface_hub module; ValueError saying `not_here` and what to install without it."""
    try:
        import huggingface_hub
        # Not imported by the package itself in every version (2.x imports it lazily), and
        # read below for HF_HUB_OFFLINE and the cache's folder.
        import huggingface_hub.constants  # noqa: F401
    except ImportError:
        raise ValueError(f"{not_here}; to load it as a Hugging Face Hub id, install huggingface_hub "
                         "(pip install huggingface_hub)") from None
    return huggingface_hub


def _hub_failure(hub, what, cache_dir, error):
    """ValueError for a Hub download or listing that failed: one line saying what could not
    be had, why (the innermost cause, not a chain of HTTP client tracebacks), the cache
    that was looked in and what to do."""
    def line(e):
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e).strip() else ''}".rstrip(": ")

    cause = error
    for _ in range(32):  # the first cause, e.g. the connection error under the Hub's own
        if (cause.__cause__ or cause.__context__) is None:
            break
        cause = cause.__cause__ or cause.__context__
    reason = line(error) if cause is error else f"{line(error)}; caused by {line(cause)}"
    cache = cache_dir or hub.constants.HF_HUB_CACHE
    offline = bool(hub.constants.HF_HUB_OFFLINE)
    if offline:
        advice = (f"HF_HUB_OFFLINE is set and the files are not in the cache {cache}; download them once with "
                  "network (or unset HF_HUB_OFFLINE), or pass the local folder or .gguf file")
    else:
        advice = (f"check the repository id and your network, set HF_HUB_OFFLINE=1 to use only the files "
                  f"already in the cache {cache}, or pass the local folder or .gguf file")
    return ValueError(f"cannot get {what} from the Hugging Face Hub ({reason}); {advice}")


def _where(repo, revision):
    """A Hub repository (and revision) as error messages name it."""
    return f"{repo!r}{'' if revision is None else f' at revision {revision!r}'}"


def _gguf_from_hub(repo, quant, revision, cache_dir):
    """The local path of `repo`'s GGUF model in `quant` (its first split), downloading only
    its files; offline (HF_HUB_OFFLINE=1), chosen among the files already cached."""
    hub = _hub(f"{repo}:{quant} is not a file here")
    where = _where(repo, revision)
    try:
        if hub.constants.HF_HUB_OFFLINE:
            folder = hub.snapshot_download(repo_id=repo, revision=revision, cache_dir=cache_dir,
                                           allow_patterns=["*.gguf"], local_files_only=True)
            files = [os.path.relpath(os.path.join(d, f), folder).replace(os.sep, "/")
                     for d, _, names in os.walk(folder) for f in names]
        else:
            files = hub.list_repo_files(repo, revision=revision)
    except Exception as error:  # offline without the files, unknown repository, no network...
        raise _hub_failure(hub, f"the list of files of {where}", cache_dir, error) from None
    chosen = pick_gguf(files, quant, repo)
    try:
        folder = hub.snapshot_download(repo_id=repo, revision=revision, cache_dir=cache_dir, allow_patterns=chosen,
                                       local_files_only=bool(hub.constants.HF_HUB_OFFLINE))
    except Exception as error:
        raise _hub_failure(hub, f"{', '.join(chosen)} of {where}", cache_dir, error) from None
    return os.path.join(folder, *chosen[0].split("/"))


def resolve(path, revision=None, cache_dir=None, gguf=None):
    """The local folder of `path`: itself when it is a folder, else, for a Hugging Face
    Hub id ("org/name"), its snapshot in the Hub cache, downloaded if needed (only the
    files of HUB_FILES; HF_HUB_OFFLINE=1 and the cache work as for transformers). A GGUF
    quant of a Hub repository ("org/name:Q4_K_M", or `gguf="Q4_K_M"`) is the local path
    of that quant's file (or first split), downloaded alone."""
    if gguf is not None:
        if not isinstance(gguf, str) or not gguf:
            raise TypeError(f"gguf must name a quant such as 'Q4_K_M', got {gguf!r}")
        if not isinstance(path, str) or not _REPO_ID.match(path) or "/" not in path:
            raise ValueError(f"gguf={gguf!r} needs a Hugging Face Hub id (org/name), got {path!r}")
        return _gguf_from_hub(path, gguf, revision, cache_dir)
    if isinstance(path, str) and not os.path.exists(path):
        quant = _REPO_QUANT.match(path)
        if quant:
            return _gguf_from_hub(quant.group(1), quant.group(2), revision, cache_dir)
    if isinstance(path, str) and path.lower().endswith(".gguf") and revision is None:
        return path  # a GGUF file's path, never a Hub id
    if isinstance(path, os.PathLike) or os.path.isdir(path) or revision is None and not (
            isinstance(path, str) and _REPO_ID.match(path) and not os.path.exists(path)):
        return path
    if not isinstance(path, str) or not _REPO_ID.match(path):
        raise ValueError(f"{path!r} is neither a folder nor a Hugging Face Hub id (org/name)")
    hub = _hub(f"{path!r} is not a folder here")
    try:
        return hub.snapshot_download(repo_id=path, revision=revision, cache_dir=cache_dir, allow_patterns=HUB_FILES)
    except Exception as error:  # offline without the files, unknown repository, no network...
        raise _hub_failure(hub, _where(path, revision), cache_dir, error) from None


def _share_request(experts, shared_expert):
    """(share, shared) of from_pretrained's arguments: share None (all experts), a range, or
    (rank, world_size); shared True (the whole shared expert), False (none) or (part, parts)
    (its part of a split)."""
    if experts is None:
        share, default_shared = None, True
    elif isinstance(experts, range):
        share, default_shared = experts, True
    elif isinstance(experts, tuple) and len(experts) == 2:
        rank, world = (_integer(name, v, 32) for name, v in zip(("rank", "world_size"), experts))
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"experts=(rank, world_size) needs 0 <= rank < world_size, got {experts}")
        share, default_shared = (rank, world), (rank, world)
    else:
        raise TypeError(f"experts must be None, a range of expert ids or (rank, world_size), got {type(experts).__name__}")
    if isinstance(shared_expert, str):
        if shared_expert != "split" or not isinstance(share, tuple):
            raise ValueError(f'shared_expert must be True, False, or "split" with experts=(rank, world_size), '
                             f"got {shared_expert!r}")
        return share, default_shared
    if shared_expert is None:
        return share, default_shared
    return share, _flag("shared_expert", shared_expert)


def _layer_share(ffi, lib, checkpoint, index, share, interleave):
    """(the range of expert ids layer `index` loads for `share` (a range or (rank,
    world_size)), its whole shared expert's width)."""
    info = ffi.new("moe_layer_info *")
    info.struct_size = ffi.sizeof("moe_layer_info")
    _native.check(lib.moe_checkpoint_layer_info(checkpoint, index, info))
    E, width = int(info.num_experts), int(info.shared_intermediate_size)
    if isinstance(share, tuple):
        return expert_share(*share, E, interleave=interleave), width
    return _local_experts(share, E), width


def from_pretrained(path, layer=None, *, backend="auto", revision=None, cache_dir=None, progress=None,
                    copy_weights=False, memory_limit=None, gguf=None, experts=None, shared_expert=None,
                    interleave=False, **overrides):
    """The MoE layer `layer` (index into model.layers, or GGUF's blk.N) of the checkpoint
    `path`, or a dict {index: MoELayer} of all its MoE layers when `layer` is None.

    `path` may be a GGUF file ("model.gguf"), one split of a split model
    ("model-00001-of-00003.gguf": every split is read), or a folder holding one GGUF model;
    llama.cpp's architectures qwen3moe, qwen2moe, llama (with experts: Mixtral), olmoe,
    deepseek2, glm4moe and gpt-oss, their options read from the file's metadata
    (docs/checkpoints.md, "GGUF"). A GGUF quant of a Hugging Face Hub repository is
    "org/name:Q4_K_M" (as llama.cpp's -hf and Ollama name it) or "org/name" with
    `gguf="Q4_K_M"`: the repository's listing gives that quant's file, or its splits (also
    in a folder named after the quant), and only those are downloaded; an error lists the
    quants there when none or several match.

    `path` holds config.json and model.safetensors (or shards listed in
    model.safetensors.index.json), or is a Hugging Face Hub id ("Qwen/Qwen3-30B-A3B",
    with `revision` and `cache_dir` as in huggingface_hub): its config, index and
    safetensors files are fetched into the Hub cache (or found there, HF_HUB_OFFLINE=1
    included), which needs huggingface_hub installed. model_types: mixtral, qwen2_moe, qwen3_moe, olmoe,
    deepseek_v2, deepseek_v3, glm4_moe, gpt_oss, granitemoe; transformers' layouts (per-expert, fused
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

    Expert parallelism (docs/distributed.md): `experts` loads a share of each layer's routed
    experts, as MoELayer's local_experts: a range of expert ids, or (rank, world_size) for
    rank's share of world_size (moe_swift.distributed.expert_share: contiguous, or with
    `interleave=True` every world_size-th expert from rank on, which balances DeepSeek-V3's
    group-limited routing). Only that share's tensors are mapped and read; the router is
    read whole. With (rank, world_size) the shared expert is split (the default,
    `shared_expert="split"`): each rank holds 1/world_size of its width (gate and up rows,
    down columns), so that the ranks' work stays even; a width that does not divide into
    whole quantization groups stays whole on rank 0. `shared_expert=True` / `False` holds it
    whole or not at all.

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
    path = os.fsencode(os.fspath(resolve(path, revision, cache_dir, gguf)))
    if not path:
        raise ValueError("from_pretrained needs the checkpoint folder's path, got an empty path")
    if not isinstance(copy_weights, (bool, np.bool_)):
        raise TypeError(f"copy_weights must be a bool, got {type(copy_weights).__name__}")
    limit = _memory_limit(memory_limit)
    share, shared = _share_request(experts, shared_expert)
    interleave = _flag("interleave", interleave)
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
                    whole_width = None
                    if share is not None:
                        local, whole_width = _layer_share(ffi, lib, checkpoint, index, share, interleave)
                        options.first_local_expert, options.num_local_experts = local.start, len(local)
                        options.local_expert_stride = local.step
                    options.without_shared_expert = 0 if shared else 1
                    if isinstance(shared, tuple):
                        options.shared_expert_part, options.shared_expert_parts = shared
                    made = ffi.new("moe_layer **")
                    with creating(backend_code, progress):
                        _native.check(lib.moe_layer_create_from_checkpoint_ex(
                            checkpoint, index, backend_code, len(names), name_array, values, options, made))
                    layers[index] = MoELayer._from_handle(made[0])
                    width = layers[index].shared_intermediate_size
                    if isinstance(shared, tuple) and shared[1] > 1 and whole_width and width * shared[1] == whole_width:
                        layers[index].shared_expert_part = shared  # (part, parts) of a split
                    bar.update()
        except BaseException:
            for made_layer in layers.values():
                made_layer.close()
            raise
    finally:
        # Layers that read the files in place hold their mappings; the rest is released here.
        lib.moe_checkpoint_close(checkpoint)
    return layers if layer is None else layers[layer]
