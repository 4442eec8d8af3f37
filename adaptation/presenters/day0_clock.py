"""The Day-0 clock of a release (the board's clock column, the release page's clock and
readiness table) and its timeline of events."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from adaptation.models import AdaptationJob, JobStatus, ModelRelease, StageRun, StageStatus
from adaptation.presenters.stages import stage_title
from adaptation.readiness import (
    JobReadiness,
    pool_has_engine,
    readiness_from_runs,
    top_limitation,
)
from adaptation.selectors.jobs import latest_runs_by_stage


@dataclass(frozen=True)
class PoolReadiness:
    """A release on one pool: its readiness there (`pool_level`), the stage blocking the next
    level, the most severe open limitation that applies there (None when none), and when the
    release was first ready on the pool.

    `job` is the job that earned the level (`level_job`); `newer_job` the pool's newest job
    when that is another one (cancelled, still running, or one that does not run every stage
    the level needs), None otherwise: the page names it beside the level, never as the level's
    job."""

    pool_id: int
    pool_name: str
    job: AdaptationJob
    level: JobReadiness
    top_limitation: Any
    ready_at: datetime | None
    newer_job: AdaptationJob | None = None

    @property
    def blocking_title(self) -> str:
        """The blocking stage's title ("" when nothing blocks)."""
        return stage_title(self.level.blocking_stage) if self.level.blocking_stage else ""


def job_readiness(job: AdaptationJob) -> JobReadiness:
    """The job's readiness from its prefetched stage runs (`adaptation.readiness`): its
    `ready_at` is, per required stage, its earliest succeeded attempt, the latest of those; a
    later re-run keeps the earlier success, so the time never moves. On a pool with a
    serving engine (loaded with the job) `functional` needs the `serve` stage too."""
    return readiness_from_runs(
        stages=job.stages or [], runs=job.stage_runs.all(), engine=pool_has_engine(job.pool)
    )


# A stage a job "ran": its latest attempt finished (succeeded or failed). A queued re-run,
# a skipped or cancelled stage, or a stage the job does not hold leaves an older job's result.
_RAN = (StageStatus.SUCCEEDED, StageStatus.FAILED)


def newest_job_per_stage(jobs: Iterable[AdaptationJob]) -> dict[str, AdaptationJob]:
    """For each stage, the newest of `jobs` (newest first, runs prefetched) that ran it (its
    latest attempt finished), else the newest that skipped it (an earlier stage failed),
    else the newest that holds it: a partial job (a webhook's three stages), a re-run still
    queued or a job cancelled before the stage began never hides what an older job measured
    or decided."""
    owners: dict[str, AdaptationJob] = {}
    skippers: dict[str, AdaptationJob] = {}
    holders: dict[str, AdaptationJob] = {}
    for job in jobs:
        for name, run in latest_runs_by_stage(job).items():
            holders.setdefault(name, job)
            if run.status in _RAN:
                owners.setdefault(name, job)
            elif run.status == StageStatus.SKIPPED:
                skippers.setdefault(name, job)
    return {**holders, **skippers, **owners}


def pool_level(jobs: list[AdaptationJob]) -> JobReadiness:
    """A pool's readiness from its jobs (newest first, runs and pool prefetched): each stage
    as the newest job that ran it left it (`newest_job_per_stage`), so a partial job never
    lowers the level a full job reached; only a newer attempt that ran a stage can."""
    owners = newest_job_per_stage(jobs)
    stages = list(dict.fromkeys(name for job in jobs for name in job.stages or []))
    runs = [run for job in jobs for run in job.stage_runs.all() if owners.get(run.stage) is job]
    return readiness_from_runs(stages=stages, runs=runs, engine=pool_has_engine(jobs[0].pool))


# A job that ended by itself: every stage it holds ran to an end. A cancelled one was stopped,
# a pending or running one has not ended.
_ENDED_BY_ITSELF = (JobStatus.SUCCEEDED, JobStatus.FAILED)


def level_job(jobs: list[AdaptationJob], level: JobReadiness) -> AdaptationJob:
    """The job of `jobs` (one pool's, newest first, runs prefetched) that earned the pool's
    `level`: the newest that ended by itself (succeeded or failed) at that level by its own
    stages, else the newest at that level in any state, else the newest. A newer cancelled,
    pending or running job, or a partial one (a webhook's three stages), never takes the
    place of the full job whose stages the level reads."""
    at_level = [job for job in jobs if job_readiness(job).readiness == level.readiness]
    ended = [job for job in at_level if job.status in _ENDED_BY_ITSELF]
    return (ended or at_level or jobs)[0]


def pool_readiness(
    jobs: Iterable[AdaptationJob], *, limitations: Iterable[Any] = ()
) -> list[PoolReadiness]:
    """Per pool the release's jobs ran on (by pool name), its readiness (`pool_level`) and the
    job that earned it (`level_job`): jobs newest first with their stage runs and pool
    prefetched; `limitations` the release's open ones."""
    limitations = list(limitations)
    by_pool: dict[int, list[AdaptationJob]] = {}
    for job in jobs:
        by_pool.setdefault(job.pool_id, []).append(job)
    rows = []
    for pool_id, pool_jobs in by_pool.items():
        latest = pool_jobs[0]
        level = pool_level(pool_jobs)
        earned_by = level_job(pool_jobs, level)
        times = [at for at in (job_readiness(job).ready_at for job in pool_jobs) if at]
        if level.ready_at is not None:
            times.append(level.ready_at)
        rows.append(
            PoolReadiness(
                pool_id=pool_id,
                pool_name=latest.pool.name,
                job=earned_by,
                level=level,
                top_limitation=top_limitation(limitations, pool_id=pool_id),
                ready_at=min(times) if times else None,
                newer_job=latest if latest is not earned_by else None,
            )
        )
    return sorted(rows, key=lambda row: row.pool_name)


