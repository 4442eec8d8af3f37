"""The stability stage's typed result (`engine/stages/stability/result.py`): a stored row reads
back as written, rows of older versions and rubbish read as empty without raising, and the leak,
NaN/Inf, exception and drift rules are judged once, for the findings and the notes alike."""

from __future__ import annotations

from typing import Any

import pytest

from engine.notes import StageState
from engine.stages.stability.findings import findings
from engine.stages.stability.notes import section
from engine.stages.stability.result import (
    LEAK,
    StabilityResult,
    StabilitySample,
    StabilityThresholds,
    StabilityWorkload,
)
from tests.limitation_words import worded

THRESHOLDS = StabilityThresholds(
    leak_bytes_per_step=1024.0,
    leak_min_growth_bytes=4 * 2**20,
    leak_effective_bytes_per_step=47_127.0,
    max_step_time_drift=0.5,
    max_errors=3,
    max_nonfinite_outputs=0,
)
LEAK_REASON = (
    f"{LEAK}: memory grew 90,000 bytes/step over steps 11-100 (8,010,000 bytes fitted); a leak "
    "needs a slope over 1,024 bytes/step AND fitted growth over 4,194,304 bytes"
)


def leaking_run(**changes: Any) -> StabilityResult:
    """A failed run of 100 steps whose memory grew 90,000 bytes a step after the warm-up."""
    fields: dict[str, Any] = {
        "duration_s": 20.5,
        "duration_asked_s": 20.0,
        "steps_past_duration": 0,
        "steps": 100,
        "memory_slope_bytes_per_step": 90_000.0,
        "memory_growth_bytes": 8_010_000.0,
        "leak_effective_bytes_per_step": 47_127.0,
        "nonfinite_outputs": 0,
        "errors": 0,
        "step_time_drift": 0.04,
        "step_time_drift_basis": "process CPU time per step (time.process_time_ns)",
        "wall_time_drift": 0.1,
        "passed": False,
        "reason": LEAK_REASON,
        "reasons": (LEAK_REASON,),
        "memory_start_bytes": 400_000_000,
        "memory_end_bytes": 409_000_000,
        "memory_max_bytes": 409_000_000,
        "step_time_median_s": 0.2,
        "step_time_p95_s": 0.25,
        "step_time_first_quarter_s": 0.19,
        "step_time_last_quarter_s": 0.2,
        "cpu_time_median_s": 0.19,
        "warmup_steps": 10,
        "thresholds": THRESHOLDS,
        "samples": (
            StabilitySample(step=1, elapsed_s=0.2, memory_bytes=400_000_000, step_time_s=0.2),
            StabilitySample(step=100, elapsed_s=20.4, memory_bytes=409_000_000, step_time_s=0.2),
        ),
        "workload": StabilityWorkload(
            dtype="bfloat16",
            device="cpu",
            batch_size=4,
            prompt_len=64,
            decode_steps=16,
            tokens_per_step=320,
            weight_bytes=4_000_000,
        ),
        "skipped_dtypes": {"float16": "the device has no float16 matmul"},
        "memory_kind": "process_rss",
        "memory_method": "VmRSS after malloc_trim",
        "timer": "perf_counter_ns",
        "threads": 1,
        "options": {"duration_s": 20.0},
        "twin": {"parameters": 1_000_000},
        "notes": ("run on the scaled twin (seeded weights)",),
    }
    return StabilityResult(**(fields | changes))


def test_a_stored_run_reads_back_as_it_was_written():
    stored = leaking_run().to_dict()

    assert StabilityResult.from_stored(stored) == leaking_run()
    assert StabilityResult.from_stored(stored).to_dict() == stored
    assert stored["samples"][1] == {
        "step": 100,
        "elapsed_s": 20.4,
        "memory_bytes": 409_000_000,
        "step_time_s": 0.2,
        "cpu_time_s": None,
    }
    assert stored["thresholds"]["leak_min_growth_bytes"] == 4 * 2**20


def test_rows_of_older_versions_and_rubbish_read_as_empty():
    for nothing in (None, "crashed", [], {}):
        empty = StabilityResult.from_stored(nothing)
        assert empty == StabilityResult()
        assert not empty.has_verdict and empty.verdict is None and empty.leaked() is None

    odd = StabilityResult.from_stored(
        {
            "passed": "yes",
            "steps": 40.0,
            "errors": "none",
            "memory_slope_bytes_per_step": float("nan"),
            "reasons": ["memory leak: ...", 3],
            "thresholds": [1024],
            "samples": [7, {"step": 2.0, "memory_bytes": "1 MiB", "elapsed_s": True}],
            "workload": "cpu",
            "skipped_dtypes": {"int8": ["why"]},
        }
    )
    assert odd.passed is None and odd.steps == 40 and odd.errors is None
    assert odd.memory_slope_bytes_per_step is None
    assert odd.reasons == ("memory leak: ...",)
    assert odd.thresholds is None
    assert odd.samples == (StabilitySample(), StabilitySample(step=2))
    assert odd.workload == StabilityWorkload() and odd.skipped_dtypes == {}


