"""`fetch` then `analyze` on a 64-shard release served by the fake Hub: every shard's header
read by one range request, the tensors kept folded in the fetch result, and the analysis's
total exactly the checkpoint's; a corrupted upload gives findings naming its tensors."""

from __future__ import annotations

import json

import pytest

from engine.contract import PoolSpec, ReleaseRef, StageContext
from engine.stages.analyze.findings import findings
from engine.stages.analyze.run import run as analyze_run
from engine.stages.fetch.run import run as fetch_run
from tests.checkpoints import shard
from tests.engine.architecture.test_checkpoint_count import case
from tests.limitation_words import worded

POOL = PoolSpec(name="cpu", backend="cpu", queue="cpu")
REPO = "deepseek-ai/DeepSeek-V3"


@pytest.fixture(autouse=True)
def own_var_dir(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path / "var"))


def stages(fake_hub, table: dict, config: dict) -> tuple[dict, dict, list[str]]:
    files = {"config.json": json.dumps(config).encode(), **shard(table, 64, data=False)}
    sha = fake_hub.add_repo(REPO, files)
    log: list[str] = []
    release = ReleaseRef("huggingface", fake_hub.url, REPO, sha)
    fetched = fetch_run(StageContext(release=release, pool=POOL, log=log.append))
    analysed = analyze_run(
        StageContext(release=release, pool=POOL, previous={"fetch": fetched}, log=log.append)
    )
    return fetched, analysed, log


def test_fetch_then_analyze_count_a_64_shard_release_from_its_headers(fake_hub):
    c = case("deepseek_v3")

    fetched, analysed, log = stages(fake_hub, c.table, c.config)

    weights = fetched["weights"]
    assert weights["source"] == "safetensors_headers"
    assert weights["shard_count"] == 64
    assert weights["tensor_count"] == len(c.table)
    assert len(weights["tensors"]) < 60  # folded: a few dozen entries, not every name
    shard_reads = [r for r in fake_hub.requests if r.path.endswith(".safetensors")]
    assert len(shard_reads) == 64
    assert all(r.range == "bytes=0-100000" for r in shard_reads)
    assert len(fake_hub.requests) <= 130
    assert analysed["total_params"] == c.params
    assert analysed["extra_params"] == c.mtp_params
    assert analysed["params_counted_from"] == "checkpoint"
    assert any(line.startswith("read the safetensors headers of 64 files") for line in log)
    assert any(line.startswith(f"checkpoint: {len(c.table):,} tensors") for line in log)


def test_a_corrupted_upload_gives_findings_naming_its_tensors(fake_hub):
    c = case("deepseek_v3")
    table = {n: e for n, e in c.table.items() if not n.startswith("model.layers.1.")}
    table["model.layers.3.self_attn.o_proj.weight"] = ("F8_E4M3", (64, 32))

    _, analysed, _ = stages(fake_hub, table, c.config)

    found = {f.key: f for f in worded(findings(analysed, pool="cpu"))}
    assert "layers 1 are missing" in found["analyze:checkpoint-layers"].body
    assert "`model.layers.1.input_layernorm.weight`" in found["analyze:checkpoint-missing"].body
    assert "`model.layers.3.self_attn.o_proj.weight`" in found["analyze:checkpoint-shape"].body
    assert all(f.all_pools for f in found.values())
