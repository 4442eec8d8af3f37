"""The serve stage's load sweep stored as `PerformancePoint` rows marked with their engine, and
the readers of the performance stage's curves (the release page, the compare page's choices,
the pool's calibration) unchanged by them."""

from __future__ import annotations

import copy

import pytest

from adaptation.models import PerformancePoint, StageStatus
from adaptation.selectors.calibration import pool_calibration
from adaptation.selectors.performance import (
    job_performance_run,
    jobs_with_performance,
    point_rows,
    point_rows_by_run,
)
from engine.contract import StageDefinition, StageFailed
from tests.factories import cpu_pool, make_job
from workers import runner

pytestmark = pytest.mark.django_db

# The result of docs/stages/serve.md, with a second sweep level.
SERVED = {
    "status": "served",
    "mode": "launched",
    "engine": {
        "name": "vllm",
        "version": "0.32.0",
        "command": "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2",
        "launched_command": "python -m vllm.entrypoints.openai.api_server --model /ckpt",
        "command_diff": [],
    },
    "checkpoint": {
        "kind": "twin",
        "parameters": 70000000,
        "bytes": 140000000,
        "dtype": "bfloat16",
        "tokenizer": "fast",
    },
    "load_s": 84.2,
    "peak_memory_bytes": 2900000000,
    "startup_log": ["INFO ... Starting vLLM API server ..."],
    "precision": {
        "dtype": "bfloat16",
        "prompts": 10,
        "tokens_compared": 160,
        "token_agreement": 1.0,
        "first_divergence": None,
        "max_abs_logprob_diff": 0.012,
        "kl_top_k": 0.0004,
        "limits": {"max_abs_logprob_diff": 0.25, "kl_top_k": 0.02, "source": "..."},
        "passed": True,
    },
    "sweep": [
        {
            "concurrency": 1,
            "requests": 4,
            "completed": 4,
            "errors": 0,
            "ttft_s_p50": 0.05,
            "ttft_s_p95": 0.07,
            "ttft_s_p99": 0.07,
            "tpot_s_p50": 0.011,
            "tpot_s_p95": 0.012,
            "tpot_s_p99": 0.013,
            "itl_s_p50": 0.011,
            "e2e_s_p50": 0.4,
            "e2e_s_p95": 0.45,
            "e2e_s_p99": 0.46,
            "output_tokens_per_s": 80.1,
            "requests_per_s": 2.5,
            "duration_s": 1.6,
        },
        {
            "concurrency": 4,
            "requests": 16,
            "completed": 16,
            "errors": 0,
            "ttft_s_p50": 0.09,
            "ttft_s_p95": 0.12,
            "ttft_s_p99": 0.13,
            "tpot_s_p50": 0.018,
            "tpot_s_p95": 0.021,
            "tpot_s_p99": 0.022,
            "itl_s_p50": 0.018,
            "e2e_s_p50": 0.7,
            "e2e_s_p95": 0.8,
            "e2e_s_p99": 0.85,
            "output_tokens_per_s": 210.0,
            "requests_per_s": 6.0,
            "duration_s": 2.7,
        },
    ],
    "sweep_settings": {
        "input_tokens": 128,
        "output_tokens": 32,
        "max_concurrency": 8,
        "load_generator": "vllm.benchmarks.serve (vLLM 0.32.0)",
    },
    "knee": {"concurrency": 4, "output_tokens_per_s": 210.0, "tpot_s_p50": 0.018, "reason": ""},
    "metrics": {"interval_s": 0.5, "series": []},
    "tp": {
        "planned": 2,
        "launched": 2,
        "compared_with": 1,
        "greedy_match": True,
        "tokens_compared": 160,
        "first_divergence": None,
        "reason": "",
    },
    "passed": True,
    "failure": None,
}
ROW_FIELDS = (
    "kind",
    "model",
    "dtype",
    "batch_size",
    "prompt_len",
    "concurrency",
    "engine",
    "engine_version",
    "metric",
    "value",
    "unit",
)


def serve_job(monkeypatch, body, *, stages=("serve",), statuses=None, results=None):
    """A job whose serve stage (run by `body`, through the runner) has run; returns it."""
    definition = StageDefinition(name="serve", title="Serving engine", run=body)
    monkeypatch.setattr(runner, "get_stage", lambda name: definition)
    job = make_job(
        stages=stages,
        statuses={"serve": StageStatus.QUEUED, **(statuses or {})},
        results=results,
    )
    runner.execute_stage_run(job.stage_runs.get(stage="serve").pk, final_try=True)
    return job


