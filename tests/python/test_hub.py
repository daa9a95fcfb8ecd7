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
