"""A stage run's attempts: recorded at each claim and end, taken over when their owner is
known gone, queued again when lost (or failed after DAY0_STAGE_MAX_ATTEMPTS, naming the
pattern), and the end of an attempt stored across a database blip."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from adaptation.models import AdaptationJob, JobStatus, StageRun, StageStatus, Worker
from adaptation.services import queueing, stage_runs
from adaptation.services.stage_runs import (
    lost_attempts_error,
    process_alive,
    stage_run_claim,
    stage_run_fail,
    stage_run_heartbeat,
    stage_run_lost,
    stage_run_requeue,
    stage_run_succeed,
    stage_runs_reap_stale,
)
from tests.factories import make_job

pytestmark = pytest.mark.django_db

LONG_AGO = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def sent(monkeypatch) -> list[dict]:
    """The stage messages sent (the broker is not under test here)."""
    messages: list[dict] = []
    monkeypatch.setattr(queueing, "stage_message_send", lambda **kw: messages.append(kw))
    return messages


def queued_fetch() -> tuple[AdaptationJob, StageRun]:
    job = make_job(statuses={"fetch": StageStatus.QUEUED})
    return job, job.stage_runs.get(stage="fetch")


def claimed(run: StageRun, *, worker_host: str = "cpu@box", pid: int = 1001) -> StageRun:
    got = stage_run_claim(stage_run_id=run.pk, worker_host=worker_host, pid=pid, oom_kills=0)
    assert got is not None
    return got


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.fixture
def live_pid():
    child = subprocess.Popen(["sleep", "60"])
    yield child.pid
    child.kill()
    child.wait()


def test_a_claim_and_a_success_record_the_attempt():
    _, run = queued_fetch()
    run = stage_run_claim(stage_run_id=run.pk, worker_host="cpu@box", pid=4242, oom_kills=3)
    assert run.attempts == [
        {
            "n": 1,
            "worker_host": "cpu@box",
            "pid": 4242,
            "started_at": run.started_at.isoformat(),
            "ended_at": None,
            "ended": None,
            "reason": "",
            "culprit": None,
            "oom_kills_at_start": 3,
        }
    ]
    assert stage_run_succeed(stage_run=run, result={"config": {}}, attempt=1) is True
    run.refresh_from_db()
    assert (run.attempts[0]["ended"], run.attempts[0]["ended_at"]) == (
        "succeeded",
        run.finished_at.isoformat(),
    )


def test_a_claim_records_this_process_by_default():
    _, run = queued_fetch()
    run = stage_run_claim(stage_run_id=run.pk, worker_host="cpu@box")
    assert (run.attempts[0]["pid"], run.attempts[0]["oom_kills_at_start"]) == (os.getpid(), None)


def test_a_failure_records_its_first_line_and_culprit():
    _, run = queued_fetch()
    run = claimed(run)
    assert stage_run_fail(
        stage_run=run, error="engine refused\nthe details", attempt=1, culprit="release"
    )
    run.refresh_from_db()
    entry = run.attempts[0]
    assert (entry["ended"], entry["reason"], entry["culprit"]) == (
        "failed",
        "engine refused",
        "release",
    )
    assert run.error == "engine refused\nthe details"


def test_a_transient_error_ends_the_attempt_and_the_next_claim_starts_another():
    _, run = queued_fetch()
    run = claimed(run)
    assert stage_run_requeue(stage_run=run, reason="the Hub answered 503", attempt=1)
    run = claimed(run, pid=1002)
    assert [(a["n"], a["pid"], a["ended"], a["reason"], a["culprit"]) for a in run.attempts] == [
        (1, 1001, "transient", "the Hub answered 503", "infrastructure"),
        (2, 1002, None, "", None),
    ]
    assert run.retries == 1


def test_a_late_write_of_a_replaced_attempt_changes_nothing(sent):
    _, run = queued_fetch()
    first = claimed(run)
    StageRun.objects.filter(pk=run.pk).update(heartbeat_at=LONG_AGO)
    assert stage_runs_reap_stale() == {"requeued": 1, "failed": 0}
    second = claimed(run, pid=1002)

    assert stage_run_heartbeat(stage_run_id=run.pk, attempt=1) is False
    assert stage_run_succeed(stage_run=first, result={"stale": True}, attempt=1) is False
    assert stage_run_fail(stage_run=first, error="late", attempt=1) is False
    assert stage_run_heartbeat(stage_run_id=run.pk, attempt=2) is True
    run.refresh_from_db()
    assert (run.status, run.result, run.error) == (StageStatus.RUNNING, None, "")
    assert stage_run_succeed(stage_run=second, result={"fresh": True}, attempt=2) is True
    run.refresh_from_db()
    assert (run.status, run.result) == (StageStatus.SUCCEEDED, {"fresh": True})


# --- the claim's takeover rules ----------------------------------------------------------------


def running_owned_by(pid: int, *, worker_host: str = "cpu@box") -> StageRun:
    """A running fetch whose attempt 1 is `worker_host`'s process `pid`, heartbeat fresh."""
    _, run = queued_fetch()
    run = claimed(run, worker_host=worker_host, pid=pid)
    StageRun.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now())
    return run