def rows_of(run) -> list[tuple]:
    return list(
        PerformancePoint.objects.filter(stage_run=run)
        .order_by("concurrency", "id")
        .values_list(*ROW_FIELDS)
    )


def level_rows(concurrency: int, figures: dict, *, model="twin") -> list[tuple]:
    key = ("measured", model, "bfloat16", None, 128, concurrency, "vllm", "0.32.0")
    units = {
        "output_tokens_per_s": "tokens/s",
        "requests_per_s": "requests/s",
        "errors": "requests",
    }
    return [(*key, metric, value, units.get(metric, "s")) for metric, value in figures.items()]


def test_each_sweep_level_is_stored_as_measured_rows_of_the_engine(monkeypatch):
    job = serve_job(monkeypatch, lambda ctx: copy.deepcopy(SERVED))
    run = job.stage_runs.get(stage="serve")
    assert run.status == StageStatus.SUCCEEDED, run.error
    assert rows_of(run) == level_rows(
        1,
        {
            "ttft_s_p50": 0.05,
            "ttft_s_p95": 0.07,
            "tpot_s_p50": 0.011,
            "tpot_s_p95": 0.012,
            "e2e_s_p99": 0.46,
            "output_tokens_per_s": 80.1,
            "requests_per_s": 2.5,
            "errors": 0,
        },
    ) + level_rows(
        4,
        {
            "ttft_s_p50": 0.09,
            "ttft_s_p95": 0.12,
            "tpot_s_p50": 0.018,
            "tpot_s_p95": 0.021,
            "e2e_s_p99": 0.85,
            "output_tokens_per_s": 210.0,
            "requests_per_s": 6.0,
            "errors": 0,
        },
    )
    assert {row.pool_id for row in PerformancePoint.objects.filter(stage_run=run)} == {job.pool_id}


def test_real_weights_are_the_release_and_a_failed_run_keeps_its_levels(monkeypatch):
    result = copy.deepcopy(SERVED)
    result["checkpoint"]["kind"] = "real"
    del result["precision"]  # failed before comparing: the checkpoint's dtype is served
    result["sweep"] = [result["sweep"][0] | {"tpot_s_p95": None, "completed": 3, "errors": 1}]
    result |= {"status": "failed", "passed": False}

    def body(ctx):
        raise StageFailed("sweep: the engine stopped answering", result=result)

    run = serve_job(monkeypatch, body).stage_runs.get(stage="serve")
    assert run.status == StageStatus.FAILED
    assert rows_of(run) == level_rows(
        1,
        {
            "ttft_s_p50": 0.05,
            "ttft_s_p95": 0.07,
            "tpot_s_p50": 0.011,
            "e2e_s_p99": 0.46,
            "output_tokens_per_s": 80.1,
            "requests_per_s": 2.5,
            "errors": 1,
        },
        model="release",
    )


def test_a_pool_without_an_engine_stores_no_rows(monkeypatch):
    job = serve_job(monkeypatch, lambda ctx: {"status": "not_configured"})
    assert job.stage_runs.get(stage="serve").status == StageStatus.SUCCEEDED
    assert not PerformancePoint.objects.exists()


def test_the_performance_readers_keep_to_the_performance_stage(monkeypatch):
    performance_result = {"status": "ok"}
    job = serve_job(
        monkeypatch,
        lambda ctx: copy.deepcopy(SERVED),
        stages=("performance", "serve"),
        statuses={"performance": StageStatus.SUCCEEDED},
        results={"performance": performance_result},
    )
    performance = job.stage_runs.get(stage="performance")
    PerformancePoint.objects.create(
        stage_run=performance,
        job=job,
        pool=job.pool,
        kind="measured",
        model="twin",
        dtype="bfloat16",
        batch_size=1,
        prompt_len=16,
        metric="decode_efficiency",
        value=0.5,
        unit="ratio",
    )
    only_served = serve_job(monkeypatch, lambda ctx: copy.deepcopy(SERVED))
    assert PerformancePoint.objects.exclude(engine="").count() == 32  # two jobs' sweeps

    assert job_performance_run(job) == performance
    assert point_rows(performance) == [
        {
            "kind": "measured",
            "model": "twin",
            "dtype": "bfloat16",
            "batch_size": 1,
            "prompt_len": 16,
            "metric": "decode_efficiency",
            "value": 0.5,
            "unit": "ratio",
        },
    ]
    assert point_rows_by_run([performance]) == {performance.pk: point_rows(performance)}
    assert job_performance_run(only_served) is None
    assert jobs_with_performance() == [job]
    calibration = pool_calibration(pool=cpu_pool())
    assert (calibration["available"], calibration["runs"]) == (True, 1)
    assert calibration["per_run"][0]["stage_run"] == performance.pk
    assert calibration["decode_factor"] == 0.5