@pytest.mark.parametrize(
    ("slope", "growth", "leaks"),
    [
        (2048.0, 5 * 2**20, True),  # both over
        (2048.0, 2**20, False),  # a steep slope on a short run: allocator noise
        (512.0, 9 * 2**20, False),  # grew, but slower than the slope threshold
        (512.0, None, False),  # within the slope threshold whatever the growth
        (2048.0, None, None),  # over the slope, growth unknown: not judged
        (None, 9 * 2**20, None),  # no slope fitted (too few samples): not judged
    ],
)
def test_a_leak_needs_both_the_slope_and_the_growth(slope, growth, leaks):
    limits = StabilityThresholds(leak_bytes_per_step=1024.0, leak_min_growth_bytes=4 * 2**20)

    assert limits.leaks(slope, growth) is leaks
    assert StabilityThresholds().leaks(2048.0, 5 * 2**20) is None


def test_the_threshold_shown_is_the_one_the_verdict_applied():
    run = leaking_run()
    assert run.leak_judged and run.leaked() is True
    assert run.leak_above == 47_127.0 and run.floor_raised
    # A long run: the slope threshold binds, the growth floor over its steps is lower.
    long = leaking_run(thresholds=StabilityThresholds(leak_bytes_per_step=1024.0))
    assert long.leak_above == 1024.0 and not long.floor_raised
    assert leaking_run(thresholds=None).leak_above is None


def test_the_findings_and_the_notes_read_the_same_verdict():
    state = StageState("stability", "failed", leaking_run().to_dict(), "memory leak")
    notes = section(state, notes=None)  # the section reads no other stage
    found = {f.key: f for f in worded(findings(leaking_run().to_dict(), pool="cpu"))}

    assert notes["verdict"] == "failed" and notes["dtype"] == "bfloat16"
    assert list(found) == ["stability:memory-leak"]
    assert (
        "over the limits of 1,024 bytes/step and 4,194,304 bytes"
        in found["stability:memory-leak"].body
    )
    assert f"The stage says: {LEAK}: memory grew 90,000" in found["stability:memory-leak"].body
    # Every threshold crossed at once: one note each, the drift minor.
    crossed = leaking_run(nonfinite_outputs=2, errors=1, step_time_drift=0.8).to_dict()
    crossed["error_messages"] = ["step 3: RuntimeError: boom"]
    severities = {f.key: f.severity for f in findings(crossed, pool="cpu")}
    assert severities == {
        "stability:memory-leak": "major",
        "stability:nonfinite": "major",
        "stability:exceptions": "major",
        "stability:step-time-drift": "minor",
    }
    # A row without the thresholds it was judged by judges nothing: its notes stay as they are.
    assert findings(leaking_run(thresholds=None).to_dict(), pool="cpu") is None
    clean = leaking_run(passed=True, memory_slope_bytes_per_step=3.0, reasons=())
    assert findings(clean.to_dict(), pool="cpu") == []


@pytest.mark.slow  # imports the stage's run, which imports torch
def test_the_run_stores_what_the_typed_result_reads_back():
    from engine.stages.stability.run import Series, StabilityOptions, judge

    steps = 5000
    leaking = Series(
        steps=list(range(1, steps + 1)),
        elapsed_s=[0.01 * i for i in range(1, steps + 1)],
        step_times_s=[0.01] * steps,
        cpu_times_s=[0.01] * steps,
        memory_bytes=[400 * 2**20 + 2048 * i for i in range(steps)],
        nonfinite_outputs=0,
        errors=0,
        error_messages=[],
        duration_s=50.0,
        stopped_early=None,
    )
    stored = judge(leaking, StabilityOptions(), weight_bytes=4_000_000, on_cpu=True)
    result = StabilityResult.from_stored(stored)

    assert result.to_dict() == stored
    assert stored["passed"] is False and result.leaked() is True
    assert result.said(LEAK) == stored["reason"]
    assert len(result.samples) == 201 and result.samples[-1].step == steps
