"""Adaptation jobs: create, cancel, re-run a stage, and keep the stored status and readiness
in line with the stage runs."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from adaptation import readiness
from adaptation.models import (
    ACTIVE_STAGE_STATUSES,
    AcceleratorPool,
    AdaptationJob,
    JobStatus,
    ModelRelease,
    NotificationEvent,
    StageRun,
    StageStatus,
)
from adaptation.notifications.services import notifications_emit_safely
from adaptation.selectors.jobs import job_current_stage_runs
from adaptation.services.errors import ServiceError
from adaptation.services.queueing import stage_run_enqueue
from adaptation.services.regressions import regressions_detect_safely
from engine.registry import get_stage, job_options_check, stage_list_check

logger = logging.getLogger(__name__)


def job_create(
    *,
    release: ModelRelease,
    pool: AcceleratorPool,
    trigger: str,
    requested_by: Any = None,
    stages: list[str] | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    allow_duplicate: bool = True,
) -> AdaptationJob:
    """Create a job with one pending run per stage and queue its first stage after commit.

    `stages` defaults to every registered stage and runs in the registry's order; an unknown
    or repeated name, or a stage without one it needs (`engine.registry.stage_list_check`),
    raises `ServiceError`.
    `options` maps a stage name to its options ({"plan": {"context_tokens": 8192,
    "concurrency": 16, "dtype": "fp8"}}), checked and normalised by the stage's
    `check_options`; an option for a stage the job does not run, or one the stage refuses,
    raises `ServiceError` with the reason.

    With `allow_duplicate=False` (a person asking: the API, the release page's form,
    `manage.py adapt`), a job for the same release on the same pool that has not ended
    (pending or running: not in `FINISHED_JOB_STATUSES`) refuses the new one with
    `DuplicateJobError`, naming it; the caller says how to ask for another explicitly. The
    release row is locked (`select_for_update`) while checking and creating, so two
    concurrent submissions cannot both pass the check (PostgreSQL; SQLite serialises writes
    anyway). Webhooks and hub polls keep the default, True: they have their own dedup rules.
    """
    try:
        names = stage_list_check(stages)
        checked = job_options_check(options=options, stages=names)
    except ValueError as exc:
        raise ServiceError(str(exc)) from exc
    with transaction.atomic():
        if not allow_duplicate:
            # Held until the outermost transaction commits: a concurrent submission for this
            # release waits here and then sees the job this one creates.
            ModelRelease.objects.select_for_update().only("pk").get(pk=release.pk)
            active = _job_active_for(release=release, pool=pool)
            if active is not None:
                raise DuplicateJobError(active)
        job = AdaptationJob.objects.create(
            release=release,
            pool=pool,
            trigger=trigger,
            stages=names,
            options=checked,
            requested_by=requested_by if getattr(requested_by, "pk", None) else None,
        )
        runs = StageRun.objects.bulk_create(
            StageRun(job=job, stage=name, position=i, attempt=1) for i, name in enumerate(names)
        )
        stage_run_enqueue(runs[0])
    return job


class DuplicateJobError(ServiceError):
    """`job_create` refused a job because `job`, for the same release on the same pool, has
    not ended (pending or running)."""

    def __init__(self, job: AdaptationJob) -> None:
        self.job = job
        release = job.release
        super().__init__(
            f"Job {job.pk} for {release.repo_id}@{release.revision[:12]} on pool "
            f"{job.pool.name} is still {job.status}."
        )


def _job_active_for(*, release: ModelRelease, pool: AcceleratorPool) -> AdaptationJob | None:
    """The newest job for `release` on `pool` that has not ended, if any."""
    return (
        AdaptationJob.objects.filter(release=release, pool=pool)
        .exclude(status__in=FINISHED_JOB_STATUSES)
        .select_related("release", "pool")
        .order_by("-created_at", "-pk")
        .first()
    )


def job_skip_pending_after(*, job: AdaptationJob, position: int) -> list[StageRun]:
    """After the stage at `position` failed: skip the job's later pending stages, except
    those that run after a failure (`StageDefinition.runs_after_failure`: the release notes,
    which say what blocked), which are queued, the first of them now (inside the caller's
    transaction; sent after commit) and each next one when the one before ends, as usual.
    Returns the runs queued."""
    later = [
        r
        for r in job_current_stage_runs(job)
        if r.position > position and r.status == StageStatus.PENDING
    ]
    kept = [r for r in later if _runs_after_failure(r.stage)]
    StageRun.objects.filter(
        pk__in=[r.pk for r in later if r not in kept], status=StageStatus.PENDING
    ).update(status=StageStatus.SKIPPED)
    if kept:
        stage_run_enqueue(kept[0])
    return kept[:1]


def _runs_after_failure(stage: str) -> bool:
    try:
        return get_stage(stage).runs_after_failure
    except LookupError:  # a stage no longer registered
        return False


def derive_job_status(statuses: list[str]) -> str:
    """A job's status from the latest attempt of each of its stages, in order: failed when
    one failed, cancelled when one was cancelled (a re-run replaces those attempts), then
    succeeded, pending or running."""
    if any(s == StageStatus.FAILED for s in statuses):
        return JobStatus.FAILED
    if any(s == StageStatus.CANCELLED for s in statuses):
        return JobStatus.CANCELLED
    if statuses and all(s in (StageStatus.SUCCEEDED, StageStatus.SKIPPED) for s in statuses):
        return JobStatus.SUCCEEDED
    if all(s == StageStatus.PENDING for s in statuses):
        return JobStatus.PENDING
    return JobStatus.RUNNING


def job_refresh_status(*, job: AdaptationJob) -> AdaptationJob:
    """Recompute and store the job's status and finish time from its stage runs, and its
    readiness level, blocking stage and Day-0 time (`adaptation.readiness`: the one place
    they are kept, at every stage transition).

    When the stored status becomes succeeded or failed (the transition, not every refresh),
    `job.succeeded` / `job.failed` is notified (`notifications_emit_safely`: never raises),
    and its figures are judged against the last good runs (`regressions_detect_safely`: never
    raises; `regression.detected` is notified when any regressed).
    """
    status = derive_job_status([run.status for run in job_current_stage_runs(job)])
    previous = AdaptationJob.objects.filter(pk=job.pk).values_list("status", flat=True).first()
    job.status = status
    done = status in FINISHED_JOB_STATUSES
    job.finished_at = (job.finished_at or timezone.now()) if done else None
    level = readiness.job_readiness(job=job)
    job.readiness, job.blocking_stage, job.ready_at = (
        level.readiness,
        level.blocking_stage,
        level.ready_at,
    )
    job.save(update_fields=["status", "finished_at", "readiness", "blocking_stage", "ready_at"])
    if status != previous and status in _JOB_EVENTS:
        notifications_emit_safely(event=_JOB_EVENTS[status], job=job)
        # Its figures against the last good runs (docs/regressions.md); never raises.
        regressions_detect_safely(job=job)
    return job


def jobs_readiness_refresh(*, batch_size: int = 500) -> int:
    """Recompute every job's stored readiness, blocking stage and Day-0 time from its stage
    runs under the current `DAY0_READINESS` and their pools' engines (after the setting or
    an engine changed; `manage.py readiness_refresh`). Batches of `batch_size` jobs, two
    queries each. Returns how many jobs changed."""
    changed = 0
    ids = list(AdaptationJob.objects.order_by("pk").values_list("pk", flat=True))
    for start in range(0, len(ids), batch_size):
        jobs = list(
            AdaptationJob.objects.filter(pk__in=ids[start : start + batch_size])
            .select_related("pool")
            .prefetch_related("stage_runs")
        )
        stale = []
        for job in jobs:
            level = readiness.readiness_from_runs(
                stages=job.stages or [],
                runs=job.stage_runs.all(),
                engine=readiness.pool_has_engine(job.pool),
            )
            now = (level.readiness, level.blocking_stage, level.ready_at)
            if now != (job.readiness, job.blocking_stage, job.ready_at):
                job.readiness, job.blocking_stage, job.ready_at = now
                stale.append(job)
        AdaptationJob.objects.bulk_update(stale, ["readiness", "blocking_stage", "ready_at"])
        changed += len(stale)
    return changed


# The job statuses that are notified when a job reaches them.
_JOB_EVENTS = {
    JobStatus.SUCCEEDED: NotificationEvent.JOB_SUCCEEDED,
    JobStatus.FAILED: NotificationEvent.JOB_FAILED,
}

# A job in one of these is over: nothing of it runs or will run unless a stage is re-run.
FINISHED_JOB_STATUSES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)

_CANCELLABLE_STAGE_STATUSES = (StageStatus.PENDING, StageStatus.QUEUED, StageStatus.RUNNING)


def job_cancel(*, job: AdaptationJob, by: Any = None) -> AdaptationJob:
    """Cancel a job that has not finished: every pending, queued or running latest stage
    attempt becomes cancelled (finished now, error "Cancelled by <user>"), and so does the
    job. Returns the job as stored.

    A worker running a cancelled stage learns it at its next heartbeat (the run is no longer
    running) and stops at the stage's next step (`workers.runner.Heartbeat`); whatever it
    reports meanwhile is discarded, as `stage_run_succeed`, `stage_run_fail` and
    `stage_run_requeue` only change runs still running. A queued message of a cancelled run
    is not claimed. A stage of a cancelled job can be re-run (`job_rerun_stage`), which starts
    again from there.

    Raises `ServiceError` for a job that has already finished (succeeded, failed or
    cancelled).
    """
    who = by.get_username() if getattr(by, "pk", None) else "an operator"
    with transaction.atomic():
        job = AdaptationJob.objects.select_for_update().get(pk=job.pk)
        if job.status in FINISHED_JOB_STATUSES:
            raise ServiceError(
                f"Job {job.pk} has already {job.status}; there is nothing to cancel."
            )
        now = timezone.now()
        current = [
            r for r in job_current_stage_runs(job) if r.status in _CANCELLABLE_STAGE_STATUSES
        ]
        # Conditional: a run that finished meanwhile keeps its outcome.
        cancelled = StageRun.objects.filter(
            pk__in=[r.pk for r in current], status__in=_CANCELLABLE_STAGE_STATUSES
        ).update(status=StageStatus.CANCELLED, finished_at=now, error=f"Cancelled by {who}.")
        job.finished_at = now  # kept by the refresh when the job is over
        job = job_refresh_status(job=job)
        if not cancelled and job.status in FINISHED_JOB_STATUSES:  # its last stage ended
            raise ServiceError(
                f"Job {job.pk} has already {job.status}; there is nothing to cancel."
            )
        if job.status not in FINISHED_JOB_STATUSES:  # a job without stage runs
            job.status, job.finished_at = JobStatus.CANCELLED, now
            job.save(update_fields=["status", "finished_at"])
    logger.info("Job %s cancelled by %s", job.pk, who)
    return job


def job_rerun_stage(*, job: AdaptationJob, stage: str) -> StageRun:
    """Run `stage` again, and every stage after it, keeping all earlier attempts.

    Raises `ServiceError` for a stage the job does not have or while the job still runs.
    """
    with transaction.atomic():
        job = AdaptationJob.objects.select_for_update().get(pk=job.pk)
        if stage not in job.stages:
            raise ServiceError(
                f"Job {job.pk} has no stage {stage!r}; it has {', '.join(job.stages)}."
            )
        current = job_current_stage_runs(job)
        active = [r.stage for r in current if r.status in ACTIVE_STAGE_STATUSES]
        if active:
            raise ServiceError(f"Job {job.pk} is still running ({', '.join(active)}); wait for it.")
        start = job.stages.index(stage)
        unmet = [
            r.stage for r in current if r.position < start and r.status != StageStatus.SUCCEEDED
        ]
        if unmet:
            raise ServiceError(
                f"{stage} needs {', '.join(unmet)} to succeed first; re-run {unmet[0]} instead."
            )
        new_runs = [
            StageRun.objects.create(
                job=job, stage=run.stage, position=run.position, attempt=run.attempt + 1
            )
            for run in current
            if run.position >= start
        ]
        job.finished_at = None
        stage_run_enqueue(new_runs[0])
        job_refresh_status(job=job)  # the new attempts count for its readiness from now
        return new_runs[0]
