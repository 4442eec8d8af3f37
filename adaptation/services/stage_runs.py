"""Stage attempts as workers run them: claimed with a conditional update (one delivery of a
message runs it), heartbeats, success, failure, transient requeue, lost attempts, and the
periodic reaper and re-sender.

Each time a worker runs a row is one entry of `StageRun.attempts` (`n`, worker, pid, start,
end, why it ended, the culprit). An attempt lost to the infrastructure (its process killed,
its worker gone) is queued again on the same row, until `DAY0_STAGE_MAX_ATTEMPTS` of them are
lost; then the stage fails naming the pattern (docs/operations.md, "Lost work and retries").
The writes that end an attempt take its number (`attempt`): a worker that was taken for lost
and carried on cannot overwrite the attempt that replaced it.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from adaptation.models import (
    ACTIVE_STAGE_STATUSES,
    AdaptationJob,
    AttemptEnd,
    Culprit,
    FailureClass,
    NotificationEvent,
    StageRun,
    StageStatus,
    Worker,
)
from adaptation.notifications.services import notifications_emit_safely
from adaptation.selectors.jobs import job_current_stage_runs
from adaptation.selectors.workers import live_cutoff
from adaptation.services import queueing, stage_results
from adaptation.services.jobs import job_refresh_status, job_skip_pending_after
from adaptation.services.limitations import limitations_sync_safely
from adaptation.services.queueing import job_stage_options, stage_run_enqueue

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Waits between tries of a write that ends an attempt, across a database restart or failover:
# about a minute in all, then the error propagates.
DB_RETRY_DELAYS_S: tuple[float, ...] = (0.5, 1, 2, 4, 8, 16, 28.5)

# What an attempt's reason keeps (the run's error keeps the whole text).
_REASON_CHARS = 500


# --- attempts -------------------------------------------------------------------------------


# A run's own send runs right after its transaction commits: the reaper leaves it this long.
UNSENT_GRACE_S = 5


def attempt_current(run: StageRun) -> dict[str, Any] | None:
    """The run's latest attempt (`StageRun.attempts[-1]`); None before its first claim."""
    attempts = run.attempts or []
    return attempts[-1] if attempts else None


def attempt_number(run: StageRun) -> int:
    """The number `n` of the run's latest attempt; 0 before its first claim."""
    current = attempt_current(run)
    return int(current.get("n") or len(run.attempts)) if current else 0


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def _attempt_opened(
    row: StageRun, *, worker_host: str, pid: int | None, oom_kills: int | None, now: datetime
) -> list[dict[str, Any]]:
    """`row`'s attempts with a new one started now by `worker_host`'s process `pid`."""
    attempts = [dict(entry) for entry in row.attempts or []]
    attempts.append(
        {
            "n": attempt_number(row) + 1,
            "worker_host": worker_host,
            "pid": pid,
            "started_at": _iso(now),
            "ended_at": None,
            "ended": None,
            "reason": "",
            "culprit": None,
            "oom_kills_at_start": oom_kills,
        }
    )
    return attempts


def _attempt_closed(
    row: StageRun, *, ended: str, reason: str, culprit: str | None, now: datetime
) -> list[dict[str, Any]]:
    """`row`'s attempts with the running one ended now. A running row claimed before attempts
    were kept gets its entry made from the row."""
    attempts = [dict(entry) for entry in row.attempts or []]
    if not attempts or attempts[-1].get("ended"):
        attempts.append(
            {
                "n": attempt_number(row) + 1,
                "worker_host": row.worker_host,
                "pid": None,
                "started_at": _iso(row.started_at),
                "oom_kills_at_start": None,
            }
        )
    attempts[-1].update(
        ended_at=_iso(now),
        ended=str(ended),
        reason=reason.strip().splitlines()[0][:_REASON_CHARS] if reason.strip() else "",
        culprit=str(culprit) if culprit else None,
    )
    return attempts


