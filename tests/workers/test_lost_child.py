"""A pool child killed mid-stage, as the worker's main process learns it: the run_stage task's
`StageRequest.on_failure` gets Celery's own `WorkerLostError` (or `TimeLimitExceeded`),
records the attempt and queues the run again, then Celery rejects the message back to the
queue. Also the cgroup's OOM-kill count that tells an OOM kill from another SIGKILL."""

from __future__ import annotations

from unittest.mock import Mock

import pytest
from billiard.einfo import ExceptionInfo
from celery.contrib.testing.mocks import TaskMessage
from celery.exceptions import TimeLimitExceeded, WorkerLostError

from adaptation.models import StageRun, StageStatus
from adaptation.services import queueing
from adaptation.services.stage_runs import stage_run_claim
from tests.factories import make_job
from workers import cgroup, requests, tasks
from workers.requests import StageRequest, lost_child_reason

pytestmark = pytest.mark.django_db

KILLED = "Worker exited prematurely: signal 9 (SIGKILL) Job: 5."


@pytest.fixture
def sent(monkeypatch) -> list[dict]:
    messages: list[dict] = []
    monkeypatch.setattr(queueing, "stage_message_send", lambda **kw: messages.append(kw))
    return messages


def running_fetch(*, pid: int = 4242, oom_kills: int | None = 0) -> StageRun:
    job = make_job(statuses={"fetch": StageStatus.QUEUED})
    run = job.stage_runs.get(stage="fetch")
    claimed = stage_run_claim(
        stage_run_id=run.pk, worker_host="cpu@box", pid=pid, oom_kills=oom_kills
    )
    assert claimed is not None
    return claimed


def stage_request(run: StageRun, *, worker_pid: int | None = 4242) -> StageRequest:
    """The request of the run's message as the worker's main process holds it once its child
    `worker_pid` accepted it."""
    message = TaskMessage("day0.run_stage", args=[run.pk])
    request = StageRequest(
        message,
        hostname="cpu@box",
        app=tasks.run_stage.app,
        task=tasks.run_stage,
        on_ack=Mock(name="on_ack"),
        on_reject=Mock(name="on_reject"),
        eventer=Mock(name="eventer"),
    )
    if worker_pid is not None:
        request.on_accepted(pid=worker_pid, time_accepted=0.0)
    return request


def failure(exc: BaseException) -> ExceptionInfo:
    try:
        raise exc
    except type(exc):
        return ExceptionInfo()


def test_the_run_stage_task_uses_the_stage_request():
    assert tasks.run_stage.Request == "workers.requests:StageRequest"


def test_a_sigkilled_child_is_recorded_and_its_run_queued_again(
    monkeypatch, sent, django_capture_on_commit_callbacks
):
    monkeypatch.setattr(requests, "oom_kill_count", lambda: 0)
    run = running_fetch()
    request = stage_request(run)
    with django_capture_on_commit_callbacks(execute=True):
        request.on_failure(failure(WorkerLostError(KILLED)))

    run.refresh_from_db()
    assert (run.status, run.retries) == (StageStatus.QUEUED, 1)
    entry = run.attempts[0]
    assert (entry["ended"], entry["reason"], entry["culprit"], entry["pid"]) == (
        "worker-lost",
        "killed by signal 9 (SIGKILL)",
        "infrastructure",
        4242,
    )
    assert sent == [{"stage_run_id": run.pk, "stage": "fetch", "queue": "pool.cpu", "options": {}}]
    # Celery's own handling went on: the message goes back to the queue (reject_on_worker_lost).
    request._on_reject.assert_called_once()
    assert request._on_reject.call_args.args[2] is True  # requeue


def test_an_oom_kill_is_told_by_the_cgroups_count(monkeypatch, sent):
    monkeypatch.setattr(requests, "oom_kill_count", lambda: 4)
    run = running_fetch(oom_kills=3)
    stage_request(run).on_failure(failure(WorkerLostError(KILLED)))
    run.refresh_from_db()
    assert run.attempts[0]["reason"] == (
        "out of memory (cgroup limit): killed by signal 9 (SIGKILL); the cgroup's oom_kill "
        "count went from 3 to 4"
    )


