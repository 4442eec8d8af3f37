"""Fault injection on real Celery workers: a lost worker loses no work.

Everything runs on a PostgreSQL and a Redis of the test's own (`tests.e2e.faults.FaultLab`,
started once for this module on free ports in a temporary folder), so restarting or emptying
them never disturbs the services the rest of the suite uses. On them run day0's processes as
compose lays them out: a control worker on `day0` (the reaper), beat (the reaper every 2 s),
and a cpu pool worker with two pool processes, all with a heartbeat every second and a stage
stale after 10 s. The workers' stages are stubs (`tests.e2e.fault_app`) that sleep 3 s, kill
themselves, or wait at a gate; everything else (claim, heartbeat, lost-child request, reaper,
stored results, the next stage's message) is day0's own.

Jobs are created by day0's `job_create` in a subprocess on the lab's settings (its messages go
to the lab's Redis). The test reads the lab's database through the ORM on an extra connection
alias, `faults` (`lab_database`), beside the suite's own `default`, which it never touches:
no test database and no transaction of pytest-django is involved. Each job runs two stages,
`fetch` then `analyze`; the faults hit `fetch`, so a job that succeeds went on past its
lost stage.
"""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import UTC, datetime

import pytest

from adaptation.models import JobStatus, StageStatus
from tests.e2e.fault_app import stub_result
from tests.e2e.faults import (
    STAGES,
    FaultLab,
    attempt_started,
    jobs_finished,
    lab_database,
    missing_tools,
    running_attempt,
    stage_runs,
    succeeded_attempts,
)

MISSING = missing_tools()

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.faults,
    pytest.mark.skipif(bool(MISSING), reason=MISSING),
]

DB = "faults"
# How long lost work may wait before it runs again.
RESUME_WITHIN_S = 60
KILLED = "killed by signal 9 (SIGKILL)"


@pytest.fixture(scope="module")
def lab(django_db_blocker):
    with (
        FaultLab(stage_s=3, concurrency=2) as lab,
        lab_database(lab.postgres.url, DB),
        django_db_blocker.unblock(),
    ):
        yield lab


def wait_running(lab: FaultLab, job_id: int) -> dict:
    """The open attempt of the job's first stage, once its stub runs."""
    return lab.wait_until(
        lambda: running_attempt(job_id, "fetch", using=DB), timeout_s=60, what="fetch to run"
    )


def wait_finished(lab: FaultLab, job_ids: list[int], timeout_s: float) -> dict:
    jobs = lab.wait_until(
        lambda: jobs_finished(job_ids, using=DB), timeout_s=timeout_s, what=f"jobs {job_ids}"
    )
    return {job.pk: job for job in jobs}


def ends(run) -> list[tuple[str, str, str | None]]:
    return [(a["ended"], a["reason"], a["culprit"]) for a in run.attempts]


def check_succeeded_once(lab: FaultLab, job, repo_id: str) -> dict:
    """The job succeeded with each stage's stub result, every stage succeeding exactly once
    (its attempts, and the stubs that ran to their end). Returns the runs by stage."""
    assert job.status == JobStatus.SUCCEEDED, (job.pk, job.status)
    runs = stage_runs(job.pk, using=DB)
    for stage in STAGES:
        run = runs[stage]
        assert run.status == StageStatus.SUCCEEDED, (repo_id, stage, run.error)
        assert run.result == stub_result(stage, repo_id)
        assert succeeded_attempts(run) == 1, (repo_id, stage, run.attempts)
        assert lab.completions()[(repo_id, stage)] == 1, (repo_id, stage)
    return runs


def resume_s(run, killed_at: datetime) -> float:
    """Seconds from the kill to the start of the attempt that replaced the lost one."""
    return (attempt_started(run.attempts[1]) - killed_at).total_seconds()


def test_a_child_killed_mid_stage_is_resumed(lab):
    repo_id = "sleep/child-kill"
    [job_id] = lab.jobs_create([repo_id])
    pid = wait_running(lab, job_id)["pid"]
    killed_at = datetime.now(UTC)
    os.kill(pid, signal.SIGKILL)

    job = wait_finished(lab, [job_id], timeout_s=60)[job_id]
    runs = check_succeeded_once(lab, job, repo_id)
    fetch = runs["fetch"]
    assert ends(fetch) == [("worker-lost", KILLED, "infrastructure"), ("succeeded", "", None)]
    lost, resumed = fetch.attempts
    assert lost["pid"] == pid and resumed["pid"] != pid
    assert lost["worker_host"] == resumed["worker_host"] == lab.cpu_worker.node_name
    assert f"attempt 1 lost: {KILLED}; lost 1 of 3, queued again" in fetch.log
    assert ends(runs["analyze"]) == [("succeeded", "", None)]
    waited = resume_s(fetch, killed_at)
    print(f"child kill: resumed {waited:.1f} s after the kill")
    assert 0 < waited <= RESUME_WITHIN_S


