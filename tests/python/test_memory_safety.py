"""What the caller's memory may do under a layer, and what a layer may allocate, without
crashing or corrupting the process: weight_memory pinned while the library reads it
(an mmap cannot be closed, a tensor's storage cannot be swapped out from under it),
release callbacks never run into a dying interpreter, and conversions of the arguments
checked against the memory budget before any copy is made."""

from __future__ import annotations

import json
import mmap
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import moe_swift
from moe_swift import layer as layer_module

E, H, I, K = 4, 128, 64, 2
PAGE = moe_swift.options.MAPPED_ALIGNMENT
BACKENDS = [b for b in ("cpu", "softmetal") if b in moe_swift.available_backends()]


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    router = rng.standard_normal((E, H), dtype=np.float32) * 0.1
    gate_up = rng.standard_normal((E, 2 * I, H), dtype=np.float32) * 0.05
    down = rng.standard_normal((E, H, I), dtype=np.float32) * 0.05
    return router, gate_up, down


def _layout(memory, gate_up, down):
    """gate_up and down placed in `memory` (a buffer of bytes), as views of it."""
    a = np.frombuffer(memory, np.uint8)
    gu = a[:gate_up.nbytes].view(np.float32).reshape(gate_up.shape)
    d = a[gate_up.nbytes:gate_up.nbytes + down.nbytes].view(np.float32).reshape(down.shape)
    gu[...], d[...] = gate_up, down
    return gu, d


