"""Stage attempts as workers run them: claimed with a conditional update (one delivery of a
message runs it), heartbeats, success, failure, transient requeue, and the periodic reaper
and re-sender."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from adaptation.models import (
    ACTIVE_STAGE_STATUSES,
    AdaptationJob,
    NotificationEvent,
    StageRun,
    StageStatus,
)
from adaptation.notifications.services import notifications_emit_safely
from adaptation.selectors.jobs import job_current_stage_runs
from adaptation.services import queueing, stage_results
from adaptation.services.jobs import job_refresh_status, job_skip_pending_after
from adaptation.services.limitations import limitations_sync_safely
from adaptation.services.queueing import job_stage_options, stage_run_enqueue


def stage_run_claim(*, stage_run_id: int, worker_host: str, task_id: str = "") -> StageRun | None:
    """Move a queued run to running for this worker. None when another delivery (or the
    reaper) got there first: a conditional update decides.

    A run still marked running whose heartbeat went stale is taken over too: that is the
    message redelivered after its worker was lost (`acks_late` + `reject_on_worker_lost`).
    """
    now = timezone.now()
    fields = {
        "status": StageStatus.RUNNING,
        "started_at": now,
        "heartbeat_at": now,
        "worker_host": worker_host[:255],
        "celery_task_id": task_id[:64],
    }
    runs = StageRun.objects.filter(pk=stage_run_id)
    claimed = runs.filter(status=StageStatus.QUEUED).update(**fields)
    if not claimed:
        claimed = runs.filter(
            status=StageStatus.RUNNING, heartbeat_at__lt=_stale_cutoff(now)
        ).update(**fields, retries=F("retries") + 1)
    if not claimed:
        return None
    return StageRun.objects.select_related("job__release", "job__pool").get(pk=stage_run_id)


def stage_run_heartbeat(*, stage_run_id: int) -> bool:
    """Record that the worker still runs this stage. False when it is no longer running."""
    return bool(
        StageRun.objects.filter(pk=stage_run_id, status=StageStatus.RUNNING).update(
            heartbeat_at=timezone.now()
        )
    )


def stage_run_succeed(*, stage_run: StageRun, result: dict[str, Any], log: str = "") -> None:
    """Store a stage's result, apply it to the domain rows, bring the stage's known
    limitations in line with its findings (`limitations_sync_safely`: never raises), and
    queue the next stage or finish the job. Does nothing when the run is no longer running
    (reaped meanwhile)."""
    with transaction.atomic():
        updated = StageRun.objects.filter(pk=stage_run.pk, status=StageStatus.RUNNING).update(
            status=StageStatus.SUCCEEDED, finished_at=timezone.now(), result=result, log=log
        )
        if not updated:
            return
        stage_results.apply(run=stage_run, result=result)
        limitations_sync_safely(stage_run=stage_run)
        job = AdaptationJob.objects.select_for_update().get(pk=stage_run.job_id)
        following = [
            run for run in job_current_stage_runs(job) if run.position > stage_run.position
        ]
        if following and following[0].status == StageStatus.PENDING:
            stage_run_enqueue(following[0])
        job_refresh_status(job=job)


def stage_run_fail(
    *,
    stage_run: StageRun,
    error: str,
    log: str = "",
    stale_before: datetime | None = None,
    result: dict[str, Any] | None = None,
) -> bool:
    """Fail a stage with its reason; the job stops and its later stages are skipped.

    `result` is what the stage measured before failing (a precision failure's metrics): it is
    stored and applied to the domain rows like a success's, and its findings raise or resolve
    the stage's known limitations; a failure without a result leaves them as they are. With
    `stale_before`, only a run whose heartbeat is older than that is failed (the reaper: a
    heartbeat that lands meanwhile keeps the stage alive). False when nothing changed.
    """
    with transaction.atomic():
        runs = StageRun.objects.filter(pk=stage_run.pk, status__in=ACTIVE_STAGE_STATUSES)
        if stale_before is not None:
            runs = runs.filter(heartbeat_at__lt=stale_before)
        updated = runs.update(
            status=StageStatus.FAILED,
            finished_at=timezone.now(),
            error=error,
            log=log,
            result=result,
        )
        if not updated:
            return False
        if result is not None:
            stage_results.apply(run=stage_run, result=result)
            limitations_sync_safely(stage_run=stage_run)
        job = AdaptationJob.objects.select_for_update().get(pk=stage_run.job_id)
        job_skip_pending_after(job=job, position=stage_run.position)
        notifications_emit_safely(
            event=NotificationEvent.STAGE_FAILED, job=job, stage_run=stage_run
        )
        job_refresh_status(job=job)
    return True


def stage_run_requeue(*, stage_run: StageRun, reason: str, log: str = "") -> bool:
    """Put a running stage back in the queue after a transient error (the task retries it).
    False when it was no longer running."""
    line = f"{timezone.now():%H:%M:%S} retrying: {reason}"
    return bool(
        StageRun.objects.filter(pk=stage_run.pk, status=StageStatus.RUNNING).update(
            status=StageStatus.QUEUED,
            queued_at=timezone.now(),
            retries=F("retries") + 1,
            log=f"{log}\n{line}".strip(),
        )
    )


def _stale_cutoff(now: datetime) -> datetime:
    return now - timedelta(seconds=settings.DAY0_STALE_HEARTBEAT_S)


def stage_runs_reap_stale(*, now: datetime | None = None) -> int:
    """Fail running stages whose worker stopped sending heartbeats. Returns how many."""
    now = now or timezone.now()
    cutoff = _stale_cutoff(now)
    count = 0
    for run in StageRun.objects.filter(status=StageStatus.RUNNING, heartbeat_at__lt=cutoff):
        count += stage_run_fail(
            stage_run=run,
            error=(
                f"The worker on {run.worker_host or 'an unknown host'} stopped sending heartbeats "
                f"(last at {run.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC); the stage was abandoned."
            ),
            log=run.log,
            stale_before=cutoff,
        )
    return count


def stage_runs_resend_queued(*, now: datetime | None = None) -> int:
    """Send again the message of each stage queued for longer than `DAY0_RESEND_QUEUED_S`:
    one lost with a broker restart or outage would otherwise leave its job waiting forever.
    A duplicate is harmless (only one delivery claims the run). Returns how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.DAY0_RESEND_QUEUED_S)
    count = 0
    stale = StageRun.objects.filter(status=StageStatus.QUEUED, queued_at__lt=cutoff)
    for run in stale.select_related("job__pool"):
        bumped = StageRun.objects.filter(
            pk=run.pk, status=StageStatus.QUEUED, queued_at=run.queued_at
        ).update(queued_at=now)
        if bumped:
            queueing.stage_message_send(
                stage_run_id=run.pk,
                stage=run.stage,
                queue=run.job.pool.queue,
                options=job_stage_options(run.job, run.stage),
            )
            count += 1
    return count
