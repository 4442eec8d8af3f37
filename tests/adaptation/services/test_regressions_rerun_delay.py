"""The regression alerts, proven on real stages: jobs of fetch and analyze run in
this process on a mirror release several times for a baseline; a re-run whose analyze is
slowed by an injected delay (the duration floor plus one second) raises exactly one
regression, that stage's duration; a normal run after it raises none."""

from __future__ import annotations

import time

import pytest

from adaptation.models import AdaptationJob, JobStatus, Regression, StageStatus
from adaptation.services.jobs import job_create, job_rerun_stage
from tests.conftest import REALCONFIGS_DIR
from tests.factories import cpu_pool
from tests.helpers import mirror_release, run_queued_stages

pytestmark = pytest.mark.django_db

STAGES = ["fetch", "analyze"]


@pytest.fixture
def release(tmp_path):
    config = (REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json").read_bytes()
    return mirror_release(tmp_path / "hub", "meta-llama/Llama-3.1-8B", config)


def _run_job(release) -> AdaptationJob:
    job = job_create(release=release, pool=cpu_pool(), trigger="manual", stages=STAGES)
    job = run_queued_stages(job)
    assert job.status == JobStatus.SUCCEEDED, [r.error for r in job.stage_runs.all()]
    return job


@pytest.fixture
def slow_analyze(monkeypatch, settings):
    """Make the analyze stage sleep the duration floor plus one second before it runs."""
    import engine.stages.analyze.run as analyze

    delay_s = settings.DAY0_REGRESSION_FLOOR_S + 1.0
    real = analyze.run

    def slowed(ctx):
        time.sleep(delay_s)  # the injected delay
        return real(ctx)

    def install() -> None:
        monkeypatch.setattr(analyze, "run", slowed)

    def remove() -> None:
        monkeypatch.setattr(analyze, "run", real)

    return install, remove, delay_s


def test_a_slower_rerun_raises_exactly_one_regression_and_a_normal_one_none(
    release, slow_analyze, settings
):
    install, remove, delay_s = slow_analyze
    assert settings.DAY0_REGRESSION_FLOOR_S == 2.0  # the default: 2 s
    baseline = [_run_job(release) for _ in range(3)]
    assert not Regression.objects.exists()  # the first has no baseline, then all alike

    install()
    slow = _run_job(release)
    remove()
    [regression] = Regression.objects.filter(job=slow)
    assert regression.metric == "duration_s:worker:analyze"
    assert regression.unit == "s"
    assert regression.stage_run.stage == "analyze"
    assert regression.stage_run.job_id == slow.pk
    assert regression.scope == "release"
    assert regression.baseline_jobs == [job.pk for job in reversed(baseline)]
    assert regression.value >= delay_s
    assert regression.value > regression.baseline_high
    assert regression.value - regression.baseline_median >= settings.DAY0_REGRESSION_FLOOR_S
    assert regression.worse_by > settings.DAY0_REGRESSION_MARGIN
    assert regression.margin == settings.DAY0_REGRESSION_MARGIN
    assert regression.floor == 2.0

    normal = _run_job(release)
    assert not Regression.objects.filter(job=normal).exists()
    assert Regression.objects.count() == 1


def test_a_rerun_stage_that_is_no_longer_slow_clears_the_regression(release, slow_analyze):
    install, remove, _ = slow_analyze
    for _ in range(2):
        _run_job(release)
    install()
    slow = _run_job(release)
    remove()
    assert list(Regression.objects.filter(job=slow).values_list("metric", flat=True)) == [
        "duration_s:worker:analyze"
    ]

    job_rerun_stage(job=slow, stage="analyze")
    slow = run_queued_stages(slow)
    assert slow.status == JobStatus.SUCCEEDED
    runs = slow.stage_runs.filter(stage="analyze").order_by("attempt")
    assert [run.status for run in runs] == [StageStatus.SUCCEEDED, StageStatus.SUCCEEDED]
    assert not Regression.objects.filter(job=slow).exists()