def _full_size_point(concurrency: int, rate: float) -> dict:
    """A full-size sweep level (docs/stages/serve.md, "Full size"), today's sweep keys."""
    return copy.deepcopy(SERVED["sweep"][0]) | {
        "concurrency": concurrency,
        "output_tokens_per_s": rate,
    }


FULL_SIZE = {
    "status": "measured",
    "reason": None,
    "load_format": "dummy",
    "tp": 2,
    "dtype": "bfloat16",
    "sweep_settings": {"input_tokens": 128, "output_tokens": 64, "concurrency": [1]},
    "sweep": [
        _full_size_point(1, 15.6)
        | {"kv_cache_usage_peak": 0.0055, "running_peak": 1, "waiting_peak": 0}
    ],
    "stopped": None,
    "workloads": [
        {
            "label": "prefill-heavy",
            "input_tokens": 256,
            "output_tokens": 16,
            "sweep": [_full_size_point(1, 12.4)],
            "stopped": None,
        },
        {
            "label": "decode-heavy",
            "input_tokens": 16,
            "output_tokens": 256,
            "sweep": [],
            "stopped": "time budget",
        },
    ],
    "tp_scaling": [{"tp": 1, "sweep": [_full_size_point(1, 9.1)], "stopped": None}],
}
FULL_SIZE_FIELDS = ("model", "load_format", "prompt_len", "output_len", "tp_size", "value")


def test_the_full_size_run_is_stored_as_measured_engine_rows_with_dummy_weights(monkeypatch):
    result = copy.deepcopy(SERVED) | {"full_size": copy.deepcopy(FULL_SIZE)}
    run = serve_job(monkeypatch, lambda ctx: result).stage_runs.get(stage="serve")
    assert run.status == StageStatus.SUCCEEDED, run.error
    rows = PerformancePoint.objects.filter(stage_run=run)
    full = rows.filter(model="full-size")
    # measured · engine · full size · dummy weights, one set per workload and TP degree
    assert set(full.values_list("kind", "engine", "engine_version", "dtype")) == {
        ("measured", "vllm", "0.32.0", "bfloat16")
    }
    rates = full.filter(metric="output_tokens_per_s").order_by("id")
    assert list(rates.values_list(*FULL_SIZE_FIELDS)) == [
        ("full-size", "dummy", 128, 64, 2, 15.6),
        ("full-size", "dummy", 256, 16, 2, 12.4),
        ("full-size", "dummy", 128, 64, 1, 9.1),
    ]
    # three levels, eight metrics each, and the engine's peaks where the scrapes saw the level
    assert full.count() == 3 * 8 + 3
    peaks = full.filter(metric__endswith="_peak").order_by("metric")
    assert list(peaks.values_list("metric", "value", "unit", "prompt_len", "tp_size")) == [
        ("kv_cache_usage_peak", 0.0055, "ratio", 128, 2),
        ("running_peak", 1.0, "requests", 128, 2),
        ("waiting_peak", 0.0, "requests", 128, 2),
    ]
    # The twin's rows say what they are too: its sweep's lengths and TP, weights as saved.
    twin = rows.filter(model="twin", metric="output_tokens_per_s").order_by("concurrency")
    assert list(twin.values_list(*FULL_SIZE_FIELDS)) == [
        ("twin", "", 128, 32, 2, 80.1),
        ("twin", "", 128, 32, 2, 210.0),
    ]


@pytest.mark.parametrize("status", ["skipped", "failed"])
def test_a_full_size_run_that_measured_nothing_stores_no_full_size_rows(monkeypatch, status):
    full_size = {"status": status, "reason": "over_weight_cap", "load_format": "dummy"}
    result = copy.deepcopy(SERVED) | {"full_size": full_size}
    run = serve_job(monkeypatch, lambda ctx: result).stage_runs.get(stage="serve")
    assert not PerformancePoint.objects.filter(stage_run=run, model="full-size").exists()
    assert PerformancePoint.objects.filter(stage_run=run, model="twin").count() == 16