def test_a_redelivery_on_the_same_worker_takes_over_when_the_pid_is_gone():
    pid = dead_pid()
    run = running_owned_by(pid)
    taken = stage_run_claim(stage_run_id=run.pk, worker_host="cpu@box", pid=2002)
    assert taken is not None
    assert [(a["n"], a["pid"], a["ended"], a["reason"]) for a in taken.attempts] == [
        (1, pid, "worker-lost", f"its process {pid} on cpu@box was gone"),
        (2, 2002, None, ""),
    ]
    assert (taken.attempts[0]["culprit"], taken.retries) == ("infrastructure", 1)
    assert f"attempt 1 lost: its process {pid} on cpu@box was gone; lost 1 of 3" in taken.log


def test_a_live_pid_on_the_same_worker_keeps_its_run(live_pid):
    run = running_owned_by(live_pid)
    assert stage_run_claim(stage_run_id=run.pk, worker_host="cpu@box", pid=2002) is None


def test_a_pid_is_only_judged_on_its_own_worker_node():
    # Another node cannot see the owner's processes: a gone pid there proves nothing.
    run = running_owned_by(dead_pid())
    assert stage_run_claim(stage_run_id=run.pk, worker_host="cpu@other", pid=2002) is None


def test_this_process_does_not_take_over_its_own_attempt():
    run = running_owned_by(os.getpid())
    assert stage_run_claim(stage_run_id=run.pk, worker_host="cpu@box", pid=2002) is None


def test_a_redelivery_takes_over_when_the_owners_worker_went_stale(settings):
    settings.DAY0_WORKER_STALE_S = 60
    stale = timezone.now() - timedelta(seconds=61)
    Worker.objects.create(name="cpu@gone", hostname="gone", last_heartbeat_at=stale)
    Worker.objects.create(name="cpu@live", hostname="live")
    lost = running_owned_by(1001, worker_host="cpu@gone")
    kept = running_owned_by(1001, worker_host="cpu@live")

    taken = stage_run_claim(stage_run_id=lost.pk, worker_host="cpu@other", pid=2002)
    assert taken is not None and taken.worker_host == "cpu@other"
    assert taken.attempts[0]["reason"] == (
        f"the worker cpu@gone stopped sending heartbeats at {stale:%Y-%m-%d %H:%M:%S} UTC"
    )
    assert stage_run_claim(stage_run_id=kept.pk, worker_host="cpu@other", pid=2002) is None


def test_a_redelivery_takes_over_from_a_worker_that_stopped():
    stopped_at = datetime(2025, 3, 1, 8, 30, 0, tzinfo=UTC)
    Worker.objects.create(name="cpu@old", hostname="old", stopped_at=stopped_at)
    run = running_owned_by(1001, worker_host="cpu@old")
    taken = stage_run_claim(stage_run_id=run.pk, worker_host="cpu@new", pid=2002)
    assert taken.attempts[0]["reason"] == "the worker cpu@old stopped at 2025-03-01 08:30:00 UTC"


