"""GGUF quants of Hugging Face Hub repositories: from_pretrained("org/name:Q4_K_M") and
from_pretrained("org/name", gguf="Q4_K_M"), offline: huggingface_hub's listing and
download are replaced by fakes that serve the committed fixtures under the names a
repository on the Hub gives them (unsloth's and bartowski's layouts), and record what
was asked for, so the test sees that only the chosen quant's files are downloaded."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import moe_swift
from moe_swift.checkpoint import pick_gguf

hub = pytest.importorskip("huggingface_hub")
pytest.importorskip("gguf")  # make_gguf writes the split model with it
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_gguf  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_ggml"

# unsloth's layout: one file per quant at the top, its dynamic quants ("UD-"), a vision
# projector, and the large quants split in folders named after them.
UNSLOTH = ["README.md", ".gitattributes", "Qwen3-30B-A3B-Q4_K_M.gguf", "Qwen3-30B-A3B-Q8_0.gguf",
           "Qwen3-30B-A3B-UD-Q4_K_XL.gguf", "Qwen3-30B-A3B-IQ4_XS.gguf", "mmproj-F16.gguf",
           "BF16/Qwen3-30B-A3B-BF16-00001-of-00002.gguf", "BF16/Qwen3-30B-A3B-BF16-00002-of-00002.gguf"]
# bartowski's: the org prefix in the name, lower case too, a folder per split quant.
BARTOWSKI = ["Qwen_Qwen3-30B-A3B-q4_k_m.gguf", "Qwen_Qwen3-30B-A3B-Q6_K_L.gguf",
             "Qwen_Qwen3-30B-A3B-Q8_0/Qwen_Qwen3-30B-A3B-Q8_0-00001-of-00003.gguf",
             "Qwen_Qwen3-30B-A3B-Q8_0/Qwen_Qwen3-30B-A3B-Q8_0-00002-of-00003.gguf",
             "Qwen_Qwen3-30B-A3B-Q8_0/Qwen_Qwen3-30B-A3B-Q8_0-00003-of-00003.gguf"]


@pytest.mark.parametrize("listing, quant, want", [
    (UNSLOTH, "Q4_K_M", ["Qwen3-30B-A3B-Q4_K_M.gguf"]),
    (UNSLOTH, "q8_0", ["Qwen3-30B-A3B-Q8_0.gguf"]),
    (UNSLOTH, "UD-Q4_K_XL", ["Qwen3-30B-A3B-UD-Q4_K_XL.gguf"]),
    (UNSLOTH, "BF16", UNSLOTH[-2:]),
    (BARTOWSKI, "Q4_K_M", ["Qwen_Qwen3-30B-A3B-q4_k_m.gguf"]),
    (BARTOWSKI, "Q8_0", BARTOWSKI[2:]),
    (["Q4_K_M/model-00002-of-00002.gguf", "Q4_K_M/model-00001-of-00002.gguf"], "Q4_K_M",
     ["Q4_K_M/model-00001-of-00002.gguf", "Q4_K_M/model-00002-of-00002.gguf"]),
])
def test_pick_gguf(listing, quant, want):
    assert pick_gguf(listing, quant) == want


@pytest.mark.parametrize("listing, quant, message", [
    (UNSLOTH, "Q5_K_M", r"no GGUF file in 'Q5_K_M'; quants there: BF16, IQ4_XS, Q4_K_M, Q8_0, UD-Q4_K_XL"),
    (UNSLOTH, "F16", r"no GGUF file in 'F16'"),  # the projector's F16 is not a model's
    (["a/X-Q4_K_M.gguf", "b/Y-Q4_K_M.gguf"], "Q4_K_M", r"2 GGUF models in 'Q4_K_M': a/X-Q4_K_M.gguf, b/Y-Q4_K_M.gguf"),
    (BARTOWSKI[:3] + BARTOWSKI[4:], "Q8_0", r"splits of 'Q8_0' are incomplete.*expected 1 to 3 of 3"),
    (["README.md", "config.json"], "Q4_K_M", r"quants there: none"),
])
def test_pick_gguf_errors(listing, quant, message):
    with pytest.raises(ValueError, match=message):
        pick_gguf(listing, quant, "org/name")


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """A repository "tiny-org/tiny-qwen3-GGUF" served from local files: its listing, and a
    snapshot_download that copies only the files its allow_patterns name (every call is
    recorded in `calls`)."""
    split, _ = make_gguf.make("qwen3moe_split", tmp_path / "split", split=3)
    files = {"Tiny-Q4_K_M.gguf": FIXTURES / "qwen3moe.gguf", "Tiny-UD-Q4_K_XL.gguf": FIXTURES / "mixtral.gguf",
             "README.md": FIXTURES / "qwen3moe.npz"}
    splits = sorted(split.parent.glob("*.gguf"))
    for i, p in enumerate(splits, 1):
        files[f"Q8_0/Tiny-Q8_0-{i:05d}-of-{len(splits):05d}.gguf"] = p
    calls = []

    def list_repo_files(repo_id, revision=None, **_):
        calls.append(("list", repo_id, revision))
        if repo_id != "tiny-org/tiny-qwen3-GGUF":
            raise FileNotFoundError(f"404: {repo_id}")
        return list(files)

    def snapshot_download(repo_id, revision=None, cache_dir=None, allow_patterns=None, local_files_only=False, **_):
        calls.append(("download", repo_id, revision, sorted(allow_patterns), local_files_only))
        folder = tmp_path / "snapshot"
        for name, source in files.items():
            if any(Path(name).match(p) for p in allow_patterns) and not local_files_only:
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, folder / name)
        return str(folder)

    monkeypatch.setattr(hub, "list_repo_files", list_repo_files)
    monkeypatch.setattr(hub, "snapshot_download", snapshot_download)
    return calls, files


def test_hub_quant_downloads_only_its_file(fake_hub):
    calls, files = fake_hub
    x = np.load(FIXTURES / "qwen3moe.npz")["x7"]
    by_id = moe_swift.from_pretrained("tiny-org/tiny-qwen3-GGUF:Q4_K_M", 0, backend="cpu")
    local = moe_swift.from_pretrained(files["Tiny-Q4_K_M.gguf"], 0, backend="cpu")
    np.testing.assert_array_equal(by_id(x), local(x))
    assert calls == [("list", "tiny-org/tiny-qwen3-GGUF", None),
                     ("download", "tiny-org/tiny-qwen3-GGUF", None, ["Tiny-Q4_K_M.gguf"], False)]
    calls.clear()
    keyword = moe_swift.from_pretrained("tiny-org/tiny-qwen3-GGUF", 0, gguf="UD-Q4_K_XL", revision="v1", backend="cpu")
    np.testing.assert_array_equal(keyword(x), moe_swift.from_pretrained(files["Tiny-UD-Q4_K_XL.gguf"], 0, backend="cpu")(x))
    assert calls[-1] == ("download", "tiny-org/tiny-qwen3-GGUF", "v1", ["Tiny-UD-Q4_K_XL.gguf"], False)


def test_hub_quant_split_in_a_folder(fake_hub):
    calls, files = fake_hub
    layers = moe_swift.from_pretrained("tiny-org/tiny-qwen3-GGUF:Q8_0", backend="cpu")
    parts = sorted(n for n in files if n.startswith("Q8_0/"))
    local = moe_swift.from_pretrained(files[parts[0]], backend="cpu")
    assert sorted(layers) == sorted(local) == [1, 2]
    x = np.random.default_rng(0).standard_normal((3, make_gguf.H)).astype(np.float32)
    np.testing.assert_array_equal(layers[2](x), local[2](x))
    assert len(parts) > 1 and calls[-1][3] == parts


def test_hub_quant_errors(fake_hub, monkeypatch):
    with pytest.raises(ValueError, match=r"tiny-org/tiny-qwen3-GGUF has no GGUF file in 'Q6_K'; "
                                         r"quants there: Q4_K_M, Q8_0, UD-Q4_K_XL"):
        moe_swift.from_pretrained("tiny-org/tiny-qwen3-GGUF:Q6_K", 0)
    with pytest.raises(ValueError, match=r"cannot get the list of files of 'tiny-org/absent' from the Hugging Face "
                                         r"Hub \(FileNotFoundError: 404: tiny-org/absent\); check the repository id") as caught:
        moe_swift.from_pretrained("tiny-org/absent:Q4_K_M", 0)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # one message, not a chain
    with pytest.raises(ValueError, match=r"needs a Hugging Face Hub id"):
        moe_swift.from_pretrained(FIXTURES / "qwen3moe.gguf", 0, gguf="Q4_K_M")
    with pytest.raises(TypeError, match=r"gguf must name a quant"):
        moe_swift.from_pretrained("tiny-org/tiny-qwen3-GGUF", 0, gguf=4)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if it were not installed
    with pytest.raises(ValueError, match=r"pip install huggingface_hub"):
        moe_swift.from_pretrained("tiny-org/tiny-qwen3-GGUF:Q4_K_M", 0)


def test_hub_quant_offline_picks_among_cached_files(fake_hub, monkeypatch):
    """HF_HUB_OFFLINE=1: no listing; the quant is chosen among the files of the cached
    snapshot, and the download is asked for cached files only."""
    calls, files = fake_hub
    folder = Path(hub.snapshot_download("tiny-org/tiny-qwen3-GGUF", allow_patterns=["Tiny-Q4_K_M.gguf"]))
    calls.clear()
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)
    layer = moe_swift.from_pretrained("tiny-org/tiny-qwen3-GGUF:Q4_K_M", 0, backend="cpu")
    assert os.path.exists(folder / "Tiny-Q4_K_M.gguf") and layer.top_k == 2
    assert [c[0] for c in calls] == ["download", "download"] and all(c[4] for c in calls)
    with pytest.raises(ValueError, match=r"no GGUF file in 'Q8_0'; quants there: Q4_K_M"):
        moe_swift.from_pretrained("tiny-org/tiny-qwen3-GGUF:Q8_0", 0)
