"""Failure classes: every failed stage run is put down to the infrastructure or to the release
(`StageRun.failure_class`), its error reads as words, and only the release's faults raise
known limitations. Test stages stand in for the registry's through `get_stage`."""

from __future__ import annotations

import importlib

import pytest

from adaptation.models import (
    FailureClass,
    JobStatus,
    KnownLimitation,
    ReleaseNotes,
    StageRun,
    StageStatus,
)
from adaptation.services.jobs import job_cancel
from adaptation.services.stage_runs import stage_run_claim, stage_run_lost
from engine.contract import StageDefinition, StageFailed
from engine.registry import get_stage, stage_names
from tests.cast import cast  # noqa: F401  (the fixture)
from tests.factories import make_job
from workers import runner
from workers.failures import classify_exception, classify_stage_failed, result_culprit

pytestmark = pytest.mark.django_db


def use_stage(monkeypatch, name: str, run, *, soft_time_limit_s: int = 180) -> None:
    """Make stage `name` resolve to a test stage whose body is `run` (the others as
    registered)."""
    definition = StageDefinition(
        name=name, title="Test", run=run, soft_time_limit_s=soft_time_limit_s
    )
    monkeypatch.setattr(
        runner, "get_stage", lambda stage: definition if stage == name else get_stage(stage)
    )


def queued(stage: str, **kwargs):
    job = make_job(stages=(stage,), statuses={stage: StageStatus.QUEUED}, **kwargs)
    return job, job.stage_runs.get(stage=stage)


def sweep_result(error: str) -> dict:
    """A performance result that measured one point and then stopped on `error`."""
    return {
        "points": [],
        "stopped": [],
        "errors": [{"dtype": "float16", "prompt_len": 128, "batch_size": 32, "error": error}],
    }


def failing_sweep(error: str):
    def run(ctx):
        result = sweep_result(error)
        raise StageFailed(
            f"float16 at prompt 128, batch 32: the twin raised {error}", result=result
        )

    return run


def test_a_sweep_stopped_by_the_time_limit_is_infra_in_words_and_raises_no_limitation(
    monkeypatch,
):
    use_stage(monkeypatch, "performance", failing_sweep("SoftTimeLimitExceeded"))
    _, run = queued("performance")
    runner.execute_stage_run(run.pk)
    run.refresh_from_db()
    assert run.status == StageStatus.FAILED
    assert run.failure_class == FailureClass.INFRASTRUCTURE
    assert run.error.startswith("performance ran past its time budget of 180 s")
    assert "SoftTimeLimitExceeded" not in run.error
    assert "the twin raised SoftTimeLimitExceeded" in run.log  # the stage's own words, logged
    assert (run.attempts[-1]["ended"], run.attempts[-1]["culprit"]) == (
        "time-limit",
        "infrastructure",
    )
    assert run.result["errors"]  # what it measured is kept
    assert not KnownLimitation.objects.filter(stage="performance").exists()


def test_the_same_sweep_failing_on_its_own_is_the_releases_and_raises_its_limitation(
    monkeypatch,
):
    use_stage(monkeypatch, "performance", failing_sweep("RuntimeError: kernel exploded"))
    _, run = queued("performance")
    runner.execute_stage_run(run.pk)
    run.refresh_from_db()
    assert run.failure_class == FailureClass.RELEASE
    assert (
        run.error
        == "float16 at prompt 128, batch 32: the twin raised RuntimeError: kernel exploded"
    )
    note = KnownLimitation.objects.get(stage="performance")
    assert note.title.startswith("The twin fails mid-sweep in float16")


def test_a_stage_that_ran_its_whole_budget_is_a_time_limit_whatever_it_says(monkeypatch):
    verdict = classify_stage_failed(
        stage="stability", reason="step 40: boom", result=None, limit_s=30, ran_s=30.2
    )
    assert verdict.failure_class == FailureClass.INFRASTRUCTURE
    assert verdict.error.startswith("stability ran past its time budget of 30 s")
    early = classify_stage_failed(
        stage="stability", reason="step 40: boom", result=None, limit_s=30, ran_s=3
    )
    assert (early.failure_class, early.error) == (FailureClass.RELEASE, "step 40: boom")


@pytest.mark.parametrize(
    ("exc", "words"),
    [
        (MemoryError(), "fetch stopped: the host ran out of memory."),
        (
            RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 9 GB"),
            "fetch stopped: the host ran out of memory (DefaultCPUAllocator: can't allocate "
            "memory: you tried 9 GB).",
        ),
        (
            ConnectionRefusedError(111, "Connection refused"),
            "fetch stopped: the network was unavailable ([Errno 111] Connection refused).",
        ),
    ],
)
def test_a_host_cause_is_infra_in_words(monkeypatch, exc, words):
    def crash(ctx):
        raise exc

    use_stage(monkeypatch, "fetch", crash)
    _, run = queued("fetch")
    runner.execute_stage_run(run.pk)
    run.refresh_from_db()
    assert (run.failure_class, run.error) == (FailureClass.INFRASTRUCTURE, words)
    assert type(exc).__name__ in run.log  # the traceback is in the log only


def test_a_day0_bug_is_not_the_releases_fault():
    verdict = classify_exception(stage="plan", exc=ZeroDivisionError("division by zero"))
    assert verdict.failure_class == FailureClass.INFRASTRUCTURE
    assert verdict.error.startswith("day0 error: plan stopped on an unexpected error in day0")
    assert "ZeroDivisionError" not in verdict.error


