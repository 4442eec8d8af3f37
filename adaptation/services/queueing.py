"""Sending a stage attempt to its pool's queue, only after the transaction that queued it
commits. A broker outage never undoes the committed rows: a message that could not be sent
leaves its run queued with `sent_at` empty, and the reaper sends it again every
`DAY0_REAP_EVERY_S` until the broker takes it (`stage_runs.stage_runs_resend_queued`)."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from adaptation.models import (
    AdaptationJob,
    JobStatus,
    StageRun,
    StageStatus,
)
from adaptation.worker_tasks import RUN_STAGE, worker_task
from engine.registry import get_stage

logger = logging.getLogger(__name__)

# How hard one send tries before the run is left for the reaper: a broker that is down answers
# within about two seconds instead of Celery's default retries.
SEND_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.5, "interval_max": 1}


def job_stage_options(job: AdaptationJob, stage: str) -> Any:
    """The job's stored options for `stage` ({} when none)."""
    options = job.options if isinstance(job.options, dict) else {}
    return options.get(stage) or {}


def stage_run_enqueue(run: StageRun) -> None:
    """Mark `run` queued and send it to its pool's queue once the transaction commits."""
    run.status = StageStatus.QUEUED
    run.queued_at = timezone.now()
    run.sent_at = None
    run.save(update_fields=["status", "queued_at", "sent_at"])
    job = run.job
    if job.started_at is None:
        job.started_at = run.queued_at
    job.status = JobStatus.RUNNING
    job.finished_at = None
    job.save(update_fields=["started_at", "status", "finished_at"])
    run_id, stage, queue = run.pk, run.stage, job.pool.queue
    options = job_stage_options(job, stage)
    transaction.on_commit(
        lambda: stage_message_deliver(
            stage_run_id=run_id, stage=stage, queue=queue, options=options
        )
    )


def stage_message_send(
    *, stage_run_id: int, stage: str, queue: str, options: dict[str, Any] | None = None
) -> None:
    """Send the Celery message that runs one stage attempt on its pool's queue, with the
    stage's time limits for the job's `options` for it (`StageDefinition.time_limits_s`: the
    stability run's follow its duration)."""
    soft, hard = get_stage(stage).time_limits_s(options)
    worker_task(RUN_STAGE).apply_async(
        args=[stage_run_id],
        queue=queue,
        soft_time_limit=soft,
        time_limit=hard,
        retry_policy=SEND_RETRY_POLICY,
    )


def stage_message_deliver(
    *, stage_run_id: int, stage: str, queue: str, options: dict[str, Any] | None = None
) -> bool:
    """`stage_message_send`, recording `sent_at` when the broker took the message. Never
    raises for a broker that is down or unreachable: logs one line and returns False, and the
    run stays queued with `sent_at` empty for the reaper to send again."""
    try:
        stage_message_send(stage_run_id=stage_run_id, stage=stage, queue=queue, options=options)
    except Exception as exc:  # kombu's OperationalError, OSError, a timeout: any failed send
        logger.warning(
            "Stage run %s is queued but not sent: the broker is unreachable (%s: %s); it is "
            "sent again when the broker is back.",
            stage_run_id,
            type(exc).__name__,
            " ".join(str(exc).split())[:200],
        )
        return False
    StageRun.objects.filter(pk=stage_run_id, status=StageStatus.QUEUED).update(
        sent_at=timezone.now()
    )
    return True


def unsent_stage_runs(job: AdaptationJob) -> list[StageRun]:
    """The job's queued runs whose message the broker did not take (it was down). Empty
    inside a transaction, whose sends wait for its commit: nothing can be told yet."""
    if transaction.get_connection().in_atomic_block:
        return []
    return list(job.stage_runs.filter(status=StageStatus.QUEUED, sent_at__isnull=True))
