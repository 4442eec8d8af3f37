"""The release page's stage timeline: every attempt of every stage of each job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from adaptation.models import AcceleratorPool, AdaptationJob, ModelRelease, StageRun
from adaptation.presenters.stages import is_active, stage_title
from adaptation.selectors.jobs import latest_runs_by_stage


@dataclass(frozen=True)
class StageTimeline:
    """Every attempt of one stage of a job, oldest first, whether it may be re-run, and the
    pool no live worker serves (its queued attempt waits for one; None when one does)."""

    name: str
    title: str
    attempts: list[StageRun]
    can_rerun: bool
    waiting_for: AcceleratorPool | None = None


@dataclass(frozen=True)
class JobTimeline:
    """One job of a release with its stages in run order."""

    job: AdaptationJob
    stages: list[StageTimeline]
    active: bool


def job_timeline(job: AdaptationJob, *, idle_pool: AcceleratorPool | None = None) -> JobTimeline:
    """A job's timeline from its prefetched stage runs; `idle_pool`: its pool, when no live
    worker serves it (queued attempts then say they wait for one)."""
    by_stage: dict[str, list[StageRun]] = {}
    for run in sorted(job.stage_runs.all(), key=lambda r: (r.position, r.attempt)):
        by_stage.setdefault(run.stage, []).append(run)
    latest = latest_runs_by_stage(job)
    active = any(is_active(run) for run in latest.values())
    order = list(job.stages) + [name for name in by_stage if name not in job.stages]
    stages = [
        StageTimeline(
            name=name,
            title=stage_title(name),
            attempts=by_stage.get(name, []),
            can_rerun=not active and name in job.stages,
            waiting_for=idle_pool,
        )
        for name in order
    ]
    return JobTimeline(job=job, stages=stages, active=active)


def job_timelines(
    release: ModelRelease, *, pools_without_worker: Mapping[int, AcceleratorPool] | None = None
) -> list[JobTimeline]:
    """Timelines of the release's jobs, newest job first (jobs prefetched in that order).
    `pools_without_worker` (by id) marks queued attempts of those pools as waiting."""
    idle = pools_without_worker or {}
    return [job_timeline(job, idle_pool=idle.get(job.pool_id)) for job in release.jobs.all()]


def release_is_active(release: ModelRelease) -> bool:
    """Whether any job of the release has a stage queued or running (prefetched runs)."""
    return any(
        is_active(run) for job in release.jobs.all() for run in latest_runs_by_stage(job).values()
    )
