"""The release board: a row per release (its newest job's stage cells and its Day-0 clock),
a column per stage."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from adaptation.models import AcceleratorPool, AdaptationJob, ModelRelease, StageRun, StageStatus
from adaptation.presenters.day0_clock import Day0Clock, day0_clock
from adaptation.presenters.stages import StageColumn, stage_columns
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
    """The latest attempt of one stage of a release's newest job, as a board cell: the run,
    the pool no live worker serves when the run is queued there (None otherwise), the first
    line of its error (the cell's tooltip) and, for a stage in `CELL_FIGURES`, its figure
    (`figure_template` words it)."""

    run: StageRun
    waiting_for: AcceleratorPool | None
    error_summary: str
    figure: int = 0
    figure_template: str = ""


def stage_cell(run: StageRun, *, idle_pool: AcceleratorPool | None = None) -> StageCell:
    """A board cell from a stage run; `idle_pool`: its pool, when no live worker serves it."""
    error = run.error.strip()
    figure = CELL_FIGURES.get(run.stage)
    return StageCell(
        run=run,
        waiting_for=idle_pool if run.status == StageStatus.QUEUED else None,
        error_summary=error.splitlines()[0] if error else "",
        figure=figure(as_mapping(run.result)) if figure is not None else 0,
        figure_template=cell_figure_template(run.stage) if figure is not None else "",
    )


@dataclass(frozen=True)
class BoardRow:
    """One release on the board: its newest job, one cell per column, and its clock."""

    release: ModelRelease
    job: AdaptationJob | None
    cells: list[StageCell | None]
    clock: Day0Clock


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
    columns = stage_columns(jobs[0].stages for _, jobs in with_jobs if jobs)
    rows = []
    for release, jobs in with_jobs:
        job = jobs[0] if jobs else None
        latest = latest_runs_by_stage(job) if job is not None else {}
        idle_pool = idle.get(job.pool_id) if job is not None else None
        cells = [
            stage_cell(latest[column.name], idle_pool=idle_pool) if column.name in latest else None
            for column in columns
        ]
        clock = day0_clock(
            release, jobs, now=now, limitations=getattr(release, "open_limitations", ())
        )
        rows.append(BoardRow(release=release, job=job, cells=cells, clock=clock))
    return Board(columns=columns, rows=rows)