def _size(gate_up, down):
    return -(-(gate_up.nbytes + down.nbytes) // PAGE) * PAGE


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_mmap_given_as_weight_memory_cannot_be_closed_under_the_layer(backend):
    router, gate_up, down = _weights()
    size = _size(gate_up, down)
    memory = mmap.mmap(-1, size + PAGE)  # the system's pages are 4 KiB: a 16 KiB-aligned view of it
    start = -np.frombuffer(memory, np.uint8, count=1).ctypes.data % PAGE
    view = memoryview(memory)[start:start + size]
    gu, d = _layout(view, gate_up, down)
    x = np.random.default_rng(1).standard_normal((3, H), dtype=np.float32)
    layer = moe_swift.MoELayer(router, gate_up_proj=gu, down_proj=d, top_k=K, backend=backend, weight_memory=view)
    expected = moe_swift.MoELayer(router, gate_up_proj=gate_up, down_proj=down, top_k=K, backend=backend)(x)
    del gu, d
    view.release()  # only the layer's hold remains
    with pytest.raises(BufferError):
        memory.close()
    np.testing.assert_array_equal(layer(x), expected)  # not a segfault
    layer.close()
    # This layer's hold (others' layers, a transformers model's held experts, may live on).
    assert layer_module._wait_for_releases(30, view)
    memory.close()  # let go once the library no longer reads it
    assert memory.closed


def test_a_numpy_memmap_given_as_weight_memory_stays_mapped(tmp_path):
    router, gate_up, down = _weights()
    path = tmp_path / "weights.bin"
    size = _size(gate_up, down)
    path.write_bytes(b"\0" * (size + PAGE))
    whole = np.memmap(path, dtype=np.uint8, mode="r+")
    start = -whole.ctypes.data % PAGE
    memory = whole[start:start + size]  # a np.memmap too
    del whole
    gu, d = _layout(memory, gate_up, down)
    x = np.random.default_rng(1).standard_normal((2, H), dtype=np.float32)
    layer = moe_swift.MoELayer(router, gate_up_proj=gu, down_proj=d, top_k=K, backend="cpu", weight_memory=memory)
    expected = moe_swift.MoELayer(router, gate_up_proj=gate_up, down_proj=down, top_k=K, backend="cpu")(x)
    raw = memory._mmap
    del memory, gu, d
    with pytest.raises(BufferError):
        raw.close()
    np.testing.assert_array_equal(layer(x), expected)
    layer.close()


def test_a_torch_tensor_given_new_storage_keeps_the_old_one_for_the_layer():
    torch = pytest.importorskip("torch")
    router, gate_up, down = _weights()
    memory = torch.from_numpy(moe_swift.aligned_buffer(_size(gate_up, down)))
    gu, d = _layout(memory.numpy(), gate_up, down)
    x = np.random.default_rng(1).standard_normal((2, H), dtype=np.float32)
    layer = moe_swift.MoELayer(router, gate_up_proj=gu, down_proj=d, top_k=K, backend="cpu", weight_memory=memory)
    expected = layer(x)
    del gu, d
    memory.set_(torch.zeros(16, dtype=torch.uint8).untyped_storage())  # the old storage is the layer's now
    import gc

    gc.collect()
    np.testing.assert_array_equal(layer(x), expected)
    layer.close()


@pytest.mark.skipif("softmetal" not in BACKENDS, reason="needs the softmetal backend")
def test_layers_sharing_weight_memory_at_interpreter_exit():
    """Two softmetal layers sharing one weight_memory, left open at exit, 100 times: the
    release callback is Python, and it used to run after the interpreter had begun to
    shut down (SIGILL in about one run of three)."""
    code = textwrap.dedent(f"""
        import numpy as np, moe_swift
        E, H, I = {E}, {H}, {I}
        rng = np.random.default_rng(0)
        memory = moe_swift.aligned_buffer(E * 3 * I * H * 4)
        gu = memory[:E * 2 * I * H * 4].view(np.float32).reshape(E, 2 * I, H)
        d = memory[E * 2 * I * H * 4:].view(np.float32).reshape(E, H, I)
        gu[...] = rng.standard_normal(gu.shape) * 0.05
        d[...] = rng.standard_normal(d.shape) * 0.05
        router = rng.standard_normal((E, H), dtype=np.float32)
        layers = [moe_swift.MoELayer(router, gate_up_proj=gu, down_proj=d, top_k=2, backend="softmetal",
                                     weight_memory=memory) for _ in range(2)]
        y = moe_swift.run_layers(layers, np.ones((2, H), np.float32))
        assert np.isfinite(y).all()
    """)
    runs = int(os.environ.get("MOE_EXIT_RUNS", "100"))
    procs, failures = [], []
    for i in range(runs):
        procs.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        if len(procs) == 2 or i == runs - 1:  # two at a time on two cores
            for p in procs:
                out, _ = p.communicate(timeout=300)
                if p.returncode != 0:
                    failures.append((p.returncode, out.decode(errors="replace")[-2000:]))
            procs = []
    assert not failures, f"{len(failures)} of {runs} runs failed; first: {failures[0]}"


def test_conversions_of_the_arguments_are_budgeted_before_they_are_made():
    """float64, non-contiguous and broadcast weights are copied into the layout the library
    reads: those copies are checked against memory_limit (and the system's memory) first.
    Three broadcast float16 arrays of 8 GiB each used to be materialised before the check."""
    big = (1024, 2048, 2048)  # 4 Gi elements: 8 GiB each in float16
    router = np.zeros((big[0], big[2]), np.float32)
    one = np.broadcast_to(np.float16(0.5), big)
    down = np.broadcast_to(np.float16(0.5), (big[0], big[2], big[1]))
    rss = _rss()
    with pytest.raises(MemoryError, match=r"converting gate_proj \(8589934592 bytes\), up_proj \(8589934592 bytes\), "
                                          r"down_proj \(8589934592 bytes\).* needs 25769803776 bytes.*nothing was "
                                          r"allocated"):
        moe_swift.MoELayer(router, one, one, down, top_k=2, backend="cpu")
    with pytest.raises(MemoryError, match=r"only 1048576 bytes .*the memory_limit given"):
        moe_swift.MoELayer(router, one, one, down, top_k=2, backend="cpu", memory_limit=1 << 20)
    assert _rss() - rss < 64 << 20
    # float64 weights: their float32 copies, named; within the limit the library gets the rest.
    router64, gate_up, down32 = _weights()
    gate64 = gate_up[:, :I].astype(np.float64)
    converted = gate64.size * 4 * 2
    own = router64.nbytes + 3 * E * I * H * 4  # the library's copies of router, gate, up and down
    with pytest.raises(MemoryError, match=rf"converting gate_proj \({gate64.size * 4} bytes\), up_proj"):
        moe_swift.MoELayer(router64, gate64, gate64, down32, top_k=K, backend="cpu", memory_limit=converted - 1)
    with pytest.raises(MemoryError, match=r"copies of the weights, but only"):
        moe_swift.MoELayer(router64, gate64, gate64, down32, top_k=K, backend="cpu", memory_limit=converted + own - 1)
    layer = moe_swift.MoELayer(router64, gate64, gate64, down32, top_k=K, backend="cpu", memory_limit=converted + own)
    assert layer(np.ones((1, H), np.float32)).shape == (1, H)
    # Nothing to convert: no check, as before.
    assert layer_module._conversions(router_weight=router64, gate_proj=gate_up[:, :I].copy()) == {}


def test_memory_check_of_the_c_abi():
    from moe_swift import _native

    ffi, lib, _ = _native.load()
    assert lib.moe_memory_check(0, 0, ffi.NULL) == _native.OK
    assert lib.moe_memory_check(10, 10, b"x") == _native.OK
    assert lib.moe_memory_check(11, 10, b"the host's gather") == _native.OUT_OF_MEMORY
    message = ffi.string(lib.moe_last_error()).decode()
    assert "the host's gather needs 11 bytes" in message and "only 10 bytes" in message
    assert lib.moe_memory_check(-1, 0, ffi.NULL) == _native.INVALID_ARGUMENT
    assert lib.moe_memory_check(1 << 62, 0, ffi.NULL) == _native.OUT_OF_MEMORY


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _header(path):
    with open(path, "rb") as f:
        return json.loads(f.read(int.from_bytes(f.read(8), "little")))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["gguf", "safetensors", "sharded safetensors"])