@dataclass(frozen=True)
class Day0Clock:
    """How long a release has been public and, once adapted, how long that took.

    `ready_at` is the first time the release was adapted: the earliest Day 0 of its jobs
    (`adaptation.readiness`: when every stage the `complete` level requires had passed). It
    never moves later, so re-runs and manual re-adapts cannot make the clock worse.
    `time_to_detect` is discovered - published; `ready_after` (time-to-Day-0) runs from the
    hub's publication time to `ready_at`, or from discovery when the hub gave none
    (`day0_basis` says which: "publication" or "discovery"). `since_published` runs from
    publication to now (None without one). `newest_job_state` says what the newest job is
    doing now when it is not a success ("pending", "running", "failed"), so the board can show
    a re-run beside the first readiness. `pools`: the readiness per pool.
    """

    published_at: datetime | None
    since_published: timedelta | None
    ready_at: datetime | None
    ready_after: timedelta | None
    newest_job_state: str
    discovered_at: datetime | None = None
    time_to_detect: timedelta | None = None
    day0_basis: str = ""
    pools: tuple[PoolReadiness, ...] = ()

    @property
    def ready(self) -> bool:
        """Whether the release was adapted at least once."""
        return self.ready_at is not None


def _job_state(job: AdaptationJob | None) -> str:
    """What the newest job is doing ("pending", "running", "failed"), or "" when it
    succeeded or there is none."""
    if job is None or job.status == JobStatus.SUCCEEDED:
        return ""
    return str(job.status)


def day0_clock(
    release: ModelRelease,
    jobs: Iterable[AdaptationJob],
    *,
    now: datetime,
    limitations: Iterable[Any] = (),
) -> Day0Clock:
    """The release's Day-0 clock at `now`, from its jobs (newest first, runs and pools
    prefetched) and its open `limitations`."""
    jobs = list(jobs)
    pools = pool_readiness(jobs, limitations=limitations)
    times = [row.ready_at for row in pools if row.ready_at is not None]
    ready_at = min(times) if times else None
    published = release.publication_time
    basis_at, basis = release.day0_basis()
    return Day0Clock(
        published_at=published,
        since_published=now - published if published is not None else None,
        ready_at=ready_at,
        ready_after=ready_at - basis_at if ready_at else None,
        newest_job_state=_job_state(jobs[0] if jobs else None),
        discovered_at=release.discovered_at,
        time_to_detect=release.time_to_detect,
        day0_basis=basis,
        pools=tuple(pools),
    )


@dataclass(frozen=True)
class ClockEvent:
    """One moment of a release's Day-0 timeline: what happened (`kind`: "published",
    "discovered", "job_started", "stage_finished" or "pool_ready"), when, how long after the
    clock's start (publication, else discovery), on which pool ("" for the release itself),
    and the job and stage run it is about."""

    kind: str
    at: datetime
    after: timedelta
    pool: str = ""
    job: AdaptationJob | None = None
    run: StageRun | None = None

    @property
    def stage_title(self) -> str:
        """The finished stage's title ("" for other events)."""
        return stage_title(self.run.stage) if self.run is not None else ""

    @property
    def status(self) -> str:
        """The finished stage's status, "ready" for a pool's Day 0, else ""."""
        if self.run is not None:
            return str(self.run.status)
        return "ready" if self.kind == "pool_ready" else ""

    @property
    def anchor(self) -> str:
        """The id on the page this event links to: its job, or its job's stage ("" when
        none)."""
        if self.job is None or self.kind == "pool_ready":
            return ""
        if self.run is not None:
            return f"job-{self.job.pk}-stage-{self.run.stage}"
        return f"job-{self.job.pk}"


def day0_timeline(release: ModelRelease, clock: Day0Clock) -> list[ClockEvent]:
    """The release's Day-0 timeline, oldest first: published (when known), discovered, and per
    pool (the job that earned its level: `level_job`) the job's start, each stage's latest
    attempt finished, and its Day 0. Jobs come from `clock.pools`, runs prefetched."""
    start, _ = release.day0_basis()
    events: list[ClockEvent] = []

    def add(kind: str, at: datetime | None, **about: Any) -> None:
        if at is not None:
            events.append(ClockEvent(kind=kind, at=at, after=at - start, **about))

    add("published", release.publication_time)
    add("discovered", release.discovered_at)
    for row in clock.pools:
        job = row.job
        add("job_started", job.started_at, pool=row.pool_name, job=job)
        latest = latest_runs_by_stage(job)
        for name in job.stages:
            run = latest.get(name)
            if run is not None:
                add("stage_finished", run.finished_at, pool=row.pool_name, job=job, run=run)
        add("pool_ready", row.ready_at, pool=row.pool_name, job=job)
    events.sort(key=lambda event: event.at)
    return events
