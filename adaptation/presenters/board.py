"""The release board: a row per release (per stage, the newest job on each pool that ran it;
its running jobs; its Day-0 clock), a column per stage; one page of releases at a time.

The rows hold plain values (states, names, numbers, durations) so that the template reads each
with one lookup: the board renders a few thousand of them per request."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.urls import reverse

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    JobStatus,
    ModelRelease,
    StageRun,
    StageStatus,
)
from adaptation.models.limitations import SEVERITY_RANK
from adaptation.presenters.day0_clock import Day0Clock, day0_clock, newest_job_per_stage
from adaptation.presenters.regressions import RegressionBadge, regression_badge
from adaptation.presenters.stages import StageColumn, failure_class, stage_columns
from adaptation.selectors.jobs import latest_runs_by_stage
from adaptation.stages import app_stage
from engine.formatting import finite

STATUS_LABELS = dict(StageStatus.choices)


def _count(value: Any) -> int:
    """A stored figure as a count: a finite number above zero (or its text, as PostgreSQL
    reads a JSON value out), else 0."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return 0
    number = finite(value)
    return int(number) if number is not None and number > 0 else 0


def cell_figure_template(stage: str) -> str:
    """The template that words `stage`'s board-cell figure (its
    `AppStage.cell_figure_template`, `adaptation/stages/<stage>.py`); "" for a stage whose
    cells show none."""
    app = app_stage(stage)
    return (app.cell_figure_template or "") if app is not None else ""


@dataclass(frozen=True)
class StageEntry:
    """The latest attempt of one stage of the newest job on a pool that ran it: its status
    (`label` the model's word for it), duration (None before it starts), attempt number, job,
    pool name, the first line of its error (the tooltip), for a stage with a board-cell figure
    its count (`figure_template` words it), the failed run's class ("infrastructure", "release",
    or ""), the pool no live worker serves when the run is queued there (`waiting_for`, None
    otherwise), whether the run is of an older job than the newest on its pool (`older`: the
    entry names its job), and whether it says nothing but its status and duration (`plain`:
    most entries, which the template writes the short way)."""

    status: str
    label: str
    duration: timedelta | None
    attempt: int
    job_id: int
    pool_name: str
    error_summary: str
    figure: int = 0
    figure_template: str = ""
    failure_class: str = ""
    waiting_for: AcceleratorPool | None = None
    older: bool = False
    plain: bool = False


def stage_entry(
    run: StageRun, *, idle_pool: AcceleratorPool | None = None, older: bool = False
) -> StageEntry:
    """A board entry from a stage run (as `selectors.board.board_runs` reads it: `error_head`
    and `cell_figure` annotated, its job and the job's pool loaded); `idle_pool`: its pool,
    when no live worker serves it; `older`: the run is of a job older than the newest on its
    pool."""
    error = (getattr(run, "error_head", None) or "").strip()
    # The stage's board-cell figure (`AppStage.cell_figure_keys`), read in the database as
    # `cell_figure`: a count the cell shows when it is not zero.
    figure_template = cell_figure_template(run.stage)
    figure = _count(getattr(run, "cell_figure", None)) if figure_template else 0
    fault = failure_class(run)
    waiting_for = idle_pool if run.status == StageStatus.QUEUED else None
    return StageEntry(
        status=str(run.status),
        label=STATUS_LABELS.get(run.status, str(run.status)),
        duration=run.duration,
        attempt=run.attempt,
        job_id=run.job_id,
        pool_name=run.job.pool.name,
        error_summary=error.splitlines()[0] if error else "",
        figure=figure,
        figure_template=figure_template,
        failure_class=fault,
        waiting_for=waiting_for,
        older=older,
        plain=not (error or figure or fault or waiting_for or run.attempt > 1 or older),
    )


@dataclass(frozen=True)
class StageCell:
    """A board cell: one stage of a release, an entry per pool whose jobs hold the stage
    (empty when none does), on a release that ran on several pools (`lanes`: each entry then
    names its pool) or one. The cell takes its first entry's status and failure class, and its
    error as the tooltip when it has that one entry only (several entries carry their own).
    `plain`: the entry alone when the release ran on one pool and the entry is plain (most
    cells: the template's short way), else None."""

    stage: str
    entries: list[StageEntry]
    lanes: bool = False
    status: str = ""
    failure_class: str = ""
    title: str = ""
    plain: StageEntry | None = None


