"""Regressions as the pages show them: the release page's finding (each regression of the jobs
it draws in full, with its baseline and links to the jobs compared with) and the board's badge
(per pool, the newest job's regressions counted and named). Values only: the words are in
`templates/adaptation/partials/regression*.html`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from django.urls import reverse

from adaptation.models import AdaptationJob, Regression
from adaptation.presenters.stages import stage_title
from adaptation.selectors.regressions import (
    FIGURE_KINDS,
    metric_basis,
    regressions_of_jobs,
    release_ids_of_jobs,
)


@dataclass(frozen=True)
class BaselineJob:
    """A job a figure was compared with, and where its timeline is."""

    job_id: int
    url: str


@dataclass(frozen=True)
class BadgeFigure:
    """A regressed figure as a title names it (the board's badge, the suite matrix's cell,
    and each `RegressionItem`, which extends it): what the figure is."""

    figure: str
    measured_on: str
    dtype: str
    prompt_tokens: int | None
    stage: str
    stage_title: str


def badge_figure(metric: str) -> BadgeFigure:
    """What the figure of `metric` (a regression's metric key) is, for
    `partials/regression_figure.html` and `partials/regression_measured_on.html`."""
    basis = metric_basis(metric)
    return BadgeFigure(
        figure=basis.figure,
        measured_on=basis.measured_on,
        dtype=basis.dtype,
        prompt_tokens=basis.prompt_tokens,
        stage=basis.stage,
        stage_title=stage_title(basis.stage) if basis.stage else "",
    )


@dataclass(frozen=True)
class RegressionItem(BadgeFigure):
    """One regression: what the figure is (`BadgeFigure`: its `FIGURE_KINDS` name, what it
    was measured on, its dtype and prompt length, its stage), the value and the baseline's
    median, lowest and highest in `unit`, which way is worse (`worse`: "lower" or "higher"),
    how much worse than the median (`worse_by_percent`) against the margin
    (`margin_percent`) and, for a duration, the least worsening it needed (`floor`, in
    `unit`; 0 for other figures), the scope ("release" or "family") and the good runs
    compared with, newest first."""

    metric: str
    unit: str
    value: float
    median: float
    low: float
    high: float
    worse: str
    worse_by_percent: float
    margin_percent: float
    floor: float
    scope: str
    baseline: list[BaselineJob]


@dataclass(frozen=True)
class JobRegressions:
    """A job's regressions, in stage order then metric."""

    job: AdaptationJob
    items: list[RegressionItem]


def _job_url(job_id: int, release_id: int | None) -> str:
    if release_id is None:
        return ""
    page = reverse("adaptation:release_detail", args=[release_id])
    return f"{page}?job={job_id}#job-{job_id}"


def regression_item(regression: Regression, releases: dict[int, int]) -> RegressionItem:
    """The values of one stored regression; `releases` maps its baseline jobs to their
    releases (`selectors.regressions.release_ids_of_jobs`)."""
    what = badge_figure(regression.metric)
    kind = FIGURE_KINDS.get(what.figure)
    return RegressionItem(
        **asdict(what),
        metric=regression.metric,
        unit=regression.unit,
        value=regression.value,
        median=regression.baseline_median,
        low=regression.baseline_low,
        high=regression.baseline_high,
        worse=kind.worse if kind else "",
        worse_by_percent=round(100 * regression.worse_by, 1),
        margin_percent=round(100 * regression.margin, 1),
        floor=regression.floor,
        scope=regression.scope,
        baseline=[
            BaselineJob(job_id=pk, url=_job_url(pk, releases.get(pk)))
            for pk in regression.baseline_jobs
        ],
    )


def _stage_order(job: AdaptationJob, item: RegressionItem) -> tuple[int, str]:
    stages = list(job.stages or [])
    return (stages.index(item.stage) if item.stage in stages else len(stages), item.metric)


def jobs_regressions(jobs: Iterable[AdaptationJob]) -> list[JobRegressions]:
    """The regressions of `jobs` (the release page's jobs drawn in full, newest first), one
    entry per job that has any, in the jobs' order (two queries; none without regressions
    but the first)."""
    jobs = list(jobs)
    rows = regressions_of_jobs(job.pk for job in jobs)
    if not rows:
        return []
    releases = release_ids_of_jobs(pk for row in rows for pk in row.baseline_jobs)
    by_job: dict[int, list[RegressionItem]] = {}
    for row in rows:
        by_job.setdefault(row.job_id, []).append(regression_item(row, releases))
    return [
        JobRegressions(
            job=job, items=sorted(by_job[job.pk], key=lambda item: _stage_order(job, item))
        )
        for job in jobs
        if job.pk in by_job
    ]


@dataclass(frozen=True)
class RegressionBadge:
    """The board's badge for one pool of a release: its newest job there (`job_id`) regressed
    in `count` figures, named by `items`."""

    pool_name: str
    job_id: int
    count: int
    items: list[BadgeFigure]


def regression_badge(job: AdaptationJob) -> RegressionBadge | None:
    """The badge of `job` (the newest on its pool; its pool and its `regressions` prefetched
    with their metric, as `selectors.board` reads them); None when it has none."""
    rows = list(job.regressions.all())
    if not rows:
        return None
    items = [badge_figure(row.metric) for row in rows]
    return RegressionBadge(pool_name=job.pool.name, job_id=job.pk, count=len(items), items=items)