def test_per_expert_checkpoints_are_read_where_they_lie(tmp_path, kind, backend):
    """Checkpoints that store one tensor per expert (older Mixtral GGUFs, and Qwen-MoE's,
    DeepSeek's, Mixtral's bf16 originals) are read where each tensor lies, as stacked
    ones are: memory_limit budgets only the backend's own copies (none here), a file whose
    per-expert tensors all point at the same bytes costs nothing more, and the results
    equal the copied layer's bit for bit — also where one projection's experts straddle two
    shard files (the Metal backends' per-expert table then refers to a span of each)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))
    layer, limit = 0, 4096
    if kind == "gguf":
        pytest.importorskip("gguf")
        import make_gguf

        path, _ = make_gguf.make("mixtral_per_expert", tmp_path, types={"gate": "Q8_0", "up": "Q8_0", "down": "Q8_0"})
    else:
        import make_checkpoints

        if kind == "safetensors":
            path, layer = make_checkpoints.make("qwen2_moe", tmp_path / "qwen2_moe"), 1
        else:
            path = make_checkpoints.make("mixtral", tmp_path / "mixtral")
            shards = {f.name: {k for k in _header(f) if ".layers.0." in k and ".experts." in k}
                      for f in path.glob("*.safetensors")}
            assert sum(1 for names in shards.values() if names) == 2, "layer 0's experts straddle the two shards"
    mapped = moe_swift.from_pretrained(path, layer, backend=backend, memory_limit=limit)
    copied = moe_swift.from_pretrained(path, layer, backend=backend, copy_weights=True)
    x = np.random.default_rng(0).standard_normal((5, mapped.hidden_size)).astype(np.float32)
    y = mapped(x)
    assert np.isfinite(y).all()
    np.testing.assert_array_equal(y, copied(x))
    # The copies that copy_weights makes are budgeted: refused under the same limit.
    with pytest.raises(MemoryError, match=r"only 4096 bytes"):
        moe_swift.from_pretrained(path, layer, backend=backend, copy_weights=True, memory_limit=4096)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_truncated_under_a_layer_is_an_error_not_a_signal(tmp_path, backend):
    """A mapped checkpoint file cut short while a layer reads it in place: reading its
    mapped pages past the new end would raise SIGBUS (on softmetal, a misleading internal
    error); each call checks the file's size first and says what happened."""
    import shutil

    fixtures = os.path.join(os.path.dirname(__file__), "..", "fixtures", "gguf_ggml")
    path = tmp_path / "model.gguf"
    shutil.copyfile(os.path.join(fixtures, "qwen3moe.gguf"), path)
    layer = moe_swift.from_pretrained(path, 0, backend=backend)
    x = np.ones((2, layer.hidden_size), np.float32)
    before = layer(x)
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(ValueError, match=r"model\.gguf was truncated to \d+ bytes after it was mapped \(\d+ bytes\).* "
                                         r"Close the layer and load the file again"):
        layer(x)
    with pytest.raises(ValueError, match="was truncated"):
        layer.route(x)
    layer.close()
    # Restored to its size (the same bytes), it reads as before in a new layer.
    shutil.copyfile(os.path.join(fixtures, "qwen3moe.gguf"), path)
    np.testing.assert_array_equal(moe_swift.from_pretrained(path, 0, backend=backend)(x), before)
