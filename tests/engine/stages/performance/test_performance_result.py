"""The performance stage's typed result (`engine/stages/performance/result.py`): a stored row
reads back with its knees, points, stops and errors, rows of older versions and rubbish read as
empty without raising, and what a stop or an error says of the release is judged once, for the
findings, the charts and the regression figures alike."""

from __future__ import annotations

from typing import Any

import pytest

from engine.stages.performance.budget import TIME_BUDGET
from engine.stages.performance.findings import findings
from engine.stages.performance.result import (
    OUT_OF_MEMORY,
    Knee,
    PerformanceResult,
    SweepError,
    SweepOptions,
    SweepPoint,
    SweepStop,
)
from engine.stages.performance.rows import calibration_rows, performance_rows
from tests.limitation_words import worded


def measured(batch: int, tokens_per_s: float, *, dtype: str = "bfloat16") -> dict[str, Any]:
    return {
        "kind": "measured",
        "model": "twin",
        "dtype": dtype,
        "batch_size": batch,
        "prompt_len": 32,
        "ttft_s": 0.004 * batch,
        "ttft_p95_s": 0.005 * batch,
        "tpot_s": batch / tokens_per_s,
        "tpot_p95_s": 1.1 * batch / tokens_per_s,
        "prefill_tokens_per_s": 8000.0,
        "decode_tokens_per_s": tokens_per_s,
        "peak_memory_bytes": 50_000_000 + batch * 1_000_000,
        "peak_memory_increase_bytes": batch * 1_000_000,
        "memory_before_bytes": 50_000_000,
        "memory_kind": "process_rss",
        "prefill_samples": 3,
        "decode_samples": 3,
    }


def full_size_decode(batch: int, tpot_s: float) -> dict[str, Any]:
    return {
        "kind": "predicted",
        "model": "full-size",
        "dtype": "fp8",
        "batch_size": batch,
        "prompt_len": None,
        "context_tokens": 32_768,
        "tpot_s": tpot_s,
        "decode_tokens_per_s": batch / tpot_s,
        "calibrated_tpot_s": tpot_s * 2,
        "calibrated_decode_tokens_per_s": batch / tpot_s / 2,
        "memory_kind": None,
    }


KNEE = {
    "dtype": "bfloat16",
    "prompt_len": 32,
    "batch_size": 4,
    "tpot_s": 4 / 330.0,
    "tpot_p95_s": 1.1 * 4 / 330.0,
    "decode_tokens_per_s": 330.0,
    "found": True,
    "growth_at_knee": 0.06,
    "reason": "decode tokens/s grew +6.1% from batch 4 to 8",
}


def stored(**changes: Any) -> dict[str, Any]:
    """A stored run: bfloat16 at prompt 32, batches 1-8, out of memory at 16, two full-size
    decode predictions, a calibration of two points."""
    return {
        "points": [
            *(measured(b, t) for b, t in ((1, 100.0), (2, 190.0), (4, 330.0), (8, 350.0))),
            full_size_decode(1, 0.01),
            full_size_decode(8, 0.02),
        ],
        "knee_batch_size": 4,
        "knee_tpot_s": KNEE["tpot_s"],
        "knee": KNEE,
        "knees": [KNEE],
        "knee_by_dtype": {"bfloat16": KNEE},
        "knee_rule": "knee: the smallest measured batch size b ...",
        "stopped": [
            {
                "dtype": "bfloat16",
                "prompt_len": 32,
                "batch_size": 16,
                "cause": OUT_OF_MEMORY,
                "reason": "stopped at batch 16: out of memory (CUDA out of memory)",
            }
        ],
        "errors": [],
        "skipped_dtypes": {"float16": "no float16 on this device"},
        "skipped_prompt_lens": [{"prompt_len": 4096, "reason": "too long for the twin"}],
        "predicted": {
            "available": True,
            "accelerator": "h200",
            "split": {"tp": 8, "pp": 1, "ep": 1, "dp": 1, "devices": 8},
            "dtype": "fp8",
            "dtype_label": "fp8 (e4m3)",
            "context_tokens": 32_768,
            "fit": {"accelerator": "h200", "engine": "vllm", "points": 12, "residual": 0.1},
            "calibrated": {"available": True, "decode_factor": 0.5, "runs": 3, "caveat": "twin"},
        },
        "calibration": {
            "device": {"kind": "measured", "memory_bandwidth_bytes_per_s": 1.5e10},
            "available": True,
            "points": [
                {
                    "kind": "predicted",
                    "model": "twin",
                    "dtype": "bfloat16",
                    "batch_size": 1,
                    "prompt_len": 32,
                    "tpot_s": 0.005,
                    "decode_tokens_per_s": 200.0,
                    "decode_efficiency": 0.5,
                    "prefill_efficiency": None,
                }
            ],
            "decode_efficiency_median": 0.5,
            "by_dtype": {"bfloat16": {"decode_efficiency_median": 0.5, "points": 1}},
            "twin_shape": {"total_params": 2_318_848},
        },
        "device": "cpu",
        "options": {"max_batch_size": 16, "prompt_lens": [32, 4096], "repeats": 3},
        "twin": {"parameters": 2_318_848},
        "notes": ["measured on the twin"],
        "duration_s": 12.5,
    } | changes