def test_a_takeover_that_exhausts_the_attempts_fails_the_stage(settings):
    settings.DAY0_STAGE_MAX_ATTEMPTS = 1
    pid = dead_pid()
    run = running_owned_by(pid)
    assert stage_run_claim(stage_run_id=run.pk, worker_host="cpu@box", pid=2002) is None
    run.refresh_from_db()
    assert run.status == StageStatus.FAILED
    assert run.error == (
        "Lost on 1 attempt: its worker process was gone each time. The culprit is the "
        "infrastructure (the worker or its machine), not the release.\n\n"
        f"attempt 1 on cpu@box (pid {pid}): its process {pid} on cpu@box was gone"
    )


def test_process_alive_tells_zombies_and_missing_processes(tmp_path, live_pid):
    assert process_alive(live_pid) is True
    assert process_alive(dead_pid()) is False
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "stat").write_text("77 (celery: worker) Z 1 77 77 0 -1")
    (tmp_path / "78").mkdir()
    (tmp_path / "78" / "stat").write_text("78 (a (b) c) S 1 78 78 0 -1")
    assert process_alive(77, proc=tmp_path) is False
    assert process_alive(78, proc=tmp_path) is True
    assert process_alive(79, proc=tmp_path) is False


# --- the reaper ------------------------------------------------------------------------------


def test_the_reaper_queues_a_lost_attempt_again_then_fails_after_the_limit(
    settings, sent, django_capture_on_commit_callbacks
):
    settings.DAY0_STAGE_MAX_ATTEMPTS = 3
    job, run = queued_fetch()
    outcomes = []
    for pid in (1001, 1002, 1003):
        claimed(run, pid=pid)
        StageRun.objects.filter(pk=run.pk).update(heartbeat_at=LONG_AGO)
        with django_capture_on_commit_callbacks(execute=True):
            outcomes.append(stage_runs_reap_stale())

    assert outcomes == [
        {"requeued": 1, "failed": 0},
        {"requeued": 1, "failed": 0},
        {"requeued": 0, "failed": 1},
    ]
    message = {"stage_run_id": run.pk, "stage": "fetch", "queue": "pool.cpu", "options": {}}
    assert sent == [message, message]
    run.refresh_from_db()
    stopped = "the worker cpu@box stopped sending heartbeats at 2025-01-01 12:00:00 UTC"
    assert run.status == StageStatus.FAILED
    assert run.error == (
        "Lost on 3 attempts: the worker stopped sending heartbeats each time. The culprit is "
        "the infrastructure (the worker or its machine), not the release.\n\n"
        f"attempt 1 on cpu@box (pid 1001): {stopped}\n"
        f"attempt 2 on cpu@box (pid 1002): {stopped}\n"
        f"attempt 3 on cpu@box (pid 1003): {stopped}"
    )
    assert [(a["n"], a["ended"], a["culprit"]) for a in run.attempts] == [
        (1, "worker-lost", "infrastructure"),
        (2, "worker-lost", "infrastructure"),
        (3, "worker-lost", "infrastructure"),
    ]
    assert run.retries == 2
    assert job.stage_runs.get(stage="analyze").status == StageStatus.SKIPPED
    assert AdaptationJob.objects.get(pk=job.pk).status == JobStatus.FAILED


def test_the_reaper_leaves_a_run_whose_heartbeat_is_fresh(sent):
    _, run = queued_fetch()
    claimed(run)
    assert stage_runs_reap_stale() == {"requeued": 0, "failed": 0}
    assert StageRun.objects.get(pk=run.pk).status == StageStatus.RUNNING


def test_a_run_claimed_before_attempts_were_kept_gets_its_entry_when_lost(sent):
    job = make_job(statuses={"fetch": StageStatus.RUNNING})
    run = job.stage_runs.get(stage="fetch")
    StageRun.objects.filter(pk=run.pk).update(heartbeat_at=LONG_AGO)
    assert stage_runs_reap_stale() == {"requeued": 1, "failed": 0}
    run.refresh_from_db()
    assert [(a["n"], a["worker_host"], a["pid"], a["ended"]) for a in run.attempts] == [
        (1, "worker-1", None, "worker-lost")
    ]
    assert run.attempts[0]["started_at"] == run.started_at.isoformat()


