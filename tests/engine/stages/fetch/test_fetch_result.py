"""The fetch stage's typed result (`engine/stages/fetch/result.py`): what the stage writes reads
back unchanged, a stored row of any shape reads without raising, and the release keeps what
the result says of it."""

from __future__ import annotations

import json

import pytest

from engine.contract import PoolSpec, ReleaseRef, StageContext
from engine.hubs.base import INDEX_FILE, ReleaseFiles
from engine.stages.fetch.result import (
    FROM_HEADERS,
    FetchResult,
    NameList,
    TokenizerFiles,
    WeightsSummary,
)
from engine.stages.fetch.run import parse_release_files
from engine.stages.fetch.run import run as fetch_run
from tests.checkpoints import shard

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}
TENSORS = {
    "model.layers.0.mlp.up_proj.weight": {"dtype": "BF16", "shape": [128, 64]},
    "model.layers.1.mlp.up_proj.weight": {"dtype": "BF16", "shape": [128, 64]},
    "lm_head.weight": {"dtype": "F32", "shape": [256, 64]},
}
TOKENIZER = {
    "dir": "/var/day0/tokenizers/ab12",
    "files": [{"name": "tokenizer.json", "bytes": 1_024, "sha256": "ab12"}],
    "skipped": [{"name": "tokenizer.model", "reason": "over the cap"}],
    "kind": "tokenizers",
}


def _fetched(**files: bytes) -> ReleaseFiles:
    return ReleaseFiles(
        repo_id="org/model",
        revision="abc",
        files={"config.json": json.dumps(CONFIG).encode(), **files},
        safetensors_metadata={
            "total_size": 50_000,
            "shard_count": 2,
            "tensors": TENSORS,
            "duplicates": {"count": 1, "names": ["lm_head.weight"]},
        },
        file_sizes={"config.json": 10, "model.safetensors": 50_000},
    )


def _stored(value: dict) -> dict:
    """`value` as the database gives it back (JSON)."""
    return json.loads(json.dumps(value))


def test_what_the_stage_writes_reads_back_unchanged():
    index = {
        "metadata": {"total_size": 49_000},
        "weight_map": {"lm_head.weight": "a.safetensors", "model.norm.weight": "a.safetensors"},
    }
    written = _stored(
        parse_release_files(
            _fetched(
                **{
                    INDEX_FILE: json.dumps(index).encode(),
                    "generation_config.json": b'{"temperature": 0.6}',
                    "README.md": b"# Model",
                }
            )
        )
        | {"tokenizer": TOKENIZER}
    )

    result = FetchResult.from_stored(written)

    assert result.to_dict() == written
    assert result.config == CONFIG and result.generation_config == {"temperature": 0.6}
    weights = result.weights
    assert weights is not None and weights.source == FROM_HEADERS and weights.from_headers
    assert weights.tensor_count == 3 and weights.index_total_size == 49_000
    assert weights.duplicates == NameList(1, ("lm_head.weight",))
    # the index and the headers name different tensors: each side's names are kept
    assert weights.index_mismatch
    assert weights.index_only == NameList(1, ("model.norm.weight",))
    assert weights.headers_only is not None and weights.headers_only.count == 2
    assert result.tokenizer is not None and result.tokenizer.files[0].sha256 == "ab12"


def test_what_the_stage_fetches_from_a_hub_reads_back_unchanged(fake_hub, monkeypatch, tmp_path):
    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path / "var"))  # where the tokenizer is kept
    table = {name: (info["dtype"], tuple(info["shape"])) for name, info in TENSORS.items()}
    files = {
        "config.json": json.dumps(CONFIG).encode(),
        "tokenizer.json": b'{"model": {"type": "BPE", "vocab": {}}}',
        **shard(table, 2, data=False),
    }
    release = ReleaseRef(
        "huggingface", fake_hub.url, "org/model", fake_hub.add_repo("org/model", files)
    )
    pool = PoolSpec(name="cpu", backend="cpu", queue="cpu")
    written = _stored(fetch_run(StageContext(release=release, pool=pool, log=lambda _: None)))

    result = FetchResult.from_stored(written)

    assert result.to_dict() == written
    assert result.weights is not None and result.weights.shard_count == 2
    assert result.tokenizer is not None
    assert [f.name for f in result.tokenizer.files] == ["tokenizer.json"]


def test_an_index_alone_and_no_weights_read_back_unchanged():
    index = {"metadata": {"total_size": 10}, "weight_map": {"w": "a.safetensors"}}
    by_index = _stored(
        parse_release_files(
            ReleaseFiles(
                repo_id="org/model",
                revision="abc",
                files={"config.json": b"{}", INDEX_FILE: json.dumps(index).encode()},
            )
        )
    )
    bare = _stored(
        parse_release_files(ReleaseFiles(repo_id="o/m", revision="r", files={"config.json": b"{}"}))
    )

    assert FetchResult.from_stored(by_index).to_dict() == by_index
    assert FetchResult.from_stored(bare).to_dict() == bare
    summary = FetchResult.from_stored(by_index).weights
    assert summary is not None and not summary.from_headers and summary.tensors is None
    assert FetchResult.from_stored(bare).weights is None


@pytest.mark.parametrize(
    "row",
    [
        None,
        [],
        "fetched",
        {},
        {"config": [1], "generation_config": "x", "files": "config.json", "weights": 3},
        {"weights": {"tensors": "all", "dtypes": [1], "index_mismatch": [], "duplicates": 2}},
        {"tokenizer": {"files": [None, {"name": 3}], "skipped": {}, "dir": 7}},
        {"file_count": 2.5, "readme_excerpt": None, "repo_id": None},
    ],
)
def test_a_stored_row_of_any_shape_reads_without_raising(row):
    result = FetchResult.from_stored(row)

    # every field is its own type, whatever the row held
    assert isinstance(result.files, tuple) and isinstance(result.readme_excerpt, str)
    assert result.config is None or isinstance(result.config, dict)
    assert result.file_count is None
    # what it reads, written back, reads the same
    assert FetchResult.from_stored(result.to_dict()) == result
    assert set(result.release_metadata()) == {
        "files",
        "weights",
        "generation_config",
        "readme_excerpt",
    }


def test_wrong_types_inside_a_row_are_ignored():
    result = FetchResult.from_stored(
        {
            "config": [1],
            "weights": {"source": "index", "tensor_count": "3", "dtypes": {"BF16": "x", "F32": 8}},
            "tokenizer": {"files": [None, {"name": "tokenizer.json", "bytes": "1"}], "dir": 7},
        }
    )

    assert result.config is None
    assert result.weights == WeightsSummary(source="index", dtypes={"F32": 8})
    assert result.tokenizer is not None and result.tokenizer.dir is None
    assert [f.name for f in result.tokenizer.files] == ["tokenizer.json"]
    assert result.tokenizer.files[0].bytes is None
    assert TokenizerFiles.from_stored("tokenizers") is None


def test_the_release_keeps_the_files_the_weights_the_generation_config_and_the_readme():
    written = _stored(parse_release_files(_fetched(**{"README.md": b"# Model card"})))

    metadata = FetchResult.from_stored(written).release_metadata()

    assert metadata == {
        "files": ["README.md", "config.json"],
        "weights": written["weights"],
        "generation_config": None,
        "readme_excerpt": "# Model card",
    }
