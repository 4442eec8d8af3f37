"""The release page's stage timeline (every attempt of every stage of each job it shows in
full) and its job history (every job, a line each)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    AttemptEnd,
    ModelRelease,
    StageRun,
    StageStatus,
)
from adaptation.presenters.stages import failure_class, is_active, stage_title
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
    """Every attempt of one stage of a job, oldest first, whether it may be re-run now
    (`can_rerun`) and whether a re-run can run at all (`show_rerun`: the job holds the stage,
    every earlier stage of it succeeded, so not a stage skipped after a failure, which the
    service would refuse), the pool no live worker serves (its
    queued attempt waits for one; None when one does), and its latest attempt's failure class
    ("infrastructure", "release", or ""). `runs`: the same attempts with the times a worker
    ran each (`TimelineRun`)."""

    name: str
    title: str
    attempts: list[StageRun]
    can_rerun: bool
    waiting_for: AcceleratorPool | None = None
    show_rerun: bool = True
    failure_class: str = ""

    @property
    def runs(self) -> list[TimelineRun]:
        return [TimelineRun(run=run, attempts=run_attempts(run)) for run in self.attempts]

    @property
    def failed(self) -> bool:
        """Whether the stage's latest attempt failed (the timeline shows it first, open)."""
        return bool(self.attempts) and self.attempts[-1].status == StageStatus.FAILED


@dataclass(frozen=True)
class JobTimeline:
    """One job of a release with its stages in run order; `active` while one is queued or
    running."""

    job: AdaptationJob
    stages: list[StageTimeline]
    active: bool

    @property
    def failed(self) -> bool:
        """Whether a stage's latest attempt failed (the timeline shows it first, open)."""
        return any(stage.failed for stage in self.stages)

    @property
    def unfailed(self) -> list[StageTimeline]:
        """The stages whose latest attempt did not fail (folded once the job is done)."""
        return [stage for stage in self.stages if not stage.failed]


def job_timeline(job: AdaptationJob, *, idle_pool: AcceleratorPool | None = None) -> JobTimeline:
    """A job's timeline from its prefetched stage runs; `idle_pool`: its pool, when no live
    worker serves it (queued attempts then say they wait for one)."""
    by_stage: dict[str, list[StageRun]] = {}
    for run in sorted(job.stage_runs.all(), key=lambda r: (r.position, r.attempt)):
        by_stage.setdefault(run.stage, []).append(run)
    latest = latest_runs_by_stage(job)
    active = any(is_active(run) for run in latest.values())
    order = list(job.stages) + [name for name in by_stage if name not in job.stages]
    stages = []
    for name in order:
        run = latest.get(name)
        earlier_ok = run is not None and all(
            other.status == StageStatus.SUCCEEDED
            for other in latest.values()
            if other.position < run.position
        )
        show = (
            name in job.stages
            and earlier_ok
            and run is not None
            and run.status != StageStatus.SKIPPED
        )
        stages.append(
            StageTimeline(
                name=name,
                title=stage_title(name),
                attempts=by_stage.get(name, []),
                can_rerun=show and not active,
                waiting_for=idle_pool,
                show_rerun=show,
                failure_class=failure_class(run) if run is not None else "",
            )
        )
    return JobTimeline(job=job, stages=stages, active=active)


def job_timelines(
    release: ModelRelease,
    *,
    pools_without_worker: Mapping[int, AcceleratorPool] | None = None,
    jobs: Iterable[AdaptationJob] | None = None,
) -> list[JobTimeline]:
    """Timelines of the release's jobs, newest job first (jobs prefetched in that order), or
    of `jobs` only (the ones the page shows in full). `pools_without_worker` (by id) marks
    queued attempts of those pools as waiting."""
    idle = pools_without_worker or {}
    chosen = release.jobs.all() if jobs is None else jobs
    return [job_timeline(job, idle_pool=idle.get(job.pool_id)) for job in chosen]


@dataclass(frozen=True)
class HistoryRow:
    """One job of the release in the page's job history: the job, how many of its stages
    succeeded out of how many it holds, its first failed stage ("" when none) with that
    run's failure class, and whether the page shows its panels and timeline (`shown`)."""

    job: AdaptationJob
    succeeded: int
    stages: int
    failed_stage: str
    failure_class: str
    shown: bool

    @property
    def failed_title(self) -> str:
        return stage_title(self.failed_stage) if self.failed_stage else ""


def job_history(release: ModelRelease, *, shown: Iterable[AdaptationJob]) -> list[HistoryRow]:
    """Every job of the release, newest first (prefetched), as a line of the job history;
    `shown`: the jobs whose panels the page draws in full."""
    shown_ids = {job.pk for job in shown}
    rows = []
    for job in release.jobs.all():
        latest = latest_runs_by_stage(job)
        failed = sorted(
            (run for run in latest.values() if run.status == StageStatus.FAILED),
            key=lambda run: run.position,
        )
        rows.append(
            HistoryRow(
                job=job,
                succeeded=sum(run.status == StageStatus.SUCCEEDED for run in latest.values()),
                stages=len(job.stages or latest),
                failed_stage=failed[0].stage if failed else "",
                failure_class=failure_class(failed[0]) if failed else "",
                shown=job.pk in shown_ids,
            )
        )
    return rows


def release_is_active(release: ModelRelease) -> bool:
    """Whether any job of the release has a stage queued or running (prefetched runs)."""
    return any(
        is_active(run) for job in release.jobs.all() for run in latest_runs_by_stage(job).values()
    )