def test_a_loss_reported_for_another_process_changes_nothing(sent):
    _, run = queued_fetch()
    claimed(run, pid=1001)
    killed = "killed by signal 9 (SIGKILL)"
    assert stage_run_lost(stage_run_id=run.pk, reason=killed, worker_host="cpu@box", pid=999) == ""
    assert stage_run_lost(stage_run_id=run.pk, reason=killed, worker_host="cpu@x", pid=1001) == ""
    assert StageRun.objects.get(pk=run.pk).status == StageStatus.RUNNING
    assert (
        stage_run_lost(stage_run_id=run.pk, reason=killed, worker_host="cpu@box", pid=1001)
        == "requeued"
    )


# --- the pattern of lost attempts --------------------------------------------------------------


def lost(*reasons: str) -> list[dict]:
    return [
        {"n": n, "worker_host": "cpu@box", "pid": 100 + n, "ended": "worker-lost", "reason": r}
        for n, r in enumerate(reasons, start=1)
    ]


CULPRIT = "The culprit is the infrastructure (the worker or its machine), not the release."
SIGKILL = "killed by signal 9 (SIGKILL)"
OOM = "out of memory (cgroup limit): killed by signal 9 (SIGKILL); the cgroup's oom_kill count"


def test_the_pattern_of_sigkills_says_likely_out_of_memory():
    error = lost_attempts_error(lost(SIGKILL, SIGKILL, SIGKILL))
    assert error.splitlines()[0] == (
        f"Lost on 3 attempts, each killed by SIGKILL: likely out of memory. {CULPRIT}"
    )
    assert error.splitlines()[2:] == [
        f"attempt 1 on cpu@box (pid 101): {SIGKILL}",
        f"attempt 2 on cpu@box (pid 102): {SIGKILL}",
        f"attempt 3 on cpu@box (pid 103): {SIGKILL}",
    ]


@pytest.mark.parametrize(
    ("reasons", "head"),
    [
        (
            [f"{OOM} went from 0 to 1", f"{OOM} went from 1 to 2"],
            "Lost on 2 attempts, each out of memory (cgroup limit).",
        ),
        (
            ["killed by signal 11 (SIGSEGV)"] * 2,
            "Lost on 2 attempts, each killed by SIGSEGV.",
        ),
        (
            [SIGKILL, SIGKILL, "the worker cpu@box stopped sending heartbeats at 2025-01-01"],
            "Lost on 3 attempts: killed by SIGKILL (2), the worker stopped sending heartbeats (1).",
        ),
    ],
)
def test_the_pattern_of_lost_attempts(reasons, head):
    assert lost_attempts_error(lost(*reasons)).splitlines()[0] == f"{head} {CULPRIT}"


# --- database blips ------------------------------------------------------------------------------


@pytest.fixture
def no_waiting(monkeypatch) -> list[float]:
    """The retry waits, recorded instead of slept."""
    waits: list[float] = []
    monkeypatch.setattr(stage_runs.time, "sleep", waits.append)
    return waits


def terminate_this_connection() -> None:
    """End this thread's PostgreSQL backend from a second connection, as a database restart
    would: its next query fails with "terminating connection due to administrator command"."""
    import psycopg

    pid = connection.connection.info.backend_pid
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"] or None,
        port=db["PORT"] or None,
        user=db["USER"] or None,
        password=db["PASSWORD"] or None,
        dbname=db["NAME"],
        autocommit=True,
    ) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


needs_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="terminates a PostgreSQL backend"
)


@needs_postgresql
@pytest.mark.django_db(transaction=True)
def test_a_result_is_stored_across_a_dropped_connection(monkeypatch, sent, no_waiting):
    job, run = queued_fetch()
    run = claimed(run)
    apply = stage_runs.stage_results.apply
    dropped = []

    def drop_once_then_apply(*, run, result):
        if not dropped:
            dropped.append(connection.connection.info.backend_pid)
            terminate_this_connection()  # mid-transaction: the update is rolled back
        apply(run=run, result=result)

    monkeypatch.setattr(stage_runs.stage_results, "apply", drop_once_then_apply)
    result = {"config": {"model_type": "llama"}}
    assert stage_run_succeed(stage_run=run, result=result, attempt=1) is True

    assert len(dropped) == 1 and no_waiting == [0.5]
    run.refresh_from_db()
    assert (run.status, run.result) == (StageStatus.SUCCEEDED, result)
    assert [a["ended"] for a in run.attempts] == ["succeeded"]
    job.release.refresh_from_db()
    assert job.release.config == {"model_type": "llama"}
    analyze = job.stage_runs.get(stage="analyze")
    assert sent == [
        {"stage_run_id": analyze.pk, "stage": "analyze", "queue": "pool.cpu", "options": {}}
    ]
    assert connection.connection.info.backend_pid != dropped[0]


