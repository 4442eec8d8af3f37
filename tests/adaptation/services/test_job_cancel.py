"""Cancelling a job: its unfinished stages are cancelled, a worker running one stops at its
next heartbeat and step, its later result is discarded, and a stage can be re-run later."""

from __future__ import annotations

import pytest
from celery import current_app
from django.db import connection

from adaptation.models import JobStatus, StageRun, StageStatus
from adaptation.services.errors import ServiceError
from adaptation.services.jobs import derive_job_status, job_cancel, job_rerun_stage
from adaptation.services.stage_runs import (
    stage_run_claim,
    stage_run_fail,
    stage_run_heartbeat,
    stage_run_requeue,
    stage_run_succeed,
)
from engine.contract import StageDefinition, StageFailed, StageTransientError
from tests.factories import make_job
from workers import runner

pytestmark = pytest.mark.django_db

S = StageStatus


def runs(job) -> list[tuple[str, int, str]]:
    return list(
        StageRun.objects.filter(job=job)
        .order_by("position", "attempt")
        .values_list("stage", "attempt", "status")
    )


@pytest.fixture
def revoked(monkeypatch) -> list[tuple]:
    """The Celery revokes sent (none reaches a broker)."""
    calls: list[tuple] = []
    monkeypatch.setattr(
        current_app.control, "revoke", lambda task_id, **kw: calls.append((task_id, kw))
    )
    return calls


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (["succeeded", "cancelled"], JobStatus.CANCELLED),
        (["cancelled", "cancelled"], JobStatus.CANCELLED),
        (["failed", "cancelled"], JobStatus.FAILED),
        (["succeeded", "succeeded"], JobStatus.SUCCEEDED),
        (["succeeded", "queued"], JobStatus.RUNNING),
    ],
)
def test_a_cancelled_latest_attempt_makes_the_job_cancelled(statuses, expected):
    assert derive_job_status(statuses) == expected


def test_cancel_cancels_every_unfinished_stage_and_the_job(django_user_model, revoked):
    eli = django_user_model.objects.create_user(username="eli")
    job = make_job(
        stages=("fetch", "analyze", "plan"), statuses={"fetch": S.SUCCEEDED, "analyze": S.RUNNING}
    )
    StageRun.objects.filter(job=job, stage="analyze").update(celery_task_id="task-42")

    cancelled = job_cancel(job=job, by=eli)

    assert cancelled.status == JobStatus.CANCELLED and cancelled.finished_at is not None
    assert runs(job) == [
        ("fetch", 1, "succeeded"),
        ("analyze", 1, "cancelled"),
        ("plan", 1, "cancelled"),
    ]
    analyze = StageRun.objects.get(job=job, stage="analyze")
    assert analyze.error == "Cancelled by eli."
    assert analyze.finished_at == cancelled.finished_at
    assert StageRun.objects.get(job=job, stage="fetch").error == ""
    assert revoked == []  # not before the transaction commits (never here: it rolls back)


def test_cancel_sends_no_revoke_the_worker_stops_itself(
    revoked, django_capture_on_commit_callbacks
):
    """Killing the pool process running a task can leave the worker stuck on its pool's
    locks: the worker learns of the cancel from its heartbeat instead."""
    job = make_job(statuses={"fetch": S.RUNNING})
    StageRun.objects.filter(job=job, stage="fetch").update(celery_task_id="task-7")
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=job)
    assert revoked == []
    assert StageRun.objects.get(job=job, stage="fetch").error == "Cancelled by an operator."
    assert stage_run_heartbeat(stage_run_id=job.stage_runs.get(stage="fetch").pk) is False


@pytest.mark.django_db(
    transaction=True
)  # the heartbeat and the canceller use their own connections
def test_a_running_stage_stops_at_its_next_step_once_cancelled(monkeypatch, settings):
    """The runner's heartbeat finds the run cancelled and the stage's next check raises
    StageCancelled: nothing is stored over the cancelled row."""
    import threading

    from engine.contract import raise_if_cancelled

    settings.DAY0_HEARTBEAT_EVERY_S = 0.05
    job = make_job(statuses={"fetch": S.QUEUED})
    run = job.stage_runs.get(stage="fetch")
    started, steps = threading.Event(), []

    def endless(ctx):
        started.set()
        while len(steps) < 1000:  # about 10 s at most: the cancel comes after 0.2 s
            raise_if_cancelled(ctx.cancelled)
            steps.append(1)
            threading.Event().wait(0.01)
        return {"steps": len(steps)}

    definition = StageDefinition(name="fetch", title="Fetch", run=endless)
    monkeypatch.setattr(runner, "get_stage", lambda name: definition)

    def cancel() -> None:
        try:
            job_cancel(job=job)
        finally:
            connection.close()  # the timer thread's own connection (else it outlives the test)

    threading.Timer(0.2, cancel).start()

    outcome = runner.execute_stage_run(run.pk, worker_host="test")

    assert outcome.status == "cancelled"
    assert started.is_set() and len(steps) < 1000
    run.refresh_from_db()
    assert (run.status, run.result) == (S.CANCELLED, None)
    assert [(a["ended"], a["reason"]) for a in run.attempts] == [
        ("cancelled", "stopped: the run was no longer running")
    ]