def test_a_serve_launch_the_host_refused_is_infra(monkeypatch):
    def refuse(ctx):
        raise StageFailed(
            "the engine did not start: no GPU visible",
            result={"status": "failed", "failure": {"culprit": "infrastructure"}},
        )

    use_stage(monkeypatch, "serve", refuse)
    _, run = queued("serve")
    runner.execute_stage_run(run.pk)
    run.refresh_from_db()
    assert run.failure_class == FailureClass.INFRASTRUCTURE
    assert run.error == "the engine did not start: no GPU visible"


@pytest.mark.parametrize(
    ("result", "culprit"),
    [
        # The serve stage's failure (`Failure.to_dict`), a stability run its time budget cut
        # (`StabilityResult`'s), the remote-code sandbox's: one reader for every stage's.
        (
            {
                "failure": {
                    "phase": "launch",
                    "reason": "oom",
                    "engine_lines": [],
                    "culprit": "release",
                }
            },
            FailureClass.RELEASE,
        ),
        ({"failure": {"culprit": "infrastructure", "reason": "time budget"}}, "infrastructure"),
        ({"failure": {"phase": "sandbox", "culprit": "infrastructure"}}, "infrastructure"),
        ({"failure": {"culprit": "the moon"}}, None),
        ({"failure": {"culprit": None}}, None),
        ({"failure": "engine died"}, None),
        ({"failure": None}, None),
        ("failed", None),
        (None, None),
    ],
)
def test_the_culprit_is_read_from_any_stages_failure(result, culprit):
    assert result_culprit(result) == culprit


def test_a_stage_lost_on_every_attempt_is_infra(settings):
    settings.DAY0_STAGE_MAX_ATTEMPTS = 1
    _, run = queued("fetch")
    assert stage_run_claim(stage_run_id=run.pk, worker_host="cpu@a", pid=999999) is not None
    assert stage_run_lost(stage_run_id=run.pk, reason="killed by signal 9 (SIGKILL)") == "failed"
    run.refresh_from_db()
    assert run.failure_class == FailureClass.INFRASTRUCTURE
    assert run.error.startswith("Lost on 1 attempt, each killed by SIGKILL")


def test_the_api_shows_the_class(cast, monkeypatch):  # noqa: F811  (the fixture)
    use_stage(monkeypatch, "fetch", failing_sweep("SoftTimeLimitExceeded"))
    job, run = queued("fetch")
    runner.execute_stage_run(run.pk)
    api = cast.api("mona")
    body = api.get(f"/api/v1/stages/{run.pk}/").json()
    assert body["failure_class"] == "infrastructure"
    stages = api.get(f"/api/v1/jobs/{job.pk}/").json()["stages"]
    assert [s["failure_class"] for s in stages] == ["infrastructure"]


# --- release notes for a blocked job ----------------------------------------------------------


def test_a_job_whose_plan_fails_gets_release_notes_that_name_the_failure(monkeypatch):
    def no_fit(ctx):
        raise StageFailed("nothing fits the pool: 1,200 GB of weights on 80 GB")

    use_stage(monkeypatch, "plan", no_fit)
    names = stage_names()
    job = make_job(
        stages=names,
        statuses={
            "fetch": StageStatus.SUCCEEDED,
            "analyze": StageStatus.SUCCEEDED,
            "plan": StageStatus.QUEUED,
        },
    )
    plan = job.stage_runs.get(stage="plan")
    assert runner.execute_stage_run(plan.pk).status == "failed"
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    statuses = dict(job.stage_runs.values_list("stage", "status"))
    after = names[names.index("plan") + 1 : -1]
    assert {statuses[name] for name in after} == {StageStatus.SKIPPED}
    assert statuses["release_notes"] == StageStatus.QUEUED

    notes_run = job.stage_runs.get(stage="release_notes")
    assert runner.execute_stage_run(notes_run.pk).status == "succeeded"
    notes = ReleaseNotes.objects.get(job=job)
    assert notes.markdown.startswith("## What blocked this release")
    assert "The `plan` stage failed: nothing fits the pool: 1,200 GB of weights on 80 GB." in (
        notes.markdown
    )
    assert "This is a release failure" in notes.markdown
    assert notes.sections["blocked"]["failure_class"] == "release"
    assert notes.sections["summary"].startswith("blocked at plan (release); ")
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED  # the notes do not change how the job ended


def test_a_cancelled_job_does_not_write_notes():
    job = make_job(
        stages=("fetch", "analyze", "release_notes"), statuses={"fetch": StageStatus.RUNNING}
    )
    job_cancel(job=job)
    assert StageRun.objects.get(job=job, stage="release_notes").status == StageStatus.CANCELLED


# --- the migration's frozen rule for older runs -------------------------------------------------


def test_older_failed_runs_are_classified_by_what_they_kept():
    rule = importlib.import_module("adaptation.migrations.0010_stage_run_failure_class")

    def run(**fields):
        return StageRun(status="failed", **fields)

    assert rule.failure_class_of(run(attempts=[{"culprit": "infrastructure"}])) == (
        "infrastructure"
    )
    assert rule.failure_class_of(run(error="performance ran past its time limit of 180 s.")) == (
        "infrastructure"
    )
    assert (
        rule.failure_class_of(run(error="x", result=sweep_result("SoftTimeLimitExceeded")))
        == "infrastructure"
    )
    assert rule.failure_class_of(
        run(error="KeyError: 'x'\n\nTraceback (most recent call last):")
    ) == ("infrastructure")
    assert rule.failure_class_of(run(error="nothing fits the pool")) == "release"
