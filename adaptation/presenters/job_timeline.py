"""The release page's stage timeline: every attempt of every stage of each job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from adaptation.models import AcceleratorPool, AdaptationJob, AttemptEnd, ModelRelease, StageRun
from adaptation.presenters.stages import is_active, stage_title
from adaptation.selectors.jobs import latest_runs_by_stage


@dataclass(frozen=True)
class RunAttempt:
    """One time a worker ran a stage run (`StageRun.attempts`): `ended` is an `AttemptEnd`
    value (None while it runs), `culprit` a `Culprit` value or None."""

    n: int
    worker_host: str
    pid: int | None
    started_at: datetime | None
    ended_at: datetime | None
    ended: str | None
    reason: str
    culprit: str | None


def _moment(value: Any) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) else None


def run_attempts(run: StageRun) -> list[RunAttempt]:
    """The run's attempts, oldest first, with their times as datetimes."""
    return [
        RunAttempt(
            n=int(entry.get("n") or index),
            worker_host=str(entry.get("worker_host") or ""),
            pid=entry.get("pid") if isinstance(entry.get("pid"), int) else None,
            started_at=_moment(entry.get("started_at")),
            ended_at=_moment(entry.get("ended_at")),
            ended=entry.get("ended") or None,
            reason=str(entry.get("reason") or ""),
            culprit=entry.get("culprit") or None,
        )
        for index, entry in enumerate(run.attempts or [], start=1)
        if isinstance(entry, dict)
    ]


@dataclass(frozen=True)
class TimelineRun:
    """One attempt of a stage on the timeline (a `StageRun` row) with the times a worker ran
    it: `show_attempts` when there was more than one, or its only one was lost."""

    run: StageRun
    attempts: list[RunAttempt]

    @property
    def show_attempts(self) -> bool:
        return len(self.attempts) > 1 or any(
            a.ended == AttemptEnd.WORKER_LOST for a in self.attempts
        )


@dataclass(frozen=True)
class StageTimeline:
    """Every attempt of one stage of a job, oldest first, whether it may be re-run, and the
    pool no live worker serves (its queued attempt waits for one; None when one does).
    `runs`: the same attempts with the times a worker ran each (`TimelineRun`)."""

    name: str
    title: str
    attempts: list[StageRun]
    can_rerun: bool
    waiting_for: AcceleratorPool | None = None

    @property
    def runs(self) -> list[TimelineRun]:
        return [TimelineRun(run=run, attempts=run_attempts(run)) for run in self.attempts]


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