@needs_postgresql
@pytest.mark.django_db(transaction=True)
def test_a_retry_after_a_lost_commit_answer_does_not_store_twice(monkeypatch, sent, no_waiting):
    _, run = queued_fetch()
    run = claimed(run)
    succeed = stage_runs._succeed
    calls = []

    def commit_then_lose_the_answer(pk, **kwargs):
        calls.append(pk)
        done = succeed(pk, **kwargs)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return done

    monkeypatch.setattr(stage_runs, "_succeed", commit_then_lose_the_answer)
    assert stage_run_succeed(stage_run=run, result={"config": {}}, attempt=1) is True
    assert (len(calls), no_waiting) == (2, [0.5])
    assert len(sent) == 1  # the next stage was queued once


@needs_postgresql
@pytest.mark.django_db(transaction=True)
def test_a_failure_is_stored_across_a_dropped_connection(monkeypatch, sent, no_waiting):
    _, run = queued_fetch()
    run = claimed(run)
    terminate_this_connection()
    assert stage_run_fail(stage_run=run, error="config.json has no hidden_size", attempt=1)
    run.refresh_from_db()
    assert (run.status, run.error) == (StageStatus.FAILED, "config.json has no hidden_size")
    assert no_waiting == [0.5]


@pytest.mark.django_db(transaction=True)
def test_the_database_retry_gives_up_after_about_a_minute(monkeypatch, no_waiting):
    _, run = queued_fetch()
    run = claimed(run)

    def down(pk, **kwargs):
        raise OperationalError("could not connect to server")

    monkeypatch.setattr(stage_runs, "_succeed", down)
    with pytest.raises(OperationalError):
        stage_run_succeed(stage_run=run, result={}, attempt=1)
    assert no_waiting == [0.5, 1, 2, 4, 8, 16, 28.5] and sum(no_waiting) == 60


def test_inside_a_callers_transaction_there_is_one_try(monkeypatch, no_waiting):
    _, run = queued_fetch()
    calls = []

    def down(pk, **kwargs):
        calls.append(pk)
        raise OperationalError("terminating connection due to administrator command")

    monkeypatch.setattr(stage_runs, "_succeed", down)
    with pytest.raises(OperationalError), transaction.atomic():
        stage_run_succeed(stage_run=run, result={})
    assert (calls, no_waiting) == ([run.pk], [])


def test_a_takeover_before_the_main_process_saw_the_kill_gets_the_signal_as_its_reason():
    from adaptation.services.stage_runs import lost_attempts_error, stage_run_lost_reason

    job = make_job(stages=("fetch",), statuses={"fetch": StageStatus.FAILED})
    run = job.stage_runs.get()
    killed = "killed by signal 9 (SIGKILL)"
    attempts = [
        {"n": n, "worker_host": "cpu@h", "pid": pid, "ended": "worker-lost", "reason": reason,
         "culprit": "infrastructure"}
        for n, pid, reason in [
            (1, 11, killed),
            (2, 12, "its process 12 on cpu@h was gone"),
            (3, 13, killed),
        ]
    ]  # fmt: skip
    StageRun.objects.filter(pk=run.pk).update(
        attempts=attempts, error=lost_attempts_error(attempts)
    )
    assert stage_run_lost_reason(stage_run_id=run.pk, worker_host="cpu@h", pid=12, reason=killed)
    run.refresh_from_db()
    assert [a["reason"] for a in run.attempts] == [killed] * 3
    assert run.error.startswith("Lost on 3 attempts, each killed by SIGKILL: likely out of memory.")
    # Another worker's pid, or an attempt that did not end as a takeover: nothing changes.
    assert not stage_run_lost_reason(stage_run_id=run.pk, worker_host="cpu@h", pid=11, reason="x")
    assert not stage_run_lost_reason(stage_run_id=run.pk, worker_host="gpu@h", pid=12, reason="x")
