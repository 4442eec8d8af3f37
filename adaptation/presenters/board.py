"""The release board: a row per release (per stage, the newest job on each pool that ran it;
its running jobs; its Day-0 clock), a column per stage."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    JobStatus,
    ModelRelease,
    StageRun,
    StageStatus,
)
from adaptation.presenters.day0_clock import Day0Clock, day0_clock, newest_job_per_stage
from adaptation.presenters.stages import StageColumn, failure_class, stage_columns
from adaptation.selectors.jobs import latest_runs_by_stage
from engine.formatting import finite
from engine.stored import as_mapping


def _missing_operators(result: Mapping[str, Any]) -> int:
    return int(finite(as_mapping(result.get("counts")).get("missing")) or 0)


# A stage's figure on its board cells, from a run's stored result: a count the cell shows
# when it is not zero, worded by `templates/adaptation/board_cells/<stage>.html`.
CELL_FIGURES: dict[str, Callable[[Mapping[str, Any]], int]] = {
    "operators": _missing_operators,
}


def cell_figure_template(stage: str) -> str:
    """The template that words `stage`'s board-cell figure."""
    return f"adaptation/board_cells/{stage}.html"


@dataclass(frozen=True)
class StageCell:
    """The latest attempt of one stage of the newest job on a pool that ran it, as a board
    cell: the run, the pool no live worker serves when the run is queued there (None
    otherwise), the first line of its error (the cell's tooltip), for a stage in
    `CELL_FIGURES` its figure (`figure_template` words it), the failed run's class
    ("infrastructure", "release", or "" when unclassified or not failed), and whether the run
    is of an older job than the newest on its pool (`older`: the cell names its job)."""

    run: StageRun
    waiting_for: AcceleratorPool | None
    error_summary: str
    figure: int = 0
    figure_template: str = ""
    failure_class: str = ""
    older: bool = False

    @property
    def job_id(self) -> int:
        return self.run.job_id


def stage_cell(
    run: StageRun, *, idle_pool: AcceleratorPool | None = None, older: bool = False
) -> StageCell:
    """A board cell from a stage run; `idle_pool`: its pool, when no live worker serves it;
    `older`: the run is of a job older than the newest on its pool."""
    error = run.error.strip()
    figure = CELL_FIGURES.get(run.stage)
    return StageCell(
        run=run,
        waiting_for=idle_pool if run.status == StageStatus.QUEUED else None,
        error_summary=error.splitlines()[0] if error else "",
        figure=figure(as_mapping(run.result)) if figure is not None else 0,
        figure_template=cell_figure_template(run.stage) if figure is not None else "",
        failure_class=failure_class(run),
        older=older,
    )


@dataclass(frozen=True)
class BoardRow:
    """One release on the board: its newest job, per column the cells of each pool its jobs
    ran on (the newest job there that ran the stage: `day0_clock.newest_job_per_stage`; a
    list, empty where no job holds the stage), its running jobs (pending or running, newest
    first: each is shown, even one whose stages a newer job covers), whether it ran on more
    than one pool (a cell then names its pool), and its clock."""

    release: ModelRelease
    job: AdaptationJob | None
    cells: list[list[StageCell]]
    clock: Day0Clock
    running_jobs: list[AdaptationJob] = field(default_factory=list)
    several_pools: bool = False


@dataclass(frozen=True)
class Board:
    """The release board: stage columns and release rows, newest release first."""

    columns: list[StageColumn]
    rows: list[BoardRow]


def board(
    releases: Iterable[ModelRelease],
    *,
    now: datetime,
    pools_without_worker: Mapping[int, AcceleratorPool] | None = None,
) -> Board:
    """Build the board from releases whose jobs and stage runs are prefetched (newest job
    first, as `selectors.releases_for_board` returns them, with `open_limitations`: the clock
    shows each pool's most severe). `pools_without_worker` (by id,
    `selectors.workers.pools_without_live_worker`) marks queued stages of those pools as
    waiting."""
    idle = pools_without_worker or {}
    with_jobs = [(release, list(release.jobs.all())) for release in releases]
    columns = stage_columns(job.stages for _, jobs in with_jobs for job in jobs)
    rows = []
    for release, jobs in with_jobs:
        job = jobs[0] if jobs else None
        by_pool: dict[int, list[AdaptationJob]] = {}
        for each in jobs:
            by_pool.setdefault(each.pool_id, []).append(each)
        cells: list[list[StageCell]] = [[] for _ in columns]
        for pool_jobs in by_pool.values():
            owners = newest_job_per_stage(pool_jobs)
            for index, column in enumerate(columns):
                owner = owners.get(column.name)
                if owner is None:
                    continue
                cells[index].append(
                    stage_cell(
                        latest_runs_by_stage(owner)[column.name],
                        idle_pool=idle.get(owner.pool_id),
                        older=owner is not pool_jobs[0],
                    )
                )
        clock = day0_clock(
            release, jobs, now=now, limitations=getattr(release, "open_limitations", ())
        )
        running = [j for j in jobs if j.status in (JobStatus.PENDING, JobStatus.RUNNING)]
        rows.append(
            BoardRow(
                release=release,
                job=job,
                cells=cells,
                clock=clock,
                running_jobs=running,
                several_pools=len(by_pool) > 1,
            )
        )
    return Board(columns=columns, rows=rows)
