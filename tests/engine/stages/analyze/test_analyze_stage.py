"""The `analyze` stage entry point."""

from __future__ import annotations

import pytest

from engine.contract import PoolSpec, ReleaseRef, StageContext, StageFailed
from engine.stages.analyze.run import run
from tests.engine.stages.realconfigs import load


def _ctx(fetch: dict | None, known: tuple[dict, ...] = ()) -> StageContext:
    lines: list[str] = []
    return StageContext(
        release=ReleaseRef("huggingface", "https://huggingface.co", "org/model", "main"),
        pool=PoolSpec(name="cpu", backend="cpu", queue="pool.cpu"),
        previous={"fetch": fetch} if fetch is not None else {},
        known_families=known,
        log=lines.append,
    )


def test_run_returns_the_analysis_and_what_is_new():
    weights = {
        "source": "index",
        "total_size": 688_586_727_753,
        "shard_count": 163,
        "tensor_count": 91_991,
        "dtypes": {"F8_E4M3": 1, "BF16": 1, "F32": 1},
    }
    result = run(_ctx({"config": load("deepseek-ai__DeepSeek-V3"), "weights": weights}))
    assert result["total_params"] == 671_026_404_352
    assert result["checkpoint_total_size_bytes"] == 688_586_727_753
    assert result["new_against_known"][0]["aspect"] == "family"


def test_run_compares_with_known_families():
    llama = run(_ctx({"config": load("meta-llama__Llama-3.1-8B"), "weights": None}))
    again = run(_ctx({"config": load("meta-llama__Llama-3.1-8B"), "weights": None}, (llama,)))
    assert again["new_against_known"] == []


def test_bad_config_fails_the_stage_with_the_reason():
    with pytest.raises(StageFailed, match="missing required keys: hidden_size"):
        run(
            _ctx(
                {
                    "config": {
                        "model_type": "nova",
                        "num_hidden_layers": 2,
                        "num_attention_heads": 2,
                        "vocab_size": 8,
                    }
                }
            )
        )


def test_missing_fetch_result_fails_the_stage():
    with pytest.raises(StageFailed, match=r"no config\.json"):
        run(_ctx(None))