@pytest.mark.parametrize("status", [S.SUCCEEDED, S.FAILED])
def test_a_finished_job_cannot_be_cancelled(status):
    job = make_job(statuses={"fetch": S.SUCCEEDED, "analyze": status})
    with pytest.raises(ServiceError, match=f"has already {status}"):
        job_cancel(job=job)
    assert runs(job) == [("fetch", 1, "succeeded"), ("analyze", 1, status)]


def test_a_cancelled_job_cannot_be_cancelled_again(revoked):
    job = make_job(statuses={"fetch": S.QUEUED})
    job_cancel(job=job)
    with pytest.raises(ServiceError, match="has already cancelled"):
        job_cancel(job=job)


def test_a_worker_finishing_a_cancelled_stage_changes_nothing(revoked):
    job = make_job(statuses={"fetch": S.RUNNING})
    run = StageRun.objects.get(job=job, stage="fetch")
    job_cancel(job=job)

    stage_run_succeed(stage_run=run, result={"files": 4})
    assert not stage_run_fail(stage_run=run, error="late failure")
    assert not stage_run_requeue(stage_run=run, reason="hub 429")
    assert not stage_run_heartbeat(stage_run_id=run.pk)

    run.refresh_from_db()
    assert (run.status, run.result, run.error) == (S.CANCELLED, None, "Cancelled by an operator.")
    assert runs(job) == [("fetch", 1, "cancelled"), ("analyze", 1, "cancelled")]
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED


def _stage_cancelling_its_job(outcome):
    """A fetch stage during which someone cancels its job, then `outcome(ctx)` happens."""

    def run(ctx):
        run_row = StageRun.objects.get(status=S.RUNNING)
        job_cancel(job=run_row.job)
        return outcome(ctx)

    return StageDefinition(name="fetch", title="Fetch", run=run)


def _fail(ctx):
    raise StageFailed("bad config")


def _transient(ctx):
    raise StageTransientError("hub 429", retry_after_s=5)


@pytest.mark.parametrize(
    ("outcome", "reported"),
    [
        (lambda ctx: {"files": 4}, "succeeded"),
        (_fail, "failed"),
        (_transient, "not-claimed"),
    ],
)
def test_a_stage_cancelled_while_a_worker_runs_it_keeps_cancelled(
    monkeypatch, revoked, outcome, reported
):
    """The real runner: the worker claims the run, the job is cancelled while the stage runs,
    and whatever the stage ends with is discarded; the next stage is never queued."""
    monkeypatch.setattr(runner, "get_stage", lambda name: _stage_cancelling_its_job(outcome))
    job = make_job(statuses={"fetch": S.QUEUED})
    run = StageRun.objects.get(job=job, stage="fetch")

    result = runner.execute_stage_run(run.pk, final_try=False)

    assert result.status == reported  # what the worker believed
    run.refresh_from_db()
    assert (run.status, run.result, run.error) == (S.CANCELLED, None, "Cancelled by an operator.")
    assert runs(job) == [("fetch", 1, "cancelled"), ("analyze", 1, "cancelled")]
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED


def test_a_cancelled_job_is_not_claimed_by_a_late_delivery(revoked):
    job = make_job(statuses={"fetch": S.QUEUED})
    run = StageRun.objects.get(job=job, stage="fetch")
    job_cancel(job=job)
    assert stage_run_claim(stage_run_id=run.pk, worker_host="w@h") is None


def test_a_stage_of_a_cancelled_job_can_be_rerun(revoked, django_capture_on_commit_callbacks):
    job = make_job(
        stages=("fetch", "analyze", "plan"), statuses={"fetch": S.SUCCEEDED, "analyze": S.RUNNING}
    )
    job_cancel(job=job)

    # A later stage needs the cancelled one to succeed first.
    with pytest.raises(ServiceError, match="plan needs analyze to succeed first"):
        job_rerun_stage(job=job, stage="plan")

    with django_capture_on_commit_callbacks(execute=False) as sent:
        run = job_rerun_stage(job=job, stage="analyze")
    assert (run.stage, run.attempt, run.status) == ("analyze", 2, S.QUEUED)
    assert len(sent) == 1
    assert runs(job) == [
        ("fetch", 1, "succeeded"),
        ("analyze", 1, "cancelled"),
        ("analyze", 2, "queued"),
        ("plan", 1, "cancelled"),
        ("plan", 2, "pending"),
    ]
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.finished_at is None

    # The new attempts finish the job as usual.
    StageRun.objects.filter(pk=run.pk).update(status=S.RUNNING)
    stage_run_succeed(stage_run=run, result={"family": "llama"})
    plan = StageRun.objects.get(job=job, stage="plan", attempt=2)
    assert plan.status == S.QUEUED
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