def test_a_poison_stage_fails_after_three_attempts_and_spares_the_others(lab):
    poison, *others = ["poison/oom", "sleep/beside-poison-1", "sleep/beside-poison-2"]
    poison_id, *other_ids = lab.jobs_create([poison, *others])

    jobs = wait_finished(lab, [poison_id, *other_ids], timeout_s=90)
    runs = stage_runs(poison_id, using=DB)
    fetch = runs["fetch"]
    assert jobs[poison_id].status == JobStatus.FAILED
    assert fetch.status == StageStatus.FAILED
    assert [(a["ended"], a["culprit"]) for a in fetch.attempts] == [
        ("worker-lost", "infrastructure")
    ] * 3
    pids = [a["pid"] for a in fetch.attempts]
    assert len(set(pids)) == 3  # a new pool process each time
    host = lab.cpu_worker.node_name
    assert runs["analyze"].status == StageStatus.SKIPPED
    assert not [key for key in lab.completions() if key[0] == poison]
    for job_id, repo_id in zip(other_ids, others, strict=True):
        other = check_succeeded_once(lab, jobs[job_id], repo_id)
        assert [ends(other[stage]) for stage in STAGES] == [[("succeeded", "", None)]] * 2
    # A neighbouring pool process that comes free can take the run over from the dead pid
    # before the worker's main process notices its child died (up to ~2 s here); the main
    # process then corrects that attempt's reason to the signal (`stage_run_lost_reason`).
    lab.wait_until(
        lambda: all(
            a["reason"] == KILLED for a in stage_runs(poison_id, using=DB)["fetch"].attempts
        ),
        timeout_s=15,
        what="every lost attempt's reason to name the signal",
    )
    fetch = stage_runs(poison_id, using=DB)["fetch"]
    assert ends(fetch) == [("worker-lost", KILLED, "infrastructure")] * 3
    assert fetch.error == "\n".join([
        "Lost on 3 attempts, each killed by SIGKILL: likely out of memory. The culprit is the "
        "infrastructure (the worker or its machine), not the release.",
        "",
        *(f"attempt {n} on {host} (pid {pid}): {KILLED}" for n, pid in enumerate(pids, 1)),
    ])  # fmt: skip
    assert fetch.result is None


def test_a_postgresql_restart_as_a_stage_finishes_keeps_its_result(lab):
    repo_id = "gate/pg-restart"
    [job_id] = lab.jobs_create([repo_id])
    lab.wait_until(lambda: lab.gate_ready("pg-restart"), timeout_s=60, what="the gate")
    lab.postgres.restart()  # every connection is cut: the stage's, its heartbeat's, ours
    from django.db import connections

    connections[DB].close()
    lab.open_gate("pg-restart")  # the stage returns: its result is stored over a dead connection

    job = wait_finished(lab, [job_id], timeout_s=90)[job_id]
    runs = check_succeeded_once(lab, job, repo_id)
    fetch = runs["fetch"]
    assert ends(fetch) == [("succeeded", "", None)]
    log = lab.cpu_worker.log_text()
    # The write met the dropped connection and was tried again (not a vacuous pass).
    assert re.search(
        rf"Storing the result of stage run {fetch.pk}: the database connection failed", log
    ), lab.logs_tail()


def test_a_killed_worker_is_replaced_and_its_stage_resumed(lab):
    repo_id = "sleep/worker-kill"
    [job_id] = lab.jobs_create([repo_id])
    wait_running(lab, job_id)
    old = lab.cpu_worker
    killed_at = datetime.now(UTC)
    old.kill_group()  # the main process and its pool children at once
    lab.cpu_worker = lab.start_cpu_worker()

    job = wait_finished(lab, [job_id], timeout_s=90)[job_id]
    runs = check_succeeded_once(lab, job, repo_id)
    fetch = runs["fetch"]
    assert [(a["ended"], a["culprit"]) for a in fetch.attempts] == [
        ("worker-lost", "infrastructure"),
        ("succeeded", None),
    ]
    lost, resumed = fetch.attempts
    assert re.fullmatch(
        rf"the worker {re.escape(old.node_name)} stopped sending heartbeats at "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC",
        lost["reason"],
    ), lost["reason"]
    assert lost["worker_host"] == old.node_name
    assert resumed["worker_host"] == lab.cpu_worker.node_name != old.node_name
    waited = resume_s(fetch, killed_at)
    print(f"worker kill: resumed {waited:.1f} s after the kill")
    assert 0 < waited <= RESUME_WITHIN_S


# Long enough for every worker to lose its connection and retry; what matters is that the
# restarted Redis is empty.
REDIS_DOWN_S = 10


def test_redis_stopped_with_jobs_queued_loses_nothing_and_runs_nothing_twice(lab):
    repo_ids = [f"sleep/redis-{n}" for n in range(4)]
    job_ids = lab.jobs_create(repo_ids)
    wait_running(lab, job_ids[0])  # two stages running, the others queued
    queued = [j for j in job_ids if stage_runs(j, using=DB)["fetch"].status == StageStatus.QUEUED]
    lab.redis.stop()  # SHUTDOWN NOSAVE: every queued message is gone
    assert queued, "no job was left queued: the outage would lose no message"
    time.sleep(REDIS_DOWN_S)
    lab.redis.start()  # empty
    back_at = time.monotonic()

    jobs = wait_finished(lab, job_ids, timeout_s=RESUME_WITHIN_S + 40)
    finished_s = time.monotonic() - back_at
    print(f"redis stop: every job finished {finished_s:.1f} s after Redis came back")
    for job_id, repo_id in zip(job_ids, repo_ids, strict=True):
        check_succeeded_once(lab, jobs[job_id], repo_id)
