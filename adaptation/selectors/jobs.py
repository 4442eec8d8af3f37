"""Reads of jobs and their stage runs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import (
    Prefetch,
    QuerySet,
)

from adaptation.models import (
    ACTIVE_STAGE_STATUSES,
    AdaptationJob,
    ModelRelease,
    StageRun,
    StageStatus,
)


def job_current_stage_runs(job: AdaptationJob) -> list[StageRun]:
    """The latest attempt of each of the job's stages, in stage order."""
    latest: dict[int, StageRun] = {}
    for run in StageRun.objects.filter(job=job).order_by("position", "attempt"):
        latest[run.position] = run
    return [latest[p] for p in sorted(latest)]


def job_previous_results(job: AdaptationJob, *, before_position: int) -> dict[str, dict[str, Any]]:
    """Results of the latest succeeded attempt of each stage before `before_position`."""
    results: dict[str, dict[str, Any]] = {}
    for run in job_current_stage_runs(job):
        if run.position < before_position and run.status == StageStatus.SUCCEEDED:
            results[run.stage] = run.result or {}
    return results


def latest_runs_by_stage(job: AdaptationJob) -> dict[str, StageRun]:
    """The latest attempt per stage name from a job whose stage runs are prefetched."""
    latest: dict[str, StageRun] = {}
    for run in job.stage_runs.all():
        current = latest.get(run.stage)
        if current is None or run.attempt > current.attempt:
            latest[run.stage] = run
    return latest


def anything_running() -> bool:
    """Whether any stage is queued or running (pages keep refreshing while so)."""
    return StageRun.objects.filter(status__in=ACTIVE_STAGE_STATUSES).exists()


def job_summary(job: AdaptationJob) -> dict[str, Any]:
    """The job as JSON: its status and the latest attempt of each stage, in order."""

    def iso(value) -> str | None:
        return value.isoformat() if value else None

    return {
        "job": job.pk,
        "release": job.release_id,
        "repo_id": job.release.repo_id,
        "revision": job.release.revision,
        "pool": job.pool.name,
        "status": job.status,
        "stages": [
            {
                "name": run.stage,
                "status": run.status,
                "attempt": run.attempt,
                "started_at": iso(run.started_at),
                "finished_at": iso(run.finished_at),
                "worker_host": run.worker_host,
                "result": run.result,
                "error": run.error,
            }
            for run in job_current_stage_runs(job)
        ],
    }


def jobs_with_stage_runs() -> QuerySet[AdaptationJob]:
    """Every job with its release, pool, requester and stage attempts (in position, attempt
    order) loaded."""
    return AdaptationJob.objects.select_related("release", "pool", "requested_by").prefetch_related(
        Prefetch("stage_runs", queryset=StageRun.objects.order_by("position", "attempt"))
    )


def stage_runs_with_jobs() -> QuerySet[StageRun]:
    """Every stage attempt with its job, release and pool loaded (logs left out)."""
    return StageRun.objects.select_related("job__release", "job__pool").defer("log")


def jobs_by_id(ids: Iterable[int]) -> dict[int, AdaptationJob]:
    """The jobs of `ids` that exist, by id (release and pool loaded)."""
    jobs = AdaptationJob.objects.filter(pk__in=list(ids)).select_related("release", "pool")
    return {job.pk: job for job in jobs}


def jobs_with_release_and_pool() -> QuerySet[AdaptationJob]:
    """Every job with its release and pool loaded (a job's own pages, its notes)."""
    return AdaptationJob.objects.select_related("release", "pool")


def release_recent_jobs(release: ModelRelease, *, limit: int = 10) -> list[AdaptationJob]:
    """The release's newest `limit` jobs, newest first (pool loaded)."""
    return list(release.jobs.select_related("pool").order_by("-created_at", "-id")[:limit])