def _locked(stage_run_id: int) -> StageRun | None:
    """The run, locked until the transaction ends (PostgreSQL), with its job, release and
    pool."""
    return (
        StageRun.objects.select_for_update(of=("self",))
        .select_related("job__release", "job__pool")
        .filter(pk=stage_run_id)
        .first()
    )


def _locked_attempt(stage_run_id: int, attempt: int | None) -> StageRun | None:
    """The run locked (`_locked`) while it is on attempt number `attempt` (None: any); None
    when it is gone or has moved on to another attempt."""
    row = _locked(stage_run_id)
    if row is None or (attempt is not None and attempt_number(row) != attempt):
        return None
    return row


def _ended_by(row: StageRun, attempt: int | None, ended: str) -> bool:
    """Whether attempt `attempt` already ended `row` as `ended`: a retried write whose first
    commit went through but whose answer was lost."""
    current = attempt_current(row) or {}
    return attempt is not None and current.get("ended") == ended


def _update_read(row: StageRun, **fields: Any) -> int:
    """Update `row` only if its status and start are still what was read (a conditional
    update: on SQLite, which has no row locks, the first writer wins)."""
    return StageRun.objects.filter(pk=row.pk, status=row.status, started_at=row.started_at).update(
        **fields
    )


def _surviving_db_blips(write: Callable[[], T], *, what: str) -> T:
    """`write()`, tried again after a dropped database connection (a restart, a failover):
    the connection is closed, so the next try opens a new one, after 0.5, 1, 2, 4... s
    (`DB_RETRY_DELAYS_S`, about a minute in all). `write` must be idempotent. Inside a
    caller's transaction it is tried once: a retry could not redo that transaction's work."""
    if connection.in_atomic_block:
        return write()
    for delay in DB_RETRY_DELAYS_S:
        try:
            return write()
        except (OperationalError, InterfaceError) as exc:
            logger.warning(
                "%s: the database connection failed (%s); retrying in %g s", what, exc, delay
            )
            try:
                connection.close()
            except Exception:  # a connection that is already gone may complain on close
                logger.debug("Closing the broken connection failed", exc_info=True)
            time.sleep(delay)
    return write()


# --- who is gone ----------------------------------------------------------------------------


def process_alive(pid: int, *, proc: Path = Path("/proc")) -> bool:
    """Whether process `pid` runs on this host: /proc/<pid> is there and not a zombie (killed,
    not yet reaped by its parent). Without /proc, whether signal 0 reaches it."""
    if not proc.is_dir():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()
    return bool(fields) and fields[0] not in ("Z", "X")


