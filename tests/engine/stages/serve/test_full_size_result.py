"""The one reader of the serve stage's full-size run (`engine/stages/serve/full_size_result.py`)
and of the plan's predicted workload (`engine/stages/plan/result.py`): which prediction
stands beside each measured workload, what a fit rests on, and tolerant reading of stored
JSON. Results shaped as docs/stages/serve.md gives them (tests/serve_results.py)."""

from __future__ import annotations

import copy

from engine.stages.plan.result import PlanResult, Split, StoredFit
from engine.stages.serve.full_size_result import comparisons, full_size_run, launch_split
from tests.serve_results import (
    FIT,
    FULL_SIZE_TP2,
    PREDICTED_BEFORE,
    PREDICTED_PREFILL_HEAVY,
    full_size,
    served,
)


def plan_result(input_tokens: int, output_tokens: int) -> dict:
    """A plan result whose predicted workload is for `input_tokens` + `output_tokens`."""
    return {
        "predicted": {
            "available": True,
            "fit": {**FIT, "scope": "all", "accelerator": "*", "engine": "*"},
            "workload": {
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "engine": "vllm",
                "curve": [{"concurrency": 1, "output_tokens_per_s": 77.0}],
                "max_load": {"concurrency": 64.0, "output_tokens_per_s": 3100.0},
            },
        }
    }


def test_each_workload_gets_the_prediction_kept_for_its_label_and_lengths():
    run = full_size_run(served(full_size=full_size()))
    assert run is not None
    compared = {
        c.workload.label: c
        for c in comparisons(run, PlanResult.from_stored(plan_result(1, 1)).workload)
    }
    assert list(compared) == ["primary", "prefill-heavy", "decode-heavy"]
    primary = compared["primary"]
    assert primary.prediction.made == "before"
    assert primary.prediction.split == "TP2 PP1 EP1 DP1"
    assert [r.predicted.output_tokens_per_s for r in primary.rows] == [
        tokens for _, tokens, *_ in PREDICTED_BEFORE
    ]
    assert primary.rows[0].ratio == FULL_SIZE_TP2[0][1] / PREDICTED_BEFORE[0][1]
    # the best measured level (590.4 tokens/s at 4) beside the prediction there (560)
    assert primary.at_best.measured.concurrency == 4
    assert primary.at_best.predicted.output_tokens_per_s == PREDICTED_BEFORE[2][1]
    assert [p.output_tokens_per_s for p in compared["prefill-heavy"].prediction.points] == [
        tokens for _, tokens, *_ in PREDICTED_PREFILL_HEAVY
    ]
    # none kept for the decode-heavy pair, and the plan predicted other lengths
    assert compared["decode-heavy"].prediction is None


def test_the_plans_curve_stands_in_only_for_the_same_lengths():
    result = full_size(predicted_before={"available": False, "reason": "no fit"})
    run = full_size_run(served(full_size=result))
    assert run.predicted_before == {} and run.predicted_before_reason == "no fit"
    same = run.prediction_for(run.primary, PlanResult.from_stored(plan_result(1000, 1000)).workload)
    assert same.made == "plan" and same.fit.basis == "published"
    assert (
        run.prediction_for(run.primary, PlanResult.from_stored(plan_result(1000, 999)).workload)
        is None
    )


def test_a_kept_prediction_for_other_lengths_is_not_the_workloads():
    result = full_size()
    result["predicted_before"]["workloads"][0]["input_tokens"] = 2000
    run = full_size_run(served(full_size=result))
    assert run.prediction_for(run.primary, None) is None


def test_counts_stored_as_whole_floats_read_as_ints_and_odd_shapes_as_empty():
    result = copy.deepcopy(full_size(tp=2.0, workloads="garbage", tp_scaling=None))
    result["sweep"][0]["concurrency"] = 1.0
    run = full_size_run(served(full_size=result))
    assert run.tp == 2
    assert [level.concurrency for level in run.primary.levels] == [1, 2, 4]
    assert [w.label for w in run.workloads] == ["primary"] and run.tp_launches == []
    assert full_size_run(served(full_size={"status": "halfway"})) is None
    assert full_size_run(None) is None


def test_a_skipped_run_keeps_the_figures_that_decided_it():
    run = full_size_run(
        served(
            full_size={
                "status": "skipped",
                "reason": "over_weight_cap",
                "max_weight_bytes": 4 * 2**30,
                "model": {"weight_bytes": 16_060_522_496},
            }
        )
    )
    assert run.weight_cap_exceeded and run.workloads == []
    assert (run.weight_bytes, run.max_weight_bytes) == (16_060_522_496, 4 * 2**30)


def test_what_a_fit_rests_on():
    assert StoredFit.from_stored(FIT).basis == "published"
    assert StoredFit.from_stored({**FIT, "scope": "all"}).basis == "published"
    assert StoredFit.from_stored({**FIT, "scope": "pool"}).basis == "pool"
    assert StoredFit.from_stored({**FIT, "scope": "prior", "points": 0}).basis == "prior"
    assert StoredFit.from_stored(None) is None


def test_the_split_a_launch_ran_at_keeps_the_plans_ep_group():
    assert launch_split(2, Split(pp=1, dp=1, ep=1)) == "TP2 PP1 EP1 DP1"
    assert launch_split(4, Split(pp=1, dp=2, ep=8)) == "TP4 PP1 EP8 DP2"
    assert launch_split(1, Split()) == "TP1 PP1 EP1 DP1"
