"""from_pretrained by Hugging Face Hub id, offline, against a cache folder laid out as the
Hub's (models--org--name/{blobs, snapshots/<commit>, refs/main}, snapshot files symlinked
into blobs/): these machines reach no Hub. Each case runs in a child process with
HF_HUB_OFFLINE=1 and HF_HUB_CACHE set, as a user's environment has them."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import moe_swift

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_checkpoints as fixtures  # noqa: E402

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    source = fixtures.make("mixtral", root / "source")
    repo = root / "cache" / "models--tiny-org--tiny-mixtral"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for path in sorted(source.iterdir()):
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    return root / "cache", source


def run(cache, code):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HF_HOME=str(cache.parent / "home"))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_hub_id_loads_from_the_cache(hub_cache):
    pytest.importorskip("huggingface_hub")
    cache, source = hub_cache
    out = run(cache, f"""
        import numpy as np, moe_swift
        x = np.random.default_rng(0).standard_normal((4, {fixtures.H})).astype(np.float32)
        by_id = moe_swift.from_pretrained("tiny-org/tiny-mixtral", backend="cpu")
        local = moe_swift.from_pretrained({str(source)!r}, backend="cpu")
        assert sorted(by_id) == sorted(local) and by_id
        for i in local:
            np.testing.assert_array_equal(by_id[i](x), local[i](x))
        pinned = moe_swift.from_pretrained("tiny-org/tiny-mixtral", 1, revision={COMMIT!r}, backend="cpu")
        np.testing.assert_array_equal(pinned(x), local[1](x))
        print("ok", sorted(by_id))
    """)
    assert out.startswith("ok")


def test_hub_id_missing_offline_says_so(hub_cache):
    pytest.importorskip("huggingface_hub")
    cache, _ = hub_cache
    out = run(cache, """
        import moe_swift
        try:
            moe_swift.from_pretrained("tiny-org/not-there", 0)
        except ValueError as e:
            print(e)
    """)
    assert "tiny-org/not-there" in out and "Hugging Face Hub" in out


def test_hub_id_without_huggingface_hub(hub_cache):
    cache, _ = hub_cache
    out = run(cache, """
        import sys
        sys.modules["huggingface_hub"] = None  # as if it were not installed
        import moe_swift
        try:
            moe_swift.from_pretrained("Qwen/Qwen3-30B-A3B", 3)
        except ValueError as e:
            print(e)
    """)
    assert "Qwen/Qwen3-30B-A3B" in out and "pip install huggingface_hub" in out


@pytest.mark.parametrize("path", ["no/such/folder/here", "./nowhere"])
def test_paths_that_are_not_ids_stay_paths(path):
    with pytest.raises(ValueError, match="cannot open the checkpoint folder"):
        moe_swift.from_pretrained(path, 0)


@pytest.fixture(scope="module")
def gguf_hub_cache(tmp_path_factory):
    """A GGUF repository in the Hub's cache as huggingface_hub lays it out: one quant's file
    at the top, a split quant in a sub-folder (unsloth's and bartowski's layout), every
    snapshot file a relative symlink into blobs/."""
    pytest.importorskip("gguf")
    import make_gguf

    root = tmp_path_factory.mktemp("gguf_hub")
    split, _ = make_gguf.make("qwen3moe_split", root / "split", split=3)
    files = {"Tiny-Q4_K_M.gguf": FIXTURES_GGUF / "qwen3moe.gguf"}
    parts = sorted(split.parent.glob("*.gguf"))
    for i, part in enumerate(parts, 1):
        files[f"Q8_0/Tiny-Q8_0-{i:05d}-of-{len(parts):05d}.gguf"] = part
    repo = root / "cache" / "models--tiny-org--tiny-GGUF"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    for name, source in files.items():
        data = source.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return root / "cache", files


FIXTURES_GGUF = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_ggml"


def test_hub_gguf_quants_in_a_fresh_process(gguf_hub_cache):
    """"org/name:QUANT" in a process that has imported nothing else: huggingface_hub 2.x
    does not import its `constants` module with the package, and a split quant lies in a
    sub-folder of the snapshot, whose links reach the repository's blobs/ from one level
    deeper."""
    pytest.importorskip("huggingface_hub")
    cache, files = gguf_hub_cache
    q8 = sorted(name for name in files if name.startswith("Q8_0/"))
    out = run(cache, f"""
        import numpy as np, moe_swift
        x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
        top = moe_swift.from_pretrained("tiny-org/tiny-GGUF:Q4_K_M", 0, backend="cpu")
        np.testing.assert_array_equal(top(x), moe_swift.from_pretrained({str(files["Tiny-Q4_K_M.gguf"])!r}, 0,
                                                                       backend="cpu")(x))
        split = moe_swift.from_pretrained("tiny-org/tiny-GGUF", gguf="Q8_0", backend="cpu")
        local = moe_swift.from_pretrained({str(files[q8[0]])!r}, backend="cpu")
        assert sorted(split) == sorted(local) and split
        for i in local:
            np.testing.assert_array_equal(split[i](x[:, :local[i].hidden_size]), local[i](x[:, :local[i].hidden_size]))
        print("ok")
    """)
    assert out.startswith("ok")


def test_hub_gguf_missing_offline_names_the_cache(gguf_hub_cache):
    pytest.importorskip("huggingface_hub")
    cache, _ = gguf_hub_cache
    out = run(cache, """
        import moe_swift
        for name in ("tiny-org/tiny-GGUF:Q6_K", "tiny-org/not-cached:Q4_K_M"):
            try:
                moe_swift.from_pretrained(name, 0)
            except ValueError as e:
                print(e)
    """)
    lines = out.splitlines()
    assert len(lines) == 2, out
    assert "has no GGUF file in 'Q6_K'; quants there: Q4_K_M, Q8_0" in lines[0]
    assert "tiny-org/not-cached" in lines[1] and "HF_HUB_OFFLINE is set" in lines[1] and str(cache) in lines[1]