def stage_cell(stage: str, entries: list[StageEntry], *, lanes: bool) -> StageCell:
    """The cell of `stage` from its entries (one per pool that holds it); `lanes`: the release
    ran on several pools."""
    if not entries:
        return StageCell(stage=stage, entries=entries, lanes=lanes)
    first = entries[0]
    return StageCell(
        stage=stage,
        entries=entries,
        lanes=lanes,
        status=first.status,
        failure_class=first.failure_class,
        title=first.error_summary if len(entries) == 1 else "",
        plain=first if not lanes and len(entries) == 1 and first.plain else None,
    )


@dataclass(frozen=True)
class BoardRow:
    """One release on the board: its page's address, its newest job, per column a cell, its
    running jobs (pending or running, newest first: each is shown, even one whose stages a
    newer job covers), whether it ran on more than one pool (an entry then names its pool), its
    clock, its open limitations' count and most severe severity ("" when none), and a
    regression badge per pool whose newest job regressed."""

    release: ModelRelease
    url: str
    job: AdaptationJob | None
    cells: list[StageCell]
    clock: Day0Clock
    running_jobs: list[AdaptationJob] = field(default_factory=list)
    several_pools: bool = False
    limitation_count: int = 0
    limitation_worst: str = ""
    # Per pool whose newest job regressed, its badge (docs/regressions.md).
    regressions: list[RegressionBadge] = field(default_factory=list)


@dataclass(frozen=True)
class Board:
    """The release board: stage columns and release rows, newest release first."""

    columns: list[StageColumn]
    rows: list[BoardRow]


def _worst(limitations: list[Any]) -> str:
    """The most severe severity among `limitations` ("" when none)."""
    ranked = sorted(limitations, key=lambda note: SEVERITY_RANK.get(note.severity, 99))
    return str(ranked[0].severity) if ranked else ""


def board_row(
    release: ModelRelease,
    jobs: list[AdaptationJob],
    columns: list[StageColumn],
    *,
    now: datetime,
    idle: Mapping[int, AcceleratorPool],
) -> BoardRow:
    """The row of `release` with its `jobs` (newest first, runs and pool loaded) under
    `columns`."""
    by_pool: dict[int, list[AdaptationJob]] = {}
    for each in jobs:
        by_pool.setdefault(each.pool_id, []).append(each)
    entries: dict[str, list[StageEntry]] = {column.name: [] for column in columns}
    latest: dict[int, dict[str, StageRun]] = {}  # per job id, read once
    for pool_jobs in by_pool.values():
        for stage, owner in newest_job_per_stage(pool_jobs).items():
            if stage in entries:
                runs = latest.get(owner.pk)
                if runs is None:
                    runs = latest[owner.pk] = latest_runs_by_stage(owner)
                entries[stage].append(
                    stage_entry(
                        runs[stage],
                        idle_pool=idle.get(owner.pool_id),
                        older=owner is not pool_jobs[0],
                    )
                )
    limitations = list(getattr(release, "open_limitations", ()))
    badges = [regression_badge(pool_jobs[0]) for pool_jobs in by_pool.values()]
    return BoardRow(
        release=release,
        url=reverse("adaptation:release_detail", args=[release.pk]),
        job=jobs[0] if jobs else None,
        cells=[
            stage_cell(column.name, entries[column.name], lanes=len(by_pool) > 1)
            for column in columns
        ],
        clock=day0_clock(release, jobs, now=now, limitations=limitations),
        running_jobs=[j for j in jobs if j.status in (JobStatus.PENDING, JobStatus.RUNNING)],
        several_pools=len(by_pool) > 1,
        limitation_count=len(limitations),
        limitation_worst=_worst(limitations),
        regressions=[badge for badge in badges if badge is not None],
    )


def board(
    releases: Iterable[ModelRelease],
    *,
    now: datetime,
    pools_without_worker: Mapping[int, AcceleratorPool] | None = None,
) -> Board:
    """Build the board from releases as `selectors.board.board_releases` reads them (jobs
    newest first with their pool and stage runs, `open_limitations`: the clock shows each
    pool's most severe). `pools_without_worker` (by id,
    `selectors.workers.pools_without_live_worker`) marks queued stages of those pools as
    waiting."""
    idle = pools_without_worker or {}
    with_jobs = [(release, list(release.jobs.all())) for release in releases]
    columns = stage_columns(job.stages for _, jobs in with_jobs for job in jobs)
    rows = [board_row(release, jobs, columns, now=now, idle=idle) for release, jobs in with_jobs]
    return Board(columns=columns, rows=rows)
