"""The distributed stage's typed result (`engine/stages/distributed/result.py`): the recorded
runs (tests/data/distributed: a Qwen3-MoE twin passing at TP=2 EP=2, a wrong shard caught at a
module, a rank killed mid-run, an architecture without a tensor-parallel plan) read back as
stored, rows of older versions and rubbish read as empty without raising, and the verdict, the
failing rank, a crash against a mismatch and the measured scaling point judged once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.stages.distributed.degree import EP_NOT_VALIDATED
from engine.stages.distributed.result import (
    FAILED,
    NOT_VALIDATED,
    PASSED,
    DistributedResult,
    MeasuredScaling,
    RankLog,
)
from engine.stages.plan.result import Split

DATA = Path(__file__).resolve().parents[3] / "data" / "distributed"


def recorded(name: str) -> dict[str, Any]:
    """A recorded run's stored result (a failed run keeps it under "result")."""
    data = json.loads((DATA / f"{name}.json").read_text())
    return data.get("result", data)


def test_a_passing_run_reads_back_as_stored():
    stored = recorded("pass")
    result = DistributedResult.from_stored(stored)

    assert (result.verdict, result.matched_reference, result.ran) == (PASSED, True, True)
    assert (result.tp, result.ep, result.world_size, result.backend) == (2, 2, 2, "gloo")
    assert result.max_abs_error == stored["max_abs_error"]
    assert result.tolerance.max_abs_error == stored["tolerance"]["max_abs_error"]
    assert [row.rank for row in result.ranks] == [0, 1]
    assert all(row.passed and row.divergence is None for row in result.ranks)
    assert result.plan == Split(tp=8, pp=1, ep=8, dp=1)
    assert [(row.name, row.release, row.twin, row.kept) for row in result.divisibility] == [
        ("query heads / TP", 64, 32, True)
    ]
    assert result.twin is not None and result.twin.model_class == "Qwen3MoeForCausalLM"
    assert not result.real_weights and not result.broken_on_purpose
    headline = result.headline
    assert headline is not None
    assert (headline.tp, headline.step_time_s, headline.batch) == (
        2,
        stored["step_time_s"],
        stored["prompt"]["batch"],
    )
    assert result.measured_scaling(succeeded=True) == MeasuredScaling(
        devices=2,
        efficiency=stored["scaling_efficiency"],
        tp=2,
        ep=2,
        backend="gloo",
        passed=True,
    )
    # The same figures on a run that did not succeed never pass.
    assert result.measured_scaling(succeeded=False).passed is False


def test_a_wrong_shard_fails_on_the_first_rank_off_the_reference():
    result = DistributedResult.from_stored(recorded("mismatch"))

    assert (result.verdict, result.matched_reference, result.crashed) == (FAILED, False, False)
    assert result.failing_rank == 0 and [row.rank for row in result.failing_ranks] == [0, 1]
    divergence = result.ranks[0].divergence
    assert divergence is not None and divergence.module == "model.layers.1.self_attn"
    assert divergence.placed and divergence.sized
    assert divergence.where() == {
        "module": "model.layers.1.self_attn",
        "layer": 1,
        "kind": "attention",
    }
    # The job broke it on purpose; its timing is still a measured scaling point.
    assert result.broken_on_purpose
    point = result.measured_scaling(succeeded=False)
    assert point is not None and (point.devices, point.passed) == (2, False)


def test_a_run_broken_on_purpose_says_so_by_the_options_settings_or_by_name():
    assert DistributedResult.from_stored({"inject": {"kill_rank": 1}}).broken_on_purpose
    named = DistributedResult.from_stored({"inject": "wrong-shard"})
    assert named.broken_on_purpose and named.inject == {}
    for nothing in ({}, "", None, ["kill_rank"]):
        assert not DistributedResult.from_stored({"inject": nothing}).broken_on_purpose


def test_a_killed_rank_is_a_crash_named_with_its_signal():
    result = DistributedResult.from_stored(recorded("crash"))

    assert result.verdict == FAILED and result.crashed and not result.ranks
    assert result.failing_rank == 1 and result.failed_rank_exit_code == -9
    log = result.rank_log(1)
    assert log is not None and (log.signal, log.signal_name, log.ended) == (9, "SIGKILL", True)
    assert result.rank_log(0).signal_name == "SIGTERM"
    assert result.headline is None and result.measured_scaling(succeeded=False) is None


def test_a_split_that_could_not_be_validated():
    result = DistributedResult.from_stored(recorded("not_validated"))

    assert (result.verdict, result.ran, result.matched_reference) == (NOT_VALIDATED, False, False)
    assert result.plan == Split(tp=1, pp=1, ep=1, dp=1) and result.pool_devices == 2
    assert result.reason.startswith("transformers' FooForCausalLM has no tensor-parallel plan")
    assert result.measured_scaling(succeeded=True) is None


def test_a_run_without_a_verdict_is_not_validated_and_a_row_that_is_no_run_judges_nothing():
    assert DistributedResult.from_stored({"validated": True}).verdict == NOT_VALIDATED
    assert DistributedResult.from_stored({}).verdict is None
    assert DistributedResult.from_stored({"passed": True}).verdict is None


def test_why_expert_parallelism_was_left_out_without_its_lead():
    why = "transformers' FooForCausalLM has no expert-parallel plan (ep_plan)"
    result = DistributedResult.from_stored({"ep_note": f"{EP_NOT_VALIDATED}{why}"})
    assert result.ep_reason == why
    other = "expert parallelism asked for, but the release has no routed experts"
    assert DistributedResult.from_stored({"ep_note": other}).ep_reason == other
    assert DistributedResult.from_stored({}).ep_reason == ""


@pytest.mark.parametrize(
    "stored",
    [
        None,
        "not a result",
        [1, 2],
        {
            "validated": "yes",
            "passed": 1,
            "tp": "2",
            "world_size": 2.5,
            "prompt": "batch 1",
            "tolerance": [1e-4],
            "ranks": [1, "rank", {"rank": "0", "passed": "no", "first_divergent": "attn"}],
            "rank_logs": [None, {"rank": 0, "exit_code": "killed"}],
            "divisibility": [{"name": 3, "kept": "yes"}],
            "plan": ["tp", 2],
            "twin": "Qwen",
            "inject": ["kill_rank"],
            "sharding": {"blocks": {"attention": "split", "mlp": True}},
            "scaling_efficiency": float("nan"),
        },
    ],
)
def test_rubbish_reads_as_empty_without_raising(stored):
    result = DistributedResult.from_stored(stored)

    assert result.verdict is None and not result.ran
    assert result.tp is None and result.world_size is None and result.plan is None
    assert result.scaling_efficiency is None and result.measured_scaling(succeeded=True) is None
    assert not result.broken_on_purpose and result.twin is None
    if isinstance(stored, dict):
        [row] = result.ranks
        assert (row.rank, row.passed, row.divergence) == (None, None, None)
        assert result.rank_logs == [RankLog(rank=0, excerpt="", exit_code=None)]
        assert result.divisibility[0].name == "3" and result.divisibility[0].kept is None
        assert result.sharded_blocks == {"mlp": True}


def test_a_signal_python_does_not_name_reads_by_its_number():
    log = RankLog(rank=0, excerpt="", exit_code=-999)
    assert (log.signal, log.signal_name) == (999, "")
    assert RankLog(rank=0, excerpt="", exit_code=1).signal is None
