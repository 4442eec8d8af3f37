"""The runner around each stage attempt: claims, failures of every kind, retries, takeovers
of lost workers, heartbeats. Test stages stand in for the registry's through `get_stage`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.db import OperationalError
from django.utils import timezone

from adaptation.models import FailureClass, JobStatus, StageRun, StageStatus
from engine.contract import StageDefinition, StageFailed, StageTransientError
from tests.factories import make_job
from workers import runner

pytestmark = pytest.mark.django_db


def use_stage(monkeypatch, run) -> None:
    """Make every stage name resolve to a test stage whose body is `run`."""
    definition = StageDefinition(name="fetch", title="Test", run=run, soft_time_limit_s=7)
    monkeypatch.setattr(runner, "get_stage", lambda name: definition)


def queued_fetch():
    job = make_job(statuses={"fetch": StageStatus.QUEUED})
    return job, job.stage_runs.get(stage="fetch")


def test_a_run_that_is_not_queued_is_not_run_again(monkeypatch):
    calls = []
    use_stage(monkeypatch, lambda ctx: calls.append(1) or {})
    job = make_job(statuses={"fetch": StageStatus.SUCCEEDED})
    outcome = runner.execute_stage_run(job.stage_runs.get(stage="fetch").pk)
    assert outcome.status == "not-claimed" and calls == []


def test_a_crash_is_a_day0_error_in_words_with_its_traceback_in_the_log(monkeypatch):
    def crash(ctx):
        raise KeyError("num_experts")

    use_stage(monkeypatch, crash)
    job, run = queued_fetch()
    assert runner.execute_stage_run(run.pk).status == "failed"
    run.refresh_from_db()
    assert run.error.startswith(
        "day0 error: fetch stopped on an unexpected error in day0 ('num_experts')"
    )
    assert "KeyError" not in run.error and "Traceback" not in run.error
    assert "Traceback (most recent call last)" in run.log and "KeyError" in run.log
    assert run.failure_class == FailureClass.INFRASTRUCTURE
    assert run.attempts[-1]["culprit"] == "infrastructure"
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.stage_runs.get(stage="analyze").status == StageStatus.SKIPPED


def test_stage_failed_keeps_the_reason_and_the_log(monkeypatch):
    def refuse(ctx):
        ctx.log("read config.json")
        raise StageFailed("config.json has no hidden_size")

    use_stage(monkeypatch, refuse)
    _, run = queued_fetch()
    runner.execute_stage_run(run.pk)
    run.refresh_from_db()
    assert run.error == "config.json has no hidden_size"
    assert "read config.json" in run.log
    assert run.failure_class == FailureClass.RELEASE


def test_soft_time_limit_fails_with_the_limit(monkeypatch):
    def slow(ctx):
        raise SoftTimeLimitExceeded()

    use_stage(monkeypatch, slow)
    _, run = queued_fetch()
    runner.execute_stage_run(run.pk)
    run.refresh_from_db()
    assert run.error.startswith("fetch ran past its time budget of 7 s and was stopped")
    assert "SoftTimeLimitExceeded" not in run.error
    assert run.failure_class == FailureClass.INFRASTRUCTURE
    assert [(a["ended"], a["reason"], a["culprit"]) for a in run.attempts] == [
        ("time-limit", run.error, "infrastructure")
    ]


def test_an_attempt_records_its_process_and_how_it_ended(monkeypatch):
    monkeypatch.setattr(runner, "oom_kill_count", lambda: 5)
    use_stage(monkeypatch, lambda ctx: {"config": {"model_type": "llama"}})
    _, run = queued_fetch()
    assert runner.execute_stage_run(run.pk, worker_host="cpu@box").status == "succeeded"
    run.refresh_from_db()
    assert run.attempts == [
        {
            "n": 1,
            "worker_host": "cpu@box",
            "pid": os.getpid(),
            "started_at": run.started_at.isoformat(),
            "ended_at": run.finished_at.isoformat(),
            "ended": "succeeded",
            "reason": "",
            "culprit": None,
            "oom_kills_at_start": 5,
        }
    ]
    assert f"started fetch attempt 1 on cpu@box (pid {os.getpid()})" in run.log


def test_a_stage_failure_records_the_culprit_its_result_names(monkeypatch):
    def refuse(ctx):
        raise StageFailed(
            "the engine is refused", result={"failure": {"culprit": "infrastructure"}}
        )

    use_stage(monkeypatch, refuse)
    _, run = queued_fetch()
    runner.execute_stage_run(run.pk)
    run.refresh_from_db()
    assert [(a["ended"], a["reason"], a["culprit"]) for a in run.attempts] == [
        ("failed", "the engine is refused", "infrastructure")
    ]
    assert run.failure_class == FailureClass.INFRASTRUCTURE


def test_transient_errors_retry_then_give_up_on_the_last_try(monkeypatch):
    def flaky(ctx):
        raise StageTransientError("the Hub answered 503", retry_after_s=30)

    use_stage(monkeypatch, flaky)
    _, run = queued_fetch()
    outcome = runner.execute_stage_run(run.pk)
    assert (outcome.status, outcome.retry_after_s) == ("retry", 30)
    run.refresh_from_db()
    assert (run.status, run.retries) == (StageStatus.QUEUED, 1)

    outcome = runner.execute_stage_run(run.pk, final_try=True)
    run.refresh_from_db()
    assert outcome.status == "failed"
    assert run.error == "the Hub answered 503 (gave up after 2 tries)"
    assert run.failure_class == FailureClass.INFRASTRUCTURE
    assert [(a["n"], a["ended"], a["reason"]) for a in run.attempts] == [
        (1, "transient", "the Hub answered 503"),
        (2, "transient", "the Hub answered 503 (gave up after 2 tries)"),
    ]


def test_a_result_the_database_cannot_store_fails_the_stage(monkeypatch):
    use_stage(monkeypatch, lambda ctx: {"rope_theta": float("nan")})
    _, run = queued_fetch()
    assert runner.execute_stage_run(run.pk).status == "failed"
    run.refresh_from_db()
    assert run.status == StageStatus.FAILED and run.result is None
    assert run.error  # the database's own refusal, with its traceback


def test_a_lost_workers_run_is_taken_over_by_the_redelivered_message(monkeypatch, settings):
    use_stage(monkeypatch, lambda ctx: {"config": {"model_type": "llama"}})
    job = make_job(statuses={"fetch": StageStatus.RUNNING})
    run = job.stage_runs.get(stage="fetch")
    stale = timezone.now() - timedelta(seconds=settings.DAY0_STALE_HEARTBEAT_S + 1)
    StageRun.objects.filter(pk=run.pk).update(heartbeat_at=stale, worker_host="dead-host")

    assert runner.execute_stage_run(run.pk).status == "succeeded"
    run.refresh_from_db()
    assert run.status == StageStatus.SUCCEEDED
    assert run.retries == 1 and run.worker_host != "dead-host"
    assert [(a["worker_host"], a["ended"]) for a in run.attempts] == [
        ("dead-host", "worker-lost"),
        (run.worker_host, "succeeded"),
    ]


def test_a_live_run_is_not_taken_over(monkeypatch):
    use_stage(monkeypatch, lambda ctx: {})
    job = make_job(statuses={"fetch": StageStatus.RUNNING})
    run = job.stage_runs.get(stage="fetch")
    StageRun.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now())
    assert runner.execute_stage_run(run.pk).status == "not-claimed"


def test_a_result_arriving_after_the_reaper_is_dropped(monkeypatch):
    def reaped_meanwhile(ctx):
        StageRun.objects.filter(stage="fetch").update(status=StageStatus.FAILED, error="reaped")
        return {"config": {}}

    use_stage(monkeypatch, reaped_meanwhile)
    _, run = queued_fetch()
    runner.execute_stage_run(run.pk)
    run.refresh_from_db()
    assert (run.status, run.error, run.result) == (StageStatus.FAILED, "reaped", None)


@pytest.mark.django_db(transaction=True)
def test_heartbeat_thread_advances_the_heartbeat():
    job = make_job(statuses={"fetch": StageStatus.RUNNING})
    run = job.stage_runs.get(stage="fetch")
    old = timezone.now() - timedelta(minutes=5)
    StageRun.objects.filter(pk=run.pk).update(heartbeat_at=old)
    with runner.Heartbeat(run.pk, every_s=0.05):
        deadline = time.monotonic() + 5
        while StageRun.objects.get(pk=run.pk).heartbeat_at == old and time.monotonic() < deadline:
            time.sleep(0.05)
    assert StageRun.objects.get(pk=run.pk).heartbeat_at > old


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_thread_survives_a_database_error(monkeypatch):
    job = make_job(statuses={"fetch": StageStatus.RUNNING})
    run = job.stage_runs.get(stage="fetch")
    old = timezone.now() - timedelta(minutes=5)
    StageRun.objects.filter(pk=run.pk).update(heartbeat_at=old)
    beat, failures = runner.stage_run_heartbeat, []

    def blip_once(**kwargs):
        if not failures:
            failures.append(1)
            raise OperationalError("terminating connection due to administrator command")
        return beat(**kwargs)

    monkeypatch.setattr(runner, "stage_run_heartbeat", blip_once)
    with runner.Heartbeat(run.pk, every_s=0.05) as heartbeat:
        deadline = time.monotonic() + 5
        while StageRun.objects.get(pk=run.pk).heartbeat_at == old and time.monotonic() < deadline:
            time.sleep(0.05)
    assert failures == [1] and not heartbeat.cancelled.is_set()
    assert StageRun.objects.get(pk=run.pk).heartbeat_at > old


def test_the_engine_imports_without_django():
    code = (
        "import sys, engine.registry, engine.architecture; "
        "sys.exit(1 if any(m == 'django' or m.startswith('django.') for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_the_registry_reads_without_importing_torch():
    code = (
        "import sys, engine.registry as r; "
        "assert [s.title for s in r.STAGES]; "
        "sys.exit(1 if 'torch' in sys.modules or 'transformers' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_every_registered_stage_resolves_to_its_run_function():
    import importlib

    from engine.registry import STAGES

    for stage in STAGES:
        module, _, function = stage.run.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), stage.name
        assert stage.soft_time_limit_s < stage.time_limit_s
