"""The folder the engine loads: a small release's own weights from its mirror folder, else the
serving twin saved as a Hugging Face checkpoint beside the release's tokenizer."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.contract import PoolSpec, ReleaseRef, StageContext, StageFailed
from engine.stages.fetch.run import run as fetch_run
from engine.stages.serve.checkpoint import serving_checkpoint
from tests.engine.stages.realconfigs import REALCONFIGS_DIR
from tests.engine.stages.serve.engine_server import LLAMA3_TOKENIZER, make_checkpoint

pytestmark = pytest.mark.slow

POOL = PoolSpec(name="cpu", backend="cpu", queue="cpu")


def _context(root, repo_id):
    release = ReleaseRef("mirror", str(root), repo_id, "main")
    fetched = fetch_run(StageContext(release=release, pool=POOL))
    return StageContext(release=release, pool=POOL, previous={"fetch": fetched})


def test_a_small_release_in_a_mirror_is_served_with_its_own_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path / "var"))
    folder = make_checkpoint(tmp_path / "mirror" / "org" / "tiny-llama")
    served = serving_checkpoint(_context(tmp_path / "mirror", "org/tiny-llama"))
    assert served.kind == "real" and served.folder == folder
    assert served.parameters is None  # the headers give bytes, not a count
    assert served.bytes == sum(p.stat().st_size for p in folder.glob("*.safetensors")) - (
        sum(len(p.read_bytes()[:8]) + int.from_bytes(p.read_bytes()[:8], "little")
            for p in folder.glob("*.safetensors"))
    )  # fmt: skip
    assert served.tokenizer == "fast"


def test_a_hub_release_is_served_as_the_twin_with_its_real_vocabulary(tmp_path, monkeypatch):
    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path / "var"))
    folder = tmp_path / "mirror" / "meta-llama" / "Llama-3.1-8B"
    folder.mkdir(parents=True)
    shutil.copy(REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json", folder / "config.json")
    for item in LLAMA3_TOKENIZER.iterdir():
        shutil.copy(item, folder / item.name)
    ctx = _context(tmp_path / "mirror", "meta-llama/Llama-3.1-8B")
    served = serving_checkpoint(ctx)
    assert served.kind == "twin"
    assert served.folder.parent == tmp_path / "var" / "serve" / "checkpoints"
    config = json.loads((served.folder / "config.json").read_text())
    assert (config["vocab_size"], config["head_dim"], config["num_hidden_layers"]) == (
        128256,
        64,
        4,
    )
    assert {"model.safetensors", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in served.folder.iterdir()
    }
    assert served.parameters == 144_970_240
    assert serving_checkpoint(ctx).folder == served.folder  # content-addressed: saved once


def test_a_release_without_tokenizer_files_cannot_be_served(tmp_path, monkeypatch):
    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path / "var"))
    folder = tmp_path / "mirror" / "meta-llama" / "Llama-3.1-8B"
    folder.mkdir(parents=True)
    shutil.copy(REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json", folder / "config.json")
    with pytest.raises(StageFailed, match="no tokenizer files"):
        serving_checkpoint(_context(tmp_path / "mirror", "meta-llama/Llama-3.1-8B"))
