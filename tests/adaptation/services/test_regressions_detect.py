"""Judging a finished job's figures against the last good runs: which way is worse, the spread
and the margin, the family's runs for a new release, too few runs, the pool and the stage
status that make a run good, idempotence, and a detection failure that leaves the job's own
bookkeeping alone."""

from __future__ import annotations

import logging

import pytest

from adaptation.models import AcceleratorPool, JobStatus, Regression, StageStatus
from adaptation.selectors.regressions import (
    metric_basis,
    precision_figures,
    serve_figures,
)
from adaptation.services import regressions as regression_services
from adaptation.services.regressions import judge, regressions_detect
from engine.stages.precision.result import DtypeComparison
from tests.factories import make_job, make_release
from tests.regression_runs import KNEE_METRIC, PERF_STAGES, TTFT_METRIC, performance_result
from tests.serve_results import served
from tests.typed_results import precision_result

pytestmark = pytest.mark.django_db


def metrics(job) -> list[str]:
    return sorted(Regression.objects.filter(job=job).values_list("metric", flat=True))


def test_lower_tokens_per_s_is_a_regression_and_higher_is_not(perf_job):
    release = make_release(family="llama")
    baseline = [perf_job(release, tokens_per_s=v) for v in (100.0, 104.0, 98.0)]
    assert not Regression.objects.exists()

    slower = perf_job(release, tokens_per_s=80.0)
    [regression] = Regression.objects.filter(job=slower)
    assert regression.metric == KNEE_METRIC
    assert regression.unit == "tokens/s"
    assert regression.value == 80.0
    assert (regression.baseline_low, regression.baseline_median, regression.baseline_high) == (
        98.0,
        100.0,
        104.0,
    )
    assert regression.worse_by == pytest.approx(0.2)
    assert regression.baseline_jobs == [job.pk for job in reversed(baseline)]
    assert regression.scope == "release"
    assert regression.floor == 0.0  # a speed has no floor, only durations on the host's clock
    assert regression.stage_run.stage == "performance"

    faster = perf_job(release, tokens_per_s=150.0)
    assert metrics(faster) == []


def test_a_slowdown_that_persists_is_judged_against_the_runs_before_it(perf_job):
    release = make_release(family="llama")
    baseline = [perf_job(release, tokens_per_s=v) for v in (100.0, 104.0, 98.0)]
    first = perf_job(release, tokens_per_s=80.0)
    # The regressed run is no good value: counted in, it would widen the spread to 80..104
    # and the same slowdown would pass from the second run on.
    second = perf_job(release, tokens_per_s=81.0)
    assert metrics(first) == metrics(second) == [KNEE_METRIC]
    [regression] = Regression.objects.filter(job=second)
    assert regression.baseline_jobs == [job.pk for job in reversed(baseline)]
    assert regression.baseline_low == 98.0


def test_higher_ttft_p95_is_a_regression_and_lower_is_not(perf_job):
    release = make_release()
    for ttft in (0.10, 0.11, 0.105):
        perf_job(release, tokens_per_s=100.0, ttft_p95_s=ttft)

    slower = perf_job(release, tokens_per_s=100.0, ttft_p95_s=0.2)
    [regression] = Regression.objects.filter(job=slower)
    assert (regression.metric, regression.unit, regression.value) == (TTFT_METRIC, "s", 0.2)
    assert regression.baseline_median == 0.105

    quicker = perf_job(release, tokens_per_s=100.0, ttft_p95_s=0.05)
    assert metrics(quicker) == []


def test_inside_the_spread_or_within_the_margin_is_no_regression(perf_job, settings):
    wide = make_release()
    for tokens in (100.0, 50.0, 150.0):
        perf_job(wide, tokens_per_s=tokens)
    # 40% under the median but inside the spread (50..150).
    assert metrics(perf_job(wide, tokens_per_s=60.0)) == []

    narrow = make_release()
    for tokens in (100.0, 101.0, 102.0):
        perf_job(narrow, tokens_per_s=tokens)
    # Under the spread, but only 5.9% under the median 101 (margin 10%).
    job = perf_job(narrow, tokens_per_s=95.0)
    assert metrics(job) == []
    # A tighter margin makes the same figure a regression, judged again.
    settings.DAY0_REGRESSION_MARGIN = 0.05
    [regression] = regressions_detect(job=job)
    assert (regression.metric, regression.margin) == (KNEE_METRIC, 0.05)


def test_a_new_release_is_compared_with_its_family_on_the_same_pool(perf_job):
    pool = AcceleratorPool.objects.create(name="h200", backend="cuda", queue="pool.h200")
    older = make_release(family="llama")
    family_jobs = [perf_job(older, tokens_per_s=v) for v in (100.0, 102.0)]
    # The family on another pool, and another family on this one, are no baseline.
    for tokens in (10.0, 11.0, 12.0):
        perf_job(older, tokens_per_s=tokens, pool=pool)
        perf_job(make_release(family="qwen2"), tokens_per_s=tokens)

    new = perf_job(make_release(family="llama"), tokens_per_s=70.0)
    [regression] = Regression.objects.filter(job=new)
    assert regression.scope == "family"
    assert regression.baseline_jobs == [job.pk for job in reversed(family_jobs)]
    assert regression.baseline_median == 101.0


