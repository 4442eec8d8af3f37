"""Sending a stage attempt to its pool's queue, only after the transaction that queued it
commits (a broker outage never undoes the committed rows; the reaper re-sends)."""

from __future__ import annotations

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


def job_stage_options(job: AdaptationJob, stage: str) -> Any:
    """The job's stored options for `stage` ({} when none)."""
    options = job.options if isinstance(job.options, dict) else {}
    return options.get(stage) or {}


def stage_run_enqueue(run: StageRun) -> None:
    """Mark `run` queued and send it to its pool's queue once the transaction commits."""
    run.status = StageStatus.QUEUED
    run.queued_at = timezone.now()
    run.save(update_fields=["status", "queued_at"])
    job = run.job
    if job.started_at is None:
        job.started_at = run.queued_at
    job.status = JobStatus.RUNNING
    job.finished_at = None
    job.save(update_fields=["started_at", "status", "finished_at"])
    run_id, stage, queue = run.pk, run.stage, job.pool.queue
    options = job_stage_options(job, stage)
    # robust: a broker outage must not undo the committed rows; the reaper re-sends later.
    transaction.on_commit(
        lambda: stage_message_send(stage_run_id=run_id, stage=stage, queue=queue, options=options),
        robust=True,
    )


def stage_message_send(
    *, stage_run_id: int, stage: str, queue: str, options: dict[str, Any] | None = None
) -> None:
    """Send the Celery message that runs one stage attempt on its pool's queue, with the
    stage's time limits for the job's `options` for it (`StageDefinition.time_limits_s`: the
    stability run's follow its duration)."""
    soft, hard = get_stage(stage).time_limits_s(options)
    worker_task(RUN_STAGE).apply_async(
        args=[stage_run_id], queue=queue, soft_time_limit=soft, time_limit=hard
    )
