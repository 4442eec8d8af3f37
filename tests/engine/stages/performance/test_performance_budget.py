"""The performance stage's time budget: a sweep planned to fit, stopped when the budget is
spent, keeping its points, succeeding, and raising no known limitation (no Django)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from engine import device_probe
from engine.contract import PoolSpec, ReleaseRef, StageContext
from engine.registry import findings_for_stage, get_stage
from engine.stages.performance import run as performance
from engine.stages.performance.budget import (
    SAFETY_MARGIN,
    TIME_BUDGET,
    SweepBudget,
    TimeBudgetReached,
    is_time_limit,
)
from engine.stages.performance.findings import findings
from engine.stages.performance.options import performance_options, performance_time_limits
from engine.stages.performance.run import PerformanceOptions, measure_performance, measure_point
from engine.twin.measure import MemoryProbe, StepTimer
from tests.engine.stages.realconfigs import load

pytestmark = pytest.mark.slow

CPU = PoolSpec(name="cpu", backend="cpu", queue="cpu")
DENSE = "meta-llama__Llama-3.1-8B"
FIGURES = {
    "kind": "measured",
    "device": "cpu",
    "threads": 1,
    "memory_bandwidth_bytes_per_s": 1.5e10,
    "flops": {"bfloat16": 1e12, "float16": 1.6e11},
}


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fake_point(batch_size: int, prompt_len: int) -> dict:
    tpot = 0.001 * (1 + batch_size / 8)
    return {
        "batch_size": batch_size,
        "prompt_len": prompt_len,
        "ttft_s": 0.01,
        "ttft_p95_s": 0.01,
        "tpot_s": tpot,
        "tpot_p95_s": tpot,
        "prefill_tokens_per_s": batch_size * prompt_len / 0.01,
        "decode_tokens_per_s": batch_size / tpot,
        "peak_memory_bytes": 1000,
        "peak_memory_increase_bytes": 0,
        "memory_before_bytes": 1000,
        "memory_kind": "process_rss",
        "prefill_samples": 1,
        "decode_samples": 1,
    }


def test_a_slow_host_stops_the_sweep_at_its_budget_and_the_stage_succeeds(monkeypatch):
    """An injected slow step (each point sleeps 0.25 s x batch) under a 10 s soft limit: the
    stage returns, says it stopped for its time budget and where, keeps the points measured,
    and raises no known limitation."""
    slept = []

    def slow_point(model, *, batch_size, prompt_len, **_kwargs):
        time.sleep(0.25 * batch_size)
        slept.append(batch_size)
        return fake_point(batch_size, prompt_len)

    monkeypatch.setattr(performance, "measure_point", slow_point)
    monkeypatch.setattr(device_probe, "probe_device", lambda *a, **k: dict(FIGURES))
    ctx = StageContext(
        release=ReleaseRef("mirror", "/nowhere", "meta-llama/Llama-3.1-8B", "main"),
        pool=CPU,
        previous={"fetch": {"config": load(DENSE)}},
        options={"max_batch_size": 64, "prompt_lens": [16], "dtypes": ["float32"]},
        soft_time_limit_s=10,
    )
    result = performance.run(ctx)
    json.dumps(result, allow_nan=False)
    # The points it chose to measure fit the budget less its safety margin (their injected
    # time, not the wall clock, which a busy host stretches), and it stopped well before 64
    # (16 s of sleep alone).
    assert sum(0.25 * batch for batch in slept) < 10 * (1 - SAFETY_MARGIN)
    assert 64 not in slept
    budget = result["time_budget"]
    assert budget["stopped"] == TIME_BUDGET and budget["budget_s"] == 10
    assert budget["source"] == "the stage's soft time limit"
    at = budget["stopped_at"]
    assert at["dtype"] == "float32" and at["prompt_len"] == 16 and 2 <= at["batch_size"] <= 32
    kept = [p["batch_size"] for p in result["points"] if p["kind"] == "measured"]
    assert kept == slept and kept == [b for b in (1, 2, 4, 8, 16, 32) if b < at["batch_size"]]
    (stop,) = result["stopped"]
    assert stop["cause"] == TIME_BUDGET and stop["batch_size"] == at["batch_size"]
    assert stop["reason"].startswith(f"stopped at batch {at['batch_size']}: time budget (")
    assert result["errors"] == [] and result["knee"] is not None
    assert findings(result, pool="cpu") == []
    assert findings_for_stage("performance", result, pool="cpu") == []


def test_the_sweep_is_planned_to_fit_each_curve_its_share():
    """Two curves under a fake clock: each point costs 1 s x batch; the sweep has 16 s, so the
    first curve gets 8 s and stops before batch 8 (predicted 8 s, 7 s spent would pass its 8 s
    share); what it leaves passes on to the second curve."""
    clock = FakeClock()
    budget = SweepBudget(25.0, clock.now, source="test", clock=clock)
    # 25 x 0.8 = 20 s, less the probe's reserve of 2.5 s: the sweep's deadline is 17.5 s in.
    assert budget.deadline - clock.now == pytest.approx(17.5)

    class Costly:
        def __call__(self, model, *, batch_size, prompt_len, **_kwargs):
            clock.now += 1.0 * batch_size
            return fake_point(batch_size, prompt_len)

    original = performance.measure_point
    performance.measure_point = Costly()
    try:
        sweep = performance.sweep_dtype(
            None,
            "float32",
            prompt_lens=[16, 32],
            vocab_size=10,
            pad_token_id=None,
            device=torch.device("cpu"),
            timer=None,
            memory=None,
            options=PerformanceOptions(max_batch_size=16, prompt_lens=(16, 32)),
            budget=budget,
        )
    finally:
        performance.measure_point = original
    by_curve = {
        n: [p["batch_size"] for p in sweep.points if p["prompt_len"] == n] for n in (16, 32)
    }
    # first curve: share 17.5 / 2 = 8.75 s; 1 + 2 + 4 = 7 s, batch 8 predicted 8 s: stop.
    assert by_curve[16] == [1, 2, 4]
    # second curve: all 10.5 s left; 1 + 2 + 4 = 7 s, then batch 8 predicted 8 s: stop.
    assert by_curve[32] == [1, 2, 4]
    assert [(s["prompt_len"], s["batch_size"], s["cause"]) for s in sweep.stopped] == [
        (16, 8, TIME_BUDGET),
        (32, 8, TIME_BUDGET),
    ]
    assert "do not fit" in sweep.stopped[0]["reason"]
    assert budget.summary()["stopped_at"] == {"dtype": "float32", "prompt_len": 16, "batch_size": 8}


def test_the_cost_of_a_point_is_predicted_from_the_first_ones():
    clock = FakeClock()
    budget = SweepBudget(100.0, clock.now, clock=clock)
    assert budget.predict_s("bfloat16", 32, 1) is None  # nothing measured yet
    budget.record("bfloat16", 32, 1, 0.5)
    assert budget.predict_s("bfloat16", 32, 2) == pytest.approx(1.0)  # linear after one point
    budget.record("bfloat16", 32, 2, 0.6)  # grew 1.2x per doubling
    assert budget.predict_s("bfloat16", 32, 8) == pytest.approx(0.6 * 1.2**2)
    # a new curve: the first point of the earlier one, scaled by the prompt length
    assert budget.predict_s("bfloat16", 128, 1) == pytest.approx(0.5 * 4)
    assert budget.predict_s("float16", 32, 1) == pytest.approx(0.5)
    # growth is bounded: a point faster than the one before still predicts no less
    budget.record("float16", 32, 1, 1.0)
    budget.record("float16", 32, 2, 0.5)
    assert budget.predict_s("float16", 32, 4) == pytest.approx(0.5)


def test_a_point_still_running_at_the_deadline_is_dropped(seeded_twin):
    twin = seeded_twin(DENSE)
    device = torch.device("cpu")
    clock = FakeClock()
    ticks = iter(range(100))

    def moving_clock():
        return clock.now + next(ticks)

    with pytest.raises(TimeBudgetReached):
        measure_point(
            twin.model,
            batch_size=1,
            prompt_len=8,
            vocab_size=int(twin.config.vocab_size),
            pad_token_id=None,
            device=device,
            timer=StepTimer(device),
            memory=MemoryProbe(device),
            options=PerformanceOptions(repeats=3, warmup=0),
            deadline=clock.now + 2,
            clock=moving_clock,
        )


def test_a_soft_time_limit_inside_the_twin_is_a_time_budget_stop(seeded_twin):
    """Celery's SoftTimeLimitExceeded raised mid-point (known by name: the engine imports no
    Celery) stops the sweep, keeps the points and succeeds: not "the twin fails mid-sweep"."""

    class SoftTimeLimitExceeded(Exception):
        pass

    assert is_time_limit(SoftTimeLimitExceeded()) and not is_time_limit(RuntimeError())

    def limit_at_batch_4(model):
        def hook(_module, args, kwargs):
            if kwargs["input_ids"].shape[0] == 4:
                raise SoftTimeLimitExceeded("SoftTimeLimitExceeded()")

        return model.register_forward_pre_hook(hook, with_kwargs=True)

    result = measure_performance(
        seeded_twin(DENSE),
        CPU,
        options={
            "max_batch_size": 8,
            "prompt_lens": [16, 48],
            "dtypes": ["float32", "bfloat16"],
            "repeats": 1,
            "prefill_repeats": 1,
        },
        hooks=[limit_at_batch_4],
        device_figures=FIGURES,
    )
    assert [(p["dtype"], p["batch_size"]) for p in result["points"]] == [
        ("float32", 1),
        ("float32", 2),
    ]
    assert result["errors"] == []
    assert result["time_budget"]["stopped"] == TIME_BUDGET
    assert result["time_budget"]["not_measured_dtypes"] == ["bfloat16"]
    assert "soft time limit" in result["stopped"][0]["reason"]
    assert result["calibration"]["available"] is False
    assert findings(result, pool="cpu") == []


def test_old_results_ended_by_the_soft_limit_raise_no_model_limitation():
    old = {
        "points": [{"kind": "measured", "dtype": "float16", "batch_size": 16}],
        "stopped": [
            {"dtype": "float32", "prompt_len": 32, "batch_size": 64, "reason": "stopped at 64"}
        ],
        "errors": [
            {
                "dtype": "float16",
                "prompt_len": 128,
                "batch_size": 32,
                "error": "SoftTimeLimitExceeded: SoftTimeLimitExceeded()",
            }
        ],
    }
    found = findings(old, pool="cpu")
    # the out-of-memory stop (no cause: an older result) is still judged; the time limit not
    assert [f.key for f in found] == ["performance:oom:float32"]


def test_the_budget_is_an_option_and_the_limits_follow_it():
    assert performance_options({"time_budget_s": 900}) == {"time_budget_s": 900.0}
    with pytest.raises(ValueError, match="time_budget_s must be a number"):
        performance_options({"time_budget_s": 0})
    assert performance_time_limits({}) == (180, 240)
    assert performance_time_limits({"time_budget_s": 899.5}) == (900, 960)
    stage = get_stage("performance")
    assert stage.time_limits_s() == (180, 240)
    assert stage.time_limits_s({"time_budget_s": 3600}) == (3600, 3660)
    assert stage.time_limits_s({"time_budget_s": "soon"}) == (180, 240)
    assert PerformanceOptions.from_mapping({"time_budget_s": 60}).time_budget_s == 60.0