def test_fewer_than_two_good_runs_judge_nothing(perf_job):
    release = make_release(family="")
    perf_job(release, tokens_per_s=100.0)
    # A run whose performance stage failed is no good run of its figures.
    make_job(
        release=release,
        stages=PERF_STAGES,
        statuses={"fetch": "succeeded", "analyze": "succeeded", "performance": "failed"},
        results={"performance": performance_result(tokens_per_s=100.0)},
    )
    assert metrics(perf_job(release, tokens_per_s=10.0)) == []
    assert judge(10.0, [100.0], worse="lower", margin=0.1) is None
    assert judge(10.0, [0.0, 0.0], worse="higher", margin=0.1) is None


def test_a_failed_job_keeps_the_figures_of_its_stages_that_succeeded(perf_job):
    release = make_release()
    for tokens in (100.0, 101.0):
        perf_job(release, tokens_per_s=tokens)
    failed = make_job(
        release=release,
        stages=(*PERF_STAGES, "stability"),
        statuses={**dict.fromkeys(PERF_STAGES, StageStatus.SUCCEEDED), "stability": "failed"},
        results={"performance": performance_result(tokens_per_s=50.0)},
    )
    assert failed.status == JobStatus.FAILED
    assert metrics(failed) == [KNEE_METRIC]


def test_detecting_again_changes_nothing(perf_job):
    release = make_release()
    for tokens in (100.0, 101.0, 99.0):
        perf_job(release, tokens_per_s=tokens)
    job = perf_job(release, tokens_per_s=50.0, ttft_p95_s=0.5)
    first = {r.metric: (r.pk, r.detected_at) for r in Regression.objects.filter(job=job)}
    assert sorted(first) == [KNEE_METRIC, TTFT_METRIC]

    again = regressions_detect(job=job)
    assert [r.metric for r in again] == [KNEE_METRIC, TTFT_METRIC]
    assert {r.metric: (r.pk, r.detected_at) for r in again} == first
    assert Regression.objects.count() == 2


def test_a_detection_failure_leaves_the_job_finished_and_is_logged(perf_job, monkeypatch, caplog):
    release = make_release()
    for tokens in (100.0, 101.0):
        perf_job(release, tokens_per_s=tokens)

    def broken(job):
        raise RuntimeError("baseline read failed")

    monkeypatch.setattr(regression_services, "regressions_find", broken)
    with caplog.at_level(logging.ERROR):
        job = perf_job(release, tokens_per_s=10.0)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED and job.finished_at is not None
    assert not Regression.objects.exists()
    assert f"Could not judge the figures of job {job.pk}" in caplog.text


def test_serve_figures_are_the_engines_and_say_so():
    figures = {f.metric: (f.value, f.unit) for f in serve_figures(served())}
    assert figures == {
        "load_s:engine-twin:bfloat16": (84.2, "s"),
        "max_abs_logprob_diff:engine-twin:bfloat16": (0.012, ""),
        # The knee is concurrency 4: 210 output tokens/s, TTFT p95 0.110 s at that level.
        "decode_tokens_per_s:engine-twin:bfloat16:128": (210.0, "tokens/s"),
        "ttft_p95_s:engine-twin:bfloat16:128": (0.110, "s"),
    }
    assert serve_figures({"status": "not_configured"}) == []
    basis = metric_basis("ttft_p95_s:engine-twin:bfloat16:128")
    assert (basis.figure, basis.measured_on, basis.dtype, basis.prompt_tokens) == (
        "ttft_p95_s",
        "engine-twin",
        "bfloat16",
        128,
    )
    assert metric_basis("duration_s:worker:fetch").stage == "fetch"


def test_precision_figures_per_dtype_on_the_twin_or_the_real_weights():
    result = precision_result(
        DtypeComparison("float16", passed=True, relative_logit_error=0.0004),
        DtypeComparison("bfloat16", passed=True, relative_logit_error=0.003),
        twin={"weights_source": "seeded"},
    )
    assert [(f.metric, f.value) for f in precision_figures(result)] == [
        ("relative_logit_error:twin:bfloat16", 0.003),
        ("relative_logit_error:twin:float16", 0.0004),
    ]
    result["twin"] = {"weights_source": "real"}
    assert precision_figures(result)[0].metric == "relative_logit_error:release:bfloat16"


def test_precision_errors_and_engine_load_time_regress_upwards():
    release = make_release()
    stages = ("precision", "serve")

    def job(error: float, load_s: float):
        return make_job(
            release=release,
            stages=stages,
            statuses=dict.fromkeys(stages, StageStatus.SUCCEEDED),
            results={
                "precision": precision_result(
                    DtypeComparison("bfloat16", passed=True, relative_logit_error=error), twin={}
                ),
                "serve": served(load_s=load_s),
            },
        )

    job(0.003, 80.0)
    job(0.003, 84.0)
    # 5 s slower to load is 6% over the median 82 s: under the margin.
    assert metrics(job(0.003, 87.0)) == []
    worse = job(0.006, 100.0)
    assert metrics(worse) == ["load_s:engine-twin:bfloat16", "relative_logit_error:twin:bfloat16"]
