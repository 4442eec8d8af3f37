"""The reports pages' values, from the figures `adaptation.domain.reports` reduces (what each
figure means is said there): the time-to-Day-0 chart's points, the CSV's cells (the numbers the
page prints) and the managers' readiness board (releases x pools, from
`selectors.reports.readiness_rows`: four queries).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.core.paginator import Page

from adaptation.domain.reports import ReleaseRow, Throughput, hours
from adaptation.presenters.stages import stage_title
from adaptation.selectors.reports import ReadinessRows


def chart_points(rows: Iterable[ReleaseRow]) -> list[dict[str, Any]]:
    """The ready releases as points of the time-to-Day-0 chart, oldest first: when the clock
    started (publication, else discovery), the hours, the release and the basis."""
    points = [
        {
            "at": row.basis_at,
            "hours": row.time_to_day0_h,
            "repo_id": row.repo_id,
            "basis": row.day0_basis,
        }
        for row in rows
        if row.time_to_day0_h is not None
    ]
    return sorted(points, key=lambda point: point["at"])


# --- CSV ---------------------------------------------------------------------------------------

CSV_COLUMNS = (
    "release_id",
    "repo_id",
    "revision",
    "status",
    "readiness",
    "blocking_stage",
    "published_at",
    "discovered_at",
    "ready_at",
    "time_to_detect_h",
    "time_to_day0_h",
    "day0_basis",
    "within_24h",
    "failed_stages",
    "failure_reasons",
    "open_limitations",
    "full_size_output_tokens_per_s",
    "full_size_basis",
    "full_size_pool",
    "full_size_input_tokens",
    "full_size_output_tokens",
    "full_size_concurrency",
    "full_size_tp",
)
# What a throughput rests on, in the CSV's `full_size_basis`.
CSV_BASIS = {
    "measured": "measured-engine-full-size-dummy-weights",
    "predicted": "predicted-full-size",
}


def _iso(moment: datetime | None) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z") if moment else ""


def _number(value: float | None) -> str:
    """A figure as the page prints it ("5.0", "0.17"); "" for None."""
    return "" if value is None else str(value)


def csv_row(row: ReleaseRow) -> list[str]:
    """A report row as CSV cells, in `CSV_COLUMNS` order: the numbers the page prints."""
    return [
        str(row.release_id),
        row.repo_id,
        row.revision,
        row.status,
        row.readiness,
        row.blocking_stage,
        _iso(row.published_at),
        _iso(row.discovered_at),
        _iso(row.ready_at),
        _number(row.time_to_detect_h),
        _number(row.time_to_day0_h),
        row.day0_basis,
        "yes" if row.within_24h else "no",
        "; ".join(f"{failed.stage} x{failed.attempts}" for failed in row.failed_stages),
        " | ".join(
            f"{failed.stage}: {failed.error}"
            + (f" ({failed.failure_class})" if failed.failure_class else "")
            for failed in row.failed_stages
        ),
        str(row.open_limitations),
        *_throughput_cells(row.throughput),
    ]


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def _throughput_cells(throughput: Throughput | None) -> list[str]:
    """The CSV's full-size cells: tokens/s (rounded to 0.1), basis, pool, lengths,
    concurrency and TP ("" where the figure has none)."""
    if throughput is None or throughput.output_tokens_per_s is None:
        return [""] * 7
    return [
        str(round(throughput.output_tokens_per_s, 1)),
        CSV_BASIS[throughput.kind],
        throughput.pool,
        _cell(throughput.input_tokens),
        _cell(throughput.output_tokens),
        _cell(throughput.concurrency),
        _cell(throughput.tp),
    ]


# --- the managers' readiness board ---------------------------------------------------------------


@dataclass(frozen=True)
class ReadinessCell:
    """A release on a pool: its latest job there (`job_id` None when it has none), that job's
    level and blocking stage, and the release's time to Day-0 on the pool (its first ready
    job there)."""

    pool: str
    job_id: int | None = None
    status: str = ""
    readiness: str = ""
    blocking_stage: str = ""
    ready_at: datetime | None = None
    time_to_day0_h: float | None = None

    @property
    def blocking_title(self) -> str:
        return stage_title(self.blocking_stage) if self.blocking_stage else ""


@dataclass(frozen=True)
class ReadinessRow:
    release_id: int
    repo_id: str
    revision: str
    day0_basis: str
    cells: list[ReadinessCell]


@dataclass(frozen=True)
class ReadinessBoard:
    pools: list[str]
    rows: list[ReadinessRow]
    page: Page


def readiness_board(read: ReadinessRows) -> ReadinessBoard:
    """Rows of releases (what `selectors.reports.readiness_rows` read: a page, newest
    discovered first), columns of pools, each cell the release's readiness there: its latest
    job on the pool and its first ready one."""
    latest: dict[tuple[int, str], Any] = {}
    first_ready: dict[tuple[int, str], datetime] = {}
    for job in read.jobs:  # newest first
        key = (job.release_id, job.pool)
        latest.setdefault(key, job)
        if job.ready_at is not None and (key not in first_ready or job.ready_at < first_ready[key]):
            first_ready[key] = job.ready_at
    rows = []
    for pk, repo_id, revision, published, discovered in read.releases:
        start = published if published is not None else discovered
        cells: list[ReadinessCell] = []
        for pool in read.pools:
            job = latest.get((pk, pool))
            ready = first_ready.get((pk, pool))
            cells.append(
                ReadinessCell(pool=pool)
                if job is None
                else ReadinessCell(
                    pool=pool,
                    job_id=job.job_id,
                    status=job.status,
                    readiness=job.readiness,
                    blocking_stage=job.blocking_stage,
                    ready_at=ready,
                    time_to_day0_h=hours((ready - start).total_seconds()) if ready else None,
                )
            )
        rows.append(
            ReadinessRow(
                release_id=pk,
                repo_id=repo_id,
                revision=revision,
                day0_basis="publication" if published is not None else "discovery",
                cells=cells,
            )
        )
    return ReadinessBoard(pools=read.pools, rows=rows, page=read.page)
