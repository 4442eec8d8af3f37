"""The compare-performance page (two jobs' performance curves overlaid on the same axes) and
the performance CSV of one job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.urls import reverse
from django.utils.text import slugify

from adaptation.models import AdaptationJob, StageRun
from adaptation.presenters.chart_slot import ChartSlot
from adaptation.presenters.performance_view import (
    PerformanceView,
    chart_source,
    off_axis,
    view_charts,
)
from engine.stages.performance.result import Knee, PerformanceResult


class CompareError(Exception):
    """A compare request that cannot be answered, and why (`problem`), for
    `partials/compare_error.html` to say; `status` 400 (bad ids) or 404.

    `problem` is "no-jobs" (none named), "not-whole-numbers" (`given`: the values that are
    not, each cut to 20 characters), "not-two" (`ids`: the ids named), "same-twice" (`ids`:
    the one named twice), "missing" (`ids`: those with no job) or "no-rows" (`job`: a job
    without stored performance rows)."""

    def __init__(
        self,
        problem: str,
        status: int,
        *,
        ids: Sequence[int] = (),
        given: Sequence[str] = (),
        job: AdaptationJob | None = None,
    ) -> None:
        super().__init__(problem)
        self.problem = problem
        self.status = status
        self.ids = tuple(ids)
        self.given = tuple(given)
        self.job = job


def compare_job_ids(values: Sequence[str]) -> list[int]:
    """Two distinct job ids from `jobs` values ("12,34", or two values "12" and "34").
    Raises `CompareError` (400) naming what is wrong."""
    parts = [p.strip() for v in values for p in str(v).split(",") if p.strip()]
    if not parts:
        raise CompareError("no-jobs", 400)
    bad = [p for p in parts if not p.isascii() or not p.isdigit() or len(p) > 12]
    if bad:
        raise CompareError("not-whole-numbers", 400, given=[b[:20] for b in bad])
    ids = [int(p) for p in parts]
    if len(ids) != 2:
        raise CompareError("not-two", 400, ids=ids)
    if ids[0] == ids[1]:
        raise CompareError("same-twice", 400, ids=ids[:1])
    return ids


@dataclass
class CompareJob:
    """One job of a comparison, with its performance run's rows and result."""

    job: AdaptationJob
    run: StageRun
    rows: list[dict[str, Any]]
    result: PerformanceResult

    @property
    def knees(self) -> list[Knee]:
        """Each dtype's knee, in the order measured."""
        return list(self.result.knee_by_dtype.values())

    @property
    def csv_url(self) -> str:
        return reverse("adaptation:job_performance_csv", args=[self.job.pk])


@dataclass
class Comparison:
    """Two jobs' curves in one view: whether they are of the same release (on two pools) or
    on the same pool (two releases), their charts, and the curves the charts leave out."""

    view: PerformanceView
    jobs: list[CompareJob]
    charts: list[ChartSlot]
    same_release: bool
    same_pool: bool
    off_axis: list[tuple[str, str]] = field(default_factory=list)

    @property
    def jobs_query(self) -> str:
        return ",".join(str(c.job.pk) for c in self.jobs)


def compare_performance(
    job_ids: Sequence[int],
    view: PerformanceView,
    *,
    jobs: Mapping[int, AdaptationJob],
    runs: Mapping[int, StageRun | None],
    rows_by_run: Mapping[int, list[dict[str, Any]]],
) -> Comparison:
    """Both jobs' performance rows overlaid on the same axes, from what the view read: `jobs`
    by id (release and pool loaded), each one's newest finished performance run by job id,
    and those runs' points by run id (`selectors.performance`). Raises `CompareError` (404)
    for a job that does not exist or has no stored performance rows."""
    missing = [i for i in job_ids if i not in jobs]
    if missing:
        raise CompareError("missing", 404, ids=missing)
    compared = []
    for pk in job_ids:
        job, run = jobs[pk], runs.get(pk)
        rows = list(rows_by_run.get(run.pk, ())) if run is not None else []
        if run is None or not rows:
            raise CompareError("no-rows", 404, job=job)
        compared.append(CompareJob(job, run, rows, PerformanceResult.from_stored(run.result)))
    a, b = (c.job for c in compared)
    sources = [
        chart_source(
            rows=c.rows, result=c.result, release=c.job.release.repo_id, pool=c.job.pool.name
        )
        for c in compared
    ]
    slots = view_charts(sources, view, stem="compare-performance")
    return Comparison(
        view=view,
        jobs=compared,
        charts=slots,
        same_release=a.release_id == b.release_id,
        same_pool=a.pool_id == b.pool_id,
        off_axis=off_axis([r for c in compared for r in c.rows], view) if slots else [],
    )


def csv_filename(job: AdaptationJob) -> str:
    """day0-job-12-deepseek-ai-deepseek-v3-h200x8-performance.csv"""
    repo = slugify(job.release.repo_id.replace("/", "-"))
    return f"day0-job-{job.pk}-{repo}-{slugify(job.pool.name)}-performance.csv"


def csv_cell(value: Any) -> str:
    """A CSV cell: "" for None, an integral float as an integer (bytes: 1189212160, not
    1189212160.0), else the shortest exact repr of a float."""
    if value is None:
        return ""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 2**53:
            return str(int(value))
        return repr(value)
    return str(value)