def _utc(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC" if moment else "an unknown time"


def _heartbeats_stopped(worker_host: str, last: datetime | None) -> str:
    worker = worker_host or "on an unknown host"
    return f"the worker {worker} stopped sending heartbeats at {_utc(last)}"


def _owner_gone(row: StageRun, *, claimer: str, now: datetime) -> str:
    """Why the process running `row` is known to be gone, or "" while it may be alive: its
    heartbeat went stale; or it ran on `claimer` (this worker node: this host) and its pid is
    gone; or its worker's own heartbeat (`Worker`) went stale or the worker stopped."""
    host = row.worker_host
    if row.heartbeat_at is None or row.heartbeat_at < _stale_cutoff(now):
        return _heartbeats_stopped(host, row.heartbeat_at)
    current = attempt_current(row)
    pid = current.get("pid") if current and not current.get("ended") else None
    mine = host and host == claimer and isinstance(pid, int) and pid != os.getpid()
    if mine and not process_alive(pid):
        return f"its process {pid} on {host} was gone"
    worker = Worker.objects.filter(name=host).first() if host else None
    if worker is not None:
        if worker.stopped_at is not None:
            return f"the worker {host} stopped at {_utc(worker.stopped_at)}"
        if worker.last_heartbeat_at < live_cutoff(now):
            return _heartbeats_stopped(host, worker.last_heartbeat_at)
    return ""


_SIGNAL = re.compile(r"killed by signal \d+ \((SIG\w+)\)")


def _loss_kind(reason: str) -> str:
    """The kind of loss an attempt's reason tells, for the pattern of a stage's losses."""
    if reason.startswith("out of memory"):
        return "out of memory (cgroup limit)"
    signal = _SIGNAL.search(reason)
    if signal:
        return f"killed by {signal.group(1)}"
    if "stopped sending heartbeats" in reason or re.match(r"the worker \S+ stopped at", reason):
        return "the worker stopped sending heartbeats"
    if " was gone" in reason:
        return "its process was gone"
    return reason


def lost_attempts_error(attempts: list[dict[str, Any]]) -> str:
    """The error of a stage failed after its lost attempts: the pattern first ("Lost on 3
    attempts, each killed by SIGKILL: likely out of memory."), whose fault it is, then one line
    per lost attempt."""
    lost = [entry for entry in attempts if entry.get("ended") == AttemptEnd.WORKER_LOST]
    count = f"{len(lost)} attempt{'s' if len(lost) != 1 else ''}"
    kinds = [_loss_kind(str(entry.get("reason") or "")) for entry in lost]
    if len(set(kinds)) == 1:
        kind = kinds[0]
        if kind == "killed by SIGKILL":
            head = f"Lost on {count}, each killed by SIGKILL: likely out of memory."
        elif kind.startswith("killed by") or kind.startswith("out of memory"):
            head = f"Lost on {count}, each {kind}."
        elif kind == "the worker stopped sending heartbeats":
            head = f"Lost on {count}: the worker stopped sending heartbeats each time."
        elif kind == "its process was gone":
            head = f"Lost on {count}: its worker process was gone each time."
        else:
            head = f"Lost on {count}, each: {kind}."
    else:
        tally = ", ".join(f"{kind} ({n})" for kind, n in Counter(kinds).items())
        head = f"Lost on {count}: {tally}."
    lines = [
        f"attempt {entry.get('n')} on {entry.get('worker_host') or 'an unknown worker'}"
        + (f" (pid {entry['pid']})" if entry.get("pid") else "")
        + f": {entry.get('reason')}"
        for entry in lost
    ]
    culprit = "The culprit is the infrastructure (the worker or its machine), not the release."
    return "\n".join([f"{head} {culprit}", "", *lines])


# --- claim and heartbeat --------------------------------------------------------------------


def stage_run_claim(
    *,
    stage_run_id: int,
    worker_host: str,
    task_id: str = "",
    pid: int | None = None,
    oom_kills: int | None = None,
) -> StageRun | None:
    """Move a queued run to running for this worker and start its next attempt (by process
    `pid`, default this one; `oom_kills`: the cgroup's OOM-kill count now, for telling an OOM
    kill later). None when another delivery (or the reaper) got there first: the row is
    locked, and the update is conditional on what was read.

    A run still marked running is taken over when its owner is known gone (`_owner_gone`:
    its heartbeat is stale, its process on this worker node is gone, or its worker's own
    heartbeat is stale): that is its message redelivered after the worker was lost
    (`acks_late` + `reject_on_worker_lost`). The owner's attempt is recorded as lost; when
    that makes `DAY0_STAGE_MAX_ATTEMPTS` lost attempts, the stage fails instead (None).
    """
    worker_host = worker_host[:255]
    pid = os.getpid() if pid is None else pid
    now = timezone.now()
    with transaction.atomic():
        row = _locked(stage_run_id)
        if row is None or row.status not in ACTIVE_STAGE_STATUSES:
            return None
        extra: dict[str, Any] = {}
        if row.status == StageStatus.RUNNING:
            gone = _owner_gone(row, claimer=worker_host, now=now)
            if not gone:
                return None
            row.attempts, row.log, exhausted = _loss(row, reason=gone, now=now)
            if exhausted:
                error = lost_attempts_error(row.attempts)
                _fail_row(
                    row,
                    error=error,
                    log=row.log,
                    attempts=row.attempts,
                    now=now,
                    failure_class=FailureClass.INFRASTRUCTURE,
                )
                logger.warning("Stage run %s failed: %s", row.pk, error.splitlines()[0])
                return None
            extra.update(retries=F("retries") + 1, log=row.log)
        attempts = _attempt_opened(
            row, worker_host=worker_host, pid=pid, oom_kills=oom_kills, now=now
        )
        claimed = _update_read(
            row,
            status=StageStatus.RUNNING,
            started_at=now,
            heartbeat_at=now,
            worker_host=worker_host,
            celery_task_id=task_id[:64],
            attempts=attempts,
            **extra,
        )
        if not claimed:
            return None
    return StageRun.objects.select_related("job__release", "job__pool").get(pk=stage_run_id)


def stage_run_heartbeat(*, stage_run_id: int, attempt: int | None = None) -> bool:
    """Record that the worker still runs this stage (its attempt number `attempt`; None: any).
    False when it is no longer running, or runs another attempt now."""
    runs = StageRun.objects.filter(pk=stage_run_id, status=StageStatus.RUNNING)
    if attempt is not None:
        row = runs.only("pk", "attempts", "started_at").first()
        if row is None or attempt_number(row) != attempt:
            return False
        runs = runs.filter(started_at=row.started_at)
    return bool(runs.update(heartbeat_at=timezone.now()))


# --- ends of an attempt ---------------------------------------------------------------------


def stage_run_succeed(
    *, stage_run: StageRun, result: dict[str, Any], log: str = "", attempt: int | None = None
) -> bool:
    """Store a stage's result, apply it to the domain rows, bring the stage's known
    limitations in line with its findings (`limitations_sync_safely`: never raises), and
    queue the next stage or finish the job.

    `attempt`: the number of the attempt that ran it (`attempt_number` of the claimed run;
    None: whichever is running). Does nothing (False) when the run is no longer running that
    attempt (cancelled, or taken for lost meanwhile). A database blip is survived
    (`_surviving_db_blips`): a retry after a commit whose answer was lost finds the run
    succeeded by this attempt and returns True without doing it twice.
    """
    return _surviving_db_blips(
        lambda: _succeed(stage_run.pk, result=result, log=log, attempt=attempt),
        what=f"Storing the result of stage run {stage_run.pk}",
    )


def _succeed(pk: int, *, result: dict[str, Any], log: str, attempt: int | None) -> bool:
    now = timezone.now()
    with transaction.atomic():
        row = _locked_attempt(pk, attempt)
        if row is None:
            return False
        if row.status != StageStatus.RUNNING:
            return _ended_by(row, attempt, AttemptEnd.SUCCEEDED)
        attempts = _attempt_closed(
            row, ended=AttemptEnd.SUCCEEDED, reason="", culprit=None, now=now
        )
        if not _update_read(
            row,
            status=StageStatus.SUCCEEDED,
            finished_at=now,
            result=result,
            log=log,
            attempts=attempts,
        ):
            return False
        stage_results.apply(run=row, result=result)
        limitations_sync_safely(stage_run=row)
        job = AdaptationJob.objects.select_for_update().get(pk=row.job_id)
        following = [run for run in job_current_stage_runs(job) if run.position > row.position]
        if following and following[0].status == StageStatus.PENDING:
            stage_run_enqueue(following[0])
        job_refresh_status(job=job)
    return True


def stage_run_fail(
    *,
    stage_run: StageRun,
    error: str,
    log: str = "",
    result: dict[str, Any] | None = None,
    attempt: int | None = None,
    ended: str = AttemptEnd.FAILED,
    culprit: str | None = None,
    failure_class: str | None = None,
) -> bool:
    """Fail a stage with its reason; the job stops and its later stages are skipped, except
    `release_notes`, which is queued to write notes saying what blocked
    (`job_skip_pending_after`).

    `failure_class` (`FailureClass`: "infrastructure" or "release") is stored on the run;
    None: the culprit's (`culprit`), release when there is none. `result` is what the stage
    measured before failing (a precision failure's metrics): it is stored and applied to the
    domain rows like a success's, and for a release failure its findings raise or resolve the
    stage's known limitations; an infrastructure failure (a time limit that stopped a sweep)
    and a failure without a result leave them as they are.
    The running attempt (`attempt`, as for `stage_run_succeed`) ends as `ended` ("failed",
    "time-limit", "transient") with the error's first line and `culprit`. False when nothing
    changed; True also when a retry after a lost commit answer finds it done by this attempt.
    """
    failure_class = failure_class or culprit or FailureClass.RELEASE
    return _surviving_db_blips(
        lambda: _fail(
            stage_run.pk,
            error=error,
            log=log,
            result=result,
            attempt=attempt,
            ended=ended,
            culprit=culprit,
            failure_class=failure_class,
        ),
        what=f"Storing the failure of stage run {stage_run.pk}",
    )


def _fail(
    pk: int,
    *,
    error: str,
    log: str,
    result: dict[str, Any] | None,
    attempt: int | None,
    ended: str,
    culprit: str | None,
    failure_class: str,
) -> bool:
    now = timezone.now()
    with transaction.atomic():
        row = _locked_attempt(pk, attempt)
        if row is None:
            return False
        if row.status not in ACTIVE_STAGE_STATUSES:
            return row.status == StageStatus.FAILED and _ended_by(row, attempt, ended)
        attempts = row.attempts
        if row.status == StageStatus.RUNNING:
            attempts = _attempt_closed(row, ended=ended, reason=error, culprit=culprit, now=now)
        return _fail_row(
            row,
            error=error,
            log=log,
            result=result,
            attempts=attempts,
            now=now,
            failure_class=failure_class,
        )


def _fail_row(
    row: StageRun,
    *,
    error: str,
    log: str,
    attempts: list[dict[str, Any]],
    now: datetime,
    failure_class: str,
    result: dict[str, Any] | None = None,
) -> bool:
    """Fail the locked `row` (inside the caller's transaction) as `failure_class`'s fault:
    store it, apply a result (and for a release failure sync its known limitations), skip the
    job's later stages but queue its release notes, notify, refresh the job. False when it
    changed meanwhile."""
    if not _update_read(
        row,
        status=StageStatus.FAILED,
        finished_at=now,
        error=error,
        log=log,
        result=result,
        attempts=attempts,
        failure_class=failure_class,
    ):
        return False
    if result is not None:
        stage_results.apply(run=row, result=result)
        if failure_class == FailureClass.RELEASE:
            # Only the release's own faults are its known limitations (docs/limitations.md).
            limitations_sync_safely(stage_run=row)
    job = AdaptationJob.objects.select_for_update().get(pk=row.job_id)
    job_skip_pending_after(job=job, position=row.position)
    notifications_emit_safely(event=NotificationEvent.STAGE_FAILED, job=job, stage_run=row)
    job_refresh_status(job=job)
    return True


def stage_run_requeue(
    *, stage_run: StageRun, reason: str, log: str = "", attempt: int | None = None
) -> bool:
    """Put a running stage back in the queue after a transient error (the task retries it):
    its attempt ends as "transient", culprit the infrastructure. False when it was no longer
    running (that attempt)."""
    return _surviving_db_blips(
        lambda: _requeue(stage_run.pk, reason=reason, log=log, attempt=attempt),
        what=f"Queueing stage run {stage_run.pk} again",
    )


def _requeue(pk: int, *, reason: str, log: str, attempt: int | None) -> bool:
    now = timezone.now()
    line = f"{now:%H:%M:%S} retrying: {reason}"
    with transaction.atomic():
        row = _locked_attempt(pk, attempt)
        if row is None:
            return False
        if row.status != StageStatus.RUNNING:
            return _ended_by(row, attempt, AttemptEnd.TRANSIENT)
        attempts = _attempt_closed(
            row, ended=AttemptEnd.TRANSIENT, reason=reason, culprit=Culprit.INFRASTRUCTURE, now=now
        )
        return bool(
            _update_read(
                row,
                status=StageStatus.QUEUED,
                queued_at=now,
                retries=F("retries") + 1,
                log=f"{log}\n{line}".strip(),
                attempts=attempts,
            )
        )


def stage_run_attempt_end(
    *, stage_run_id: int, attempt: int, ended: str, reason: str = "", culprit: str | None = None
) -> bool:
    """Record how attempt `attempt` ended when its run's status was already changed by
    someone else (cancelled while it ran): only while that attempt is still open. False
    otherwise."""
    now = timezone.now()
    with transaction.atomic():
        row = _locked(stage_run_id)
        current = attempt_current(row) if row is not None else None
        if row is None or current is None or current.get("n") != attempt or current.get("ended"):
            return False
        attempts = _attempt_closed(row, ended=ended, reason=reason, culprit=culprit, now=now)
        return bool(_update_read(row, attempts=attempts))


# --- lost attempts ----------------------------------------------------------------------------


def _lost_count(attempts: list[dict[str, Any]]) -> int:
    return sum(1 for entry in attempts if entry.get("ended") == AttemptEnd.WORKER_LOST)


def _loss(row: StageRun, *, reason: str, now: datetime) -> tuple[list[dict[str, Any]], str, bool]:
    """The running `row`'s attempts with the running one ended as lost to the infrastructure
    ("worker-lost"), its log with a line saying so, and whether that makes
    `DAY0_STAGE_MAX_ATTEMPTS` lost attempts."""
    attempts = _attempt_closed(
        row,
        ended=AttemptEnd.WORKER_LOST,
        reason=reason,
        culprit=Culprit.INFRASTRUCTURE,
        now=now,
    )
    lost = _lost_count(attempts)
    exhausted = lost >= settings.DAY0_STAGE_MAX_ATTEMPTS
    line = f"{now:%H:%M:%S} attempt {attempts[-1]['n']} lost: {reason}; " + (
        "no attempt left"
        if exhausted
        else f"lost {lost} of {settings.DAY0_STAGE_MAX_ATTEMPTS}, queued again"
    )
    return attempts, f"{row.log}\n{line}".strip(), exhausted


def stage_run_lost_reason(*, stage_run_id: int, worker_host: str, pid: int, reason: str) -> bool:
    """Put the real `reason` (the signal the worker's main process saw) on an attempt already
    recorded lost as "its process … was gone": a neighbouring pool process can take the run
    over before the main process notices its dead child. When the stage has failed on its lost
    attempts, its error is written again from the corrected attempts. True when one changed."""
    with transaction.atomic():
        row = _locked(stage_run_id)
        if row is None:
            return False
        attempts = [dict(entry) for entry in row.attempts or []]
        for entry in attempts:
            if (
                entry.get("ended") == AttemptEnd.WORKER_LOST
                and entry.get("worker_host") == worker_host
                and entry.get("pid") == pid
                and " was gone" in str(entry.get("reason") or "")
            ):
                entry["reason"] = reason[:_REASON_CHARS]
                break
        else:
            return False
        fields: dict[str, Any] = {"attempts": attempts}
        if row.status == StageStatus.FAILED and row.error.startswith("Lost on "):
            fields["error"] = lost_attempts_error(attempts)
        return bool(StageRun.objects.filter(pk=row.pk).update(**fields))


def stage_run_lost(
    *,
    stage_run_id: int,
    reason: str,
    worker_host: str | None = None,
    pid: int | None = None,
    stale_before: datetime | None = None,
) -> str:
    """The running attempt of a run was lost to the infrastructure (its process killed, its
    worker gone): record it as "worker-lost" with `reason` (culprit: the infrastructure) and
    queue the run again at once, with a new message; once `DAY0_STAGE_MAX_ATTEMPTS` attempts
    are lost, fail it instead, naming the pattern (`lost_attempts_error`).

    Only when the running attempt is `worker_host`'s process `pid` (given: the worker's main
    process telling of its child) and its heartbeat is older than `stale_before` (given: the
    reaper). Returns "requeued", "failed" or "" (nothing done: that attempt is not running).
    """
    now = timezone.now()
    with transaction.atomic():
        row = _locked(stage_run_id)
        if row is None or row.status != StageStatus.RUNNING:
            return ""
        current = attempt_current(row) or {}
        if (worker_host is not None or pid is not None) and (
            current.get("ended")
            or (worker_host is not None and row.worker_host != worker_host)
            or (pid is not None and current.get("pid") != pid)
        ):
            return ""  # not that process's attempt (any more)
        if stale_before is not None and not (row.heartbeat_at and row.heartbeat_at < stale_before):
            return ""
        attempts, log, exhausted = _loss(row, reason=reason, now=now)
        if exhausted:
            error = lost_attempts_error(attempts)
            if not _fail_row(
                row,
                error=error,
                log=log,
                attempts=attempts,
                now=now,
                failure_class=FailureClass.INFRASTRUCTURE,
            ):
                return ""
            logger.warning("Stage run %s failed: %s", stage_run_id, error.splitlines()[0])
            return "failed"
        if not _update_read(
            row,
            status=StageStatus.QUEUED,
            queued_at=now,
            sent_at=None,
            retries=F("retries") + 1,
            log=log,
            attempts=attempts,
        ):
            return ""
        run_id, stage, queue = row.pk, row.stage, row.job.pool.queue
        options = job_stage_options(row.job, row.stage)
        # A broker outage must not undo the requeue: an unsent message is sent again later.
        transaction.on_commit(
            lambda: queueing.stage_message_deliver(
                stage_run_id=run_id, stage=stage, queue=queue, options=options
            )
        )
    logger.warning("Stage run %s: an attempt was lost (%s); queued again", stage_run_id, reason)
    return "requeued"


def _stale_cutoff(now: datetime) -> datetime:
    return now - timedelta(seconds=settings.DAY0_STALE_HEARTBEAT_S)


def stage_runs_reap_stale(*, now: datetime | None = None) -> dict[str, int]:
    """Running stages whose heartbeat is older than `DAY0_STALE_HEARTBEAT_S` lost their
    worker: each is queued again, or failed once it has lost `DAY0_STAGE_MAX_ATTEMPTS`
    attempts (`stage_run_lost`). Returns how many of each ({"requeued", "failed"})."""
    now = now or timezone.now()
    cutoff = _stale_cutoff(now)
    outcomes = {"requeued": 0, "failed": 0}
    stale = StageRun.objects.filter(status=StageStatus.RUNNING, heartbeat_at__lt=cutoff)
    for run in stale.only("pk", "worker_host", "heartbeat_at"):
        outcome = stage_run_lost(
            stage_run_id=run.pk,
            reason=_heartbeats_stopped(run.worker_host, run.heartbeat_at),
            stale_before=cutoff,
        )
        if outcome:
            outcomes[outcome] += 1
    return outcomes


def stage_runs_resend_queued(*, now: datetime | None = None, broker_lost: bool = False) -> int:
    """Send again the messages the broker does not hold. Returns how many were sent.

    - A run whose send failed (`sent_at` empty: the broker was down) is sent again on every
      call, once it has been queued `UNSENT_GRACE_S` (its own send may still be under way).
    - With `broker_lost` (the broker lost what it held: a restart without persistence, a
      FLUSHALL; `workers.broker_watch`), every queued run is sent again.
    - A run queued longer than `DAY0_RESEND_QUEUED_S` is sent again too, as a safety net for a
      message lost some other way.

    A duplicate is harmless: only one delivery claims the run."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.DAY0_RESEND_QUEUED_S)
    grace = now - timedelta(seconds=UNSENT_GRACE_S)
    due = Q(queued_at__lt=stale) | Q(sent_at__isnull=True, queued_at__lt=grace)
    queued = StageRun.objects.filter(status=StageStatus.QUEUED)
    if not broker_lost:
        queued = queued.filter(due)
    count = 0
    for run in queued.select_related("job__pool"):
        bumped = StageRun.objects.filter(
            pk=run.pk, status=StageStatus.QUEUED, queued_at=run.queued_at
        ).update(queued_at=now)
        if bumped and queueing.stage_message_deliver(
            stage_run_id=run.pk,
            stage=run.stage,
            queue=run.job.pool.queue,
            options=job_stage_options(run.job, run.stage),
        ):
            count += 1
    return count