def test_the_last_lost_attempt_fails_the_stage_naming_the_signal(settings, monkeypatch, sent):
    settings.DAY0_STAGE_MAX_ATTEMPTS = 2
    monkeypatch.setattr(requests, "oom_kill_count", lambda: None)
    run = running_fetch(pid=11)
    stage_request(run, worker_pid=11).on_failure(failure(WorkerLostError(KILLED)))
    stage_run_claim(stage_run_id=run.pk, worker_host="cpu@box", pid=12)
    stage_request(run, worker_pid=12).on_failure(failure(WorkerLostError(KILLED)))

    run.refresh_from_db()
    assert run.status == StageStatus.FAILED
    assert run.error.splitlines()[0] == (
        "Lost on 2 attempts, each killed by SIGKILL: likely out of memory. The culprit is the "
        "infrastructure (the worker or its machine), not the release."
    )
    assert run.job.stage_runs.get(stage="analyze").status == StageStatus.SKIPPED


def test_a_loss_of_another_child_or_of_a_finished_attempt_changes_nothing(monkeypatch, sent):
    monkeypatch.setattr(requests, "oom_kill_count", lambda: 0)
    run = running_fetch(pid=4242)
    # A child that never accepted the message, and a child other than the attempt's.
    assert stage_request(run, worker_pid=None).record_lost_child(KILLED) == ""
    assert stage_request(run, worker_pid=999).record_lost_child(KILLED) == ""
    assert StageRun.objects.get(pk=run.pk).status == StageStatus.RUNNING
    # Queued again by the first report: a second report of the same child finds it done.
    assert stage_request(run).record_lost_child(KILLED) == "requeued"
    assert stage_request(run).record_lost_child(KILLED) == ""


def test_the_hard_time_limit_fails_the_stage(monkeypatch):
    run = running_fetch()
    stage_request(run).on_failure(failure(TimeLimitExceeded(180)))
    run.refresh_from_db()
    assert (run.status, run.error) == (
        StageStatus.FAILED,
        "fetch ran past its hard time limit of 180 s and was killed.",
    )
    assert (run.attempts[0]["ended"], run.attempts[0]["culprit"]) == (
        "time-limit",
        "infrastructure",
    )


@pytest.mark.parametrize(
    ("message", "at_start", "now", "reason"),
    [
        (KILLED, 0, 0, "killed by signal 9 (SIGKILL)"),
        (KILLED, None, 5, "killed by signal 9 (SIGKILL)"),
        (
            "Worker exited prematurely: signal 11 (SIGSEGV) Job: 2.",
            0,
            0,
            "killed by signal 11 (SIGSEGV)",
        ),
        ("Worker exited prematurely: exitcode 70 Job: 3.", 0, 0, "its process exited with code 70"),
        (
            KILLED,
            0,
            1,
            "out of memory (cgroup limit): killed by signal 9 (SIGKILL); the cgroup's oom_kill "
            "count went from 0 to 1",
        ),
    ],
)
def test_lost_child_reason(message, at_start, now, reason):
    assert lost_child_reason(message, oom_kills_at_start=at_start, oom_kills_now=now) == reason


# --- the cgroup's OOM-kill count -------------------------------------------------------------


def test_the_oom_kill_count_of_a_cgroup_v2(tmp_path):
    own = tmp_path / "system.slice" / "day0-worker.service"
    own.mkdir(parents=True)
    (own / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\n")
    (tmp_path / "memory.events").write_text("oom_kill 9\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/system.slice/day0-worker.service\n")
    assert cgroup.oom_kill_count(proc_self_cgroup=proc, root=tmp_path) == 2


def test_the_oom_kill_count_inside_a_container(tmp_path):
    (tmp_path / "memory.events").write_text("oom 1\noom_kill 1\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/\n")
    assert cgroup.oom_kill_count(proc_self_cgroup=proc, root=tmp_path) == 1


def test_the_oom_kill_count_of_a_cgroup_v1(tmp_path):
    memory = tmp_path / "memory" / "docker" / "abc"
    memory.mkdir(parents=True)
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
    proc = tmp_path / "cgroup"
    proc.write_text("12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    assert cgroup.oom_kill_count(proc_self_cgroup=proc, root=tmp_path) == 7


def test_no_oom_kill_count_without_a_memory_cgroup(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/user.slice\n")
    assert cgroup.oom_kill_count(proc_self_cgroup=proc, root=tmp_path) is None
    assert cgroup.oom_kill_count(proc_self_cgroup=tmp_path / "missing", root=tmp_path) is None
