"""Regressions: each measured figure of a finished job against the last good runs of the same
release (else family) on the same pool (`adaptation.selectors.regressions` says which figures,
where each comes from, and what a good run is).

A figure is a **regression** when, against its baseline (at least `MIN_BASELINE_RUNS` good
runs, at most `DAY0_REGRESSION_RUNS`):

- it lies outside their spread (below the lowest for tokens/s, above the highest for a time,
  an error or a duration), and
- it is worse than their median by more than `DAY0_REGRESSION_MARGIN` (a fraction of the
  median), and
- for a duration on the host's clock (a stage's, the engine's `load_s`), it is also worse than
  the median by at least `DAY0_REGRESSION_FLOOR_S` seconds.

A baseline whose median is zero judges nothing (no fraction of zero can be taken).
`regressions_detect` is run when a job ends (succeeded or failed: `services.jobs.
job_refresh_status`), again after a re-run stage ends it again, and is idempotent: the job's
stored regressions become exactly what its current stage attempts show (one row per metric;
rows no longer true are deleted; a row found again keeps its `detected_at`).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from adaptation.models import AdaptationJob, BaselineScope, NotificationEvent, Regression
from adaptation.notifications.services import notifications_emit_safely
from adaptation.selectors.regressions import (
    LOWER_IS_WORSE,
    MIN_BASELINE_RUNS,
    BaselineValue,
    Figure,
    baseline_values,
    job_figures,
    job_regressions,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    """A figure judged against its baseline values: their median, lowest and highest, and the
    fraction the figure is worse than the median (negative when better)."""

    median: float
    low: float
    high: float
    worse_by: float
    regressed: bool


def judge(
    value: float,
    baseline: list[float],
    *,
    worse: str,
    margin: float,
    floor: float = 0.0,
) -> Verdict | None:
    """`value` against `baseline` (the good runs' values, in the same unit): None when there
    are fewer than `MIN_BASELINE_RUNS` values or their median is zero, else the verdict.
    `worse` is "lower" (tokens/s) or "higher" (times, errors); `margin` a fraction of the
    median; `floor` the least absolute difference from the median (in the figure's unit) a
    regression also needs."""
    if len(baseline) < MIN_BASELINE_RUNS:
        return None
    median = statistics.median(baseline)
    if median == 0:
        return None
    low, high = min(baseline), max(baseline)
    if worse == LOWER_IS_WORSE:
        worse_by = (median - value) / median
        outside = value < low
    else:
        worse_by = (value - median) / median
        outside = value > high
    regressed = outside and worse_by > margin and abs(value - median) >= floor
    return Verdict(median=median, low=low, high=high, worse_by=worse_by, regressed=regressed)


@dataclass(frozen=True)
class Found:
    """A regression found, before it is stored."""

    figure: Figure
    stage_run_id: int
    verdict: Verdict
    baseline: list[BaselineValue]
    scope: str
    floor: float


def _baselines(
    job: AdaptationJob, stage: str, metrics: list[str], runs: int
) -> dict[str, tuple[str, list[BaselineValue]]]:
    """Per metric of `stage`: the scope used and its good runs' values. The release's own runs
    first; the family's for the metrics the release has too few of."""
    own = baseline_values(
        job=job, stage=stage, metrics=metrics, scope=BaselineScope.RELEASE, runs=runs
    )
    chosen = {m: (BaselineScope.RELEASE.value, values) for m, values in own.items()}
    short = [m for m, values in own.items() if len(values) < MIN_BASELINE_RUNS]
    if short and job.release.family:
        family = baseline_values(
            job=job, stage=stage, metrics=short, scope=BaselineScope.FAMILY, runs=runs
        )
        for metric, values in family.items():
            if len(values) > len(own[metric]):
                chosen[metric] = (BaselineScope.FAMILY.value, values)
    return chosen


def regressions_find(job: AdaptationJob) -> list[Found]:
    """The regressions of `job`'s current figures (nothing is stored). A few queries per stage
    with figures: its runs, then the release's and, where needed, the family's good runs."""
    runs = settings.DAY0_REGRESSION_RUNS
    margin = settings.DAY0_REGRESSION_MARGIN
    by_stage: dict[str, list[tuple[int, Figure]]] = {}
    for run, figure in job_figures(job):
        by_stage.setdefault(run.stage, []).append((run.pk, figure))
    found: list[Found] = []
    for stage, figures in by_stage.items():
        baselines = _baselines(job, stage, [figure.metric for _, figure in figures], runs)
        for run_id, figure in figures:
            scope, values = baselines[figure.metric]
            kind = figure.kind
            floor = settings.DAY0_REGRESSION_FLOOR_S if kind.wall_time else 0.0
            verdict = judge(
                figure.value,
                [each.value for each in values],
                worse=kind.worse,
                margin=margin,
                floor=floor,
            )
            if verdict is not None and verdict.regressed:
                found.append(Found(figure, run_id, verdict, values, scope, floor))
    return found


def regressions_detect(*, job: AdaptationJob) -> list[Regression]:
    """Judge the job's current figures and store what regressed, one `Regression` per metric
    (see the module docstring); re-running it stores nothing twice. Returns the job's
    regressions as stored, in stage order. Database errors propagate
    (`regressions_detect_safely` is for the job's own bookkeeping)."""
    job = AdaptationJob.objects.select_related("release", "pool").get(pk=job.pk)
    found = regressions_find(job)
    margin = settings.DAY0_REGRESSION_MARGIN
    now = timezone.now()
    with transaction.atomic():
        kept = {each.figure.metric for each in found}
        Regression.objects.filter(job=job).exclude(metric__in=kept).delete()
        for each in found:
            fields = {
                "stage_run_id": each.stage_run_id,
                "unit": each.figure.unit,
                "value": each.figure.value,
                "baseline_median": each.verdict.median,
                "baseline_low": each.verdict.low,
                "baseline_high": each.verdict.high,
                "baseline_jobs": [value.job_id for value in each.baseline],
                "scope": each.scope,
                "margin": margin,
                "floor": each.floor,
                "worse_by": round(each.verdict.worse_by, 6),
            }
            # A row found again keeps its first detection time.
            Regression.objects.update_or_create(
                job=job,
                metric=each.figure.metric,
                defaults=fields,
                create_defaults={**fields, "detected_at": now},
            )
    return job_regressions(job)


def regressions_detect_safely(*, job: AdaptationJob) -> list[Regression]:
    """`regressions_detect` that never raises, then the `regression.detected` notification
    when the job has any (one per finish of the job, listing them all): for the stage flow,
    which a detection problem must not break. Its writes run in a savepoint, so a failure
    rolls back only them; it is logged. Returns the regressions ([] after a failure)."""
    try:
        with transaction.atomic():
            found = regressions_detect(job=job)
    except Exception:
        logger.exception("Could not judge the figures of job %s against its baseline", job.pk)
        return []
    if found:
        logger.info(
            "Job %s regressed: %s", job.pk, ", ".join(regression.metric for regression in found)
        )
        notifications_emit_safely(event=NotificationEvent.REGRESSION_DETECTED, job=job)
    return found