def test_a_stored_run_reads_back_with_its_knees_points_and_stops():
    run = PerformanceResult.from_stored(stored())

    assert run.knee == Knee(**KNEE) and run.knee_by_dtype == {"bfloat16": run.knee}
    assert [p.batch_size for p in run.measured_points] == [1, 2, 4, 8]
    assert run.knee_point() == SweepPoint.from_stored(measured(4, 330.0))
    assert run.measured_model == "twin"
    assert run.stopped == (
        SweepStop("bfloat16", 32, 16, "stopped at batch 16: out of memory (CUDA out of memory)",
                  OUT_OF_MEMORY),
    )  # fmt: skip
    assert run.skipped_prompt_lens == ((4096, "too long for the twin"),)
    assert run.options == SweepOptions(max_batch_size=16, prompt_lens=(32, 4096), repeats=3)
    assert run.predicted.dtype_labels == {"fp8": "fp8 (e4m3)"} and run.predicted.fit.points == 12
    assert run.predicted.calibrated.factors == [("decode", 0.5)]
    assert run.calibration.twin_params == 2_318_848 and run.calibration.by_dtype[0].points == 1


def test_the_rows_stored_are_the_rows_of_the_points_and_the_calibration():
    result = stored()
    expected = performance_rows(result["points"]) + calibration_rows(result["calibration"])

    assert PerformanceResult.from_stored(result).stored_rows() == expected
    assert {"metric": "decode_efficiency", "value": 0.5, "unit": "ratio"}.items() <= (
        expected[-1].items()
    )


def test_rows_of_older_versions_and_rubbish_read_as_empty():
    for nothing in (None, "crashed", [], {}):
        empty = PerformanceResult.from_stored(nothing)
        assert empty == PerformanceResult() and empty.stored_rows() == []
        assert empty.knee_point() is None and empty.measured_model == "twin"

    odd = PerformanceResult.from_stored(
        {
            "points": [3, {"kind": "measured", "batch_size": "two", "decode_tokens_per_s": 1e999}],
            "knee": ["bfloat16"],
            "knee_by_dtype": {"bfloat16": "4"},
            "stopped": "none",
            "errors": [None],
            "options": {"prompt_lens": [32, "long"], "max_batch_size": 8.0},
            "calibration": {"available": "yes", "by_dtype": {"x": 1}},
        }
    )
    assert odd.points == (SweepPoint(kind="measured"),)
    assert odd.knee is None and odd.knee_by_dtype == {}
    # "errors" is a list, of nothing usable: the sweep was recorded, and raised nothing.
    assert odd.stopped == () and odd.errors == () and odd.sweep_recorded
    assert findings({"errors": [None]}, pool="cpu") == []
    assert odd.options == SweepOptions(max_batch_size=8, prompt_lens=(32,))
    assert odd.calibration.available is False and odd.calibration.by_dtype == ()


@pytest.mark.parametrize(
    ("stop", "cause"),
    [
        (
            {"cause": TIME_BUDGET, "reason": "stopped at batch 8: time budget (12 s left)"},
            TIME_BUDGET,
        ),
        ({"cause": OUT_OF_MEMORY, "reason": "stopped at batch 8: out of memory"}, OUT_OF_MEMORY),
        # rows from before stops named their cause
        ({"reason": "stopped at batch 8: time budget (soft time limit)"}, TIME_BUDGET),
        ({"reason": "stopped at batch 8: out of memory (MemoryError)"}, OUT_OF_MEMORY),
    ],
)
def test_a_stop_says_whether_memory_or_time_ran_out(stop, cause):
    read = SweepStop.from_stored(stop)
    assert read.cause == cause and read.by_time_budget is (cause == TIME_BUDGET)


def test_only_the_release_s_own_stops_and_errors_are_findings():
    budget_stop = {
        "dtype": "float32",
        "prompt_len": 32,
        "batch_size": 4,
        "reason": "stopped at batch 4: time budget (soft time limit)",
    }
    errors = [
        {"dtype": "float32", "prompt_len": 32, "batch_size": 2, "error": "SoftTimeLimitExceeded()"},
        {"dtype": "bfloat16", "prompt_len": 32, "batch_size": 2, "error": "RuntimeError: boom"},
    ]
    result = stored(stopped=[*stored()["stopped"], budget_stop], errors=errors)
    run = PerformanceResult.from_stored(result)

    assert list(run.out_of_memory_by_dtype()) == ["bfloat16"]
    assert run.twin_errors_by_dtype() == {"bfloat16": [SweepError.from_stored(errors[1])]}
    notes = {f.key: f for f in worded(findings(result, pool="cpu"))}
    assert list(notes) == ["performance:oom:bfloat16", "performance:error:bfloat16"]
    assert notes["performance:oom:bfloat16"].severity == "minor"
    assert "Largest batch measured in `bfloat16`: 8." in notes["performance:oom:bfloat16"].body
    assert "(batch 16):" in notes["performance:oom:bfloat16"].body
    assert findings({"points": []}, pool="cpu") is None


def test_the_plans_prediction_at_a_batch_is_the_largest_predicted_at_or_below_it():
    run = PerformanceResult.from_stored(stored())

    assert run.predicted_decode_at(4).batch_size == 1
    assert run.predicted_decode_at(8).calibrated_tpot_s == pytest.approx(0.04)
    assert run.predicted_decode_at(0) is None
