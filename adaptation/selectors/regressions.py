"""The figures a job's regressions are judged on, where each lives in a stage's stored result,
and the reads of the baseline runs they are compared with.

A **figure** is one number a stage run measured, under a `metric` key that says what it is,
what it was measured on and at which point, so that only like is compared with like:
`"<figure>:<measured on>[:<dtype>[:<prompt tokens>]]"`, or `"duration_s:worker:<stage>"`.
"Measured on" is `twin` (the scaled twin in day0's own process), `release` (the release's
real weights in that process), `engine-twin` / `engine-release` (the pool's serving engine
serving the twin or the real weights: the serve stage), or `worker` (the worker host's clock:
a stage's duration). The figures, each from the latest attempt of its stage, and only from an
attempt that succeeded:

- `decode_tokens_per_s:<on>:<dtype>:<prompt tokens>` (tokens/s; lower is worse): the
  performance stage's knee (`result["knee"]["decode_tokens_per_s"]`, the first dtype measured
  at its first prompt length), on the twin or the real weights (`model` of the knee's point).
- `ttft_p95_s:<on>:<dtype>:<prompt tokens>` (s; higher is worse): the 95th percentile of the
  time to first token at that knee point (`ttft_p95_s` of the measured point of `points` at the
  knee's dtype, prompt length and batch size).
- `relative_logit_error:<on>:<dtype>` (a fraction; higher is worse): the precision stage's
  relative logit error against the float32 reference, per dtype checked
  (`result["dtypes"][dtype]["relative_logit_error"]`, the mean the stage judges by).
- `decode_tokens_per_s:engine-<on>:<dtype>:<prompt tokens>` (output tokens/s; lower is worse):
  the serve stage's load-sweep knee (`result["knee"]["output_tokens_per_s"]`), at the sweep's
  `input_tokens`, the dtype served (`precision.dtype`, else `checkpoint.dtype`).
- `ttft_p95_s:engine-<on>:<dtype>:<prompt tokens>` (s; higher is worse): TTFT p95 of the sweep
  level at that knee's concurrency (`result["sweep"][i]["ttft_s_p95"]`).
- `load_s:engine-<on>:<dtype>` (s; higher is worse): from the engine's launch until it answered
  (`result["load_s"]`).
- `max_abs_logprob_diff:engine-<on>:<dtype>` (natural-log probability; higher is worse): the
  engine's largest log-probability difference from transformers in float32
  (`result["precision"]["max_abs_logprob_diff"]`).
- `duration_s:worker:<stage>` (s; higher is worse): the stage run's `finished_at -
  started_at`, for every stage that succeeded.

A **good run** of a figure is a job other than the one judged, on the same pool, created
before it, whose latest attempt of the stage producing the figure succeeded and holds the
same metric key, not itself judged a regression of that metric. Its other stages do not
matter: a job that failed at `plan` still has good `fetch` and `analyze` durations. The
**baseline** is the newest `DAY0_REGRESSION_RUNS` good runs of the same release; when the
release has fewer than `MIN_BASELINE_RUNS` of them, the newest good runs of every release of
its family (`ModelRelease.family`, its own included).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from adaptation.models import AdaptationJob, BaselineScope, Regression, StageRun, StageStatus
from adaptation.selectors.jobs import job_current_stage_runs
from adaptation.stages import app_stage
from engine.formatting import finite
from engine.stages.performance.result import PerformanceResult
from engine.stages.precision.result import PrecisionStageResult
from engine.stages.serve.result import ServeResult

# Fewer good runs than this judge nothing: one run has no spread to be outside of.
MIN_BASELINE_RUNS = 2
# How many good runs of a stage a baseline read looks through, at most, per figure wanted:
# runs whose metric differs (another dtype, another prompt length) are passed over.
SCAN_FACTOR = 4

LOWER_IS_WORSE = "lower"
HIGHER_IS_WORSE = "higher"


@dataclass(frozen=True)
class FigureKind:
    """What a figure name measures: its unit, which way is worse, and whether it is a
    duration on the host's clock (which must also be worse by `DAY0_REGRESSION_FLOOR_S`)."""

    unit: str
    worse: str
    wall_time: bool = False


FIGURE_KINDS: dict[str, FigureKind] = {
    "decode_tokens_per_s": FigureKind("tokens/s", LOWER_IS_WORSE),
    "ttft_p95_s": FigureKind("s", HIGHER_IS_WORSE),
    "relative_logit_error": FigureKind("", HIGHER_IS_WORSE),
    "max_abs_logprob_diff": FigureKind("", HIGHER_IS_WORSE),
    "load_s": FigureKind("s", HIGHER_IS_WORSE, wall_time=True),
    "duration_s": FigureKind("s", HIGHER_IS_WORSE, wall_time=True),
}


@dataclass(frozen=True)
class Figure:
    """One measured figure of a stage run: `metric` (the key above), `stage`, `value` in
    `unit`."""

    metric: str
    stage: str
    value: float
    unit: str

    @property
    def kind(self) -> FigureKind:
        return FIGURE_KINDS[self.metric.split(":", 1)[0]]


@dataclass(frozen=True)
class MetricBasis:
    """A metric key read back: the figure's name, what it was measured on, the dtype and
    prompt length (tokens) it was taken at where the key has them, and the stage producing it
    (`duration_s` names it; the others' follow from the figure and what it was measured on)."""

    figure: str
    measured_on: str
    dtype: str = ""
    prompt_tokens: int | None = None
    stage: str = ""


def metric_basis(metric: str) -> MetricBasis:
    """The parts of a metric key ("decode_tokens_per_s:twin:bfloat16:32" gives figure
    "decode_tokens_per_s", measured on "twin", dtype "bfloat16", 32 prompt tokens, stage
    "performance"; "duration_s:worker:fetch" gives stage "fetch")."""
    figure, _, rest = metric.partition(":")
    on, _, rest = rest.partition(":")
    if figure == "duration_s":
        return MetricBasis(figure=figure, measured_on=on, stage=rest)
    dtype, _, tokens = rest.partition(":")
    if on.startswith("engine"):
        stage = "serve"
    else:
        stage = "precision" if figure == "relative_logit_error" else "performance"
    return MetricBasis(
        figure=figure,
        measured_on=on,
        dtype=dtype,
        prompt_tokens=int(tokens) if tokens.isdigit() else None,
        stage=stage,
    )


def _figure(metric: str, stage: str, value: Any) -> Figure | None:
    """The figure `metric` of a stored `value`: a finite number (`finite`: booleans are not
    figures), none below zero; else None."""
    number = finite(value)
    if number is None or number < 0:
        return None
    return Figure(
        metric=metric, stage=stage, value=number, unit=FIGURE_KINDS[metric.split(":")[0]].unit
    )


def performance_figures(result: Mapping[str, Any]) -> list[Figure]:
    """Decode tokens/s and TTFT p95 at the performance stage's knee (see the module
    docstring); none without a knee."""
    run = PerformanceResult.from_stored(result)
    knee = run.knee
    if knee is None or not knee.dtype:
        return []
    point = run.knee_point()
    at = f"{run.measured_model}:{knee.dtype}:{knee.prompt_len}"
    figures = [_figure(f"decode_tokens_per_s:{at}", "performance", knee.decode_tokens_per_s)]
    if point is not None:
        figures.append(_figure(f"ttft_p95_s:{at}", "performance", point.ttft_p95_s))
    return [figure for figure in figures if figure is not None]


def precision_figures(result: Mapping[str, Any]) -> list[Figure]:
    """The relative logit error of each dtype the precision stage checked."""
    read = PrecisionStageResult.from_stored(result)
    figures = [
        _figure(
            f"relative_logit_error:{read.measured_on}:{entry.dtype}",
            "precision",
            entry.relative_logit_error,
        )
        for entry in sorted(read.compared, key=lambda entry: entry.dtype)
    ]
    return [figure for figure in figures if figure is not None]


def serve_figures(result: Mapping[str, Any]) -> list[Figure]:
    """The serving engine's knee tokens/s and TTFT p95, its load time and its precision
    against transformers (see the module docstring); none for a pool without an engine."""
    served = ServeResult.from_stored(result)
    if served.checkpoint is None or not served.dtype:
        return []
    on = f"engine-{served.measured_on}:{served.dtype}"
    precision = served.precision
    figures = [
        _figure(f"load_s:{on}", "serve", served.load_s),
        _figure(
            f"max_abs_logprob_diff:{on}",
            "serve",
            precision.max_abs_logprob_diff if precision else None,
        ),
    ]
    knee, settings = served.knee, served.sweep_settings
    tokens = settings.input_tokens if settings else None
    if knee is not None and tokens is not None:
        at = f"{on}:{tokens}"
        figures.append(_figure(f"decode_tokens_per_s:{at}", "serve", knee.output_tokens_per_s))
        level = served.knee_level
        if level is not None:
            figures.append(_figure(f"ttft_p95_s:{at}", "serve", level.ttft_s_p95))
    return [figure for figure in figures if figure is not None]


def result_figures_reader(stage: str) -> Callable[[Mapping[str, Any]], list[Figure]] | None:
    """The function reading the figures of `stage`'s stored result (its
    `AppStage.regression_figures`, `adaptation/stages/<stage>.py`); None for a stage whose
    runs give their duration only (their results, which can be large, are then not read)."""
    app = app_stage(stage)
    return app.resolved("regression_figures") if app is not None else None


def run_figures(run: StageRun) -> list[Figure]:
    """The figures of one stage run: none unless it succeeded; its duration (when it has
    both times) and what its stored result holds (`result_figures_reader`; a run read without
    its result gives its duration only)."""
    if run.status != StageStatus.SUCCEEDED:
        return []
    figures: list[Figure] = []
    if run.started_at is not None and run.finished_at is not None:
        seconds = (run.finished_at - run.started_at).total_seconds()
        figure = _figure(f"duration_s:worker:{run.stage}", run.stage, round(seconds, 3))
        if figure is not None:
            figures.append(figure)
    read = result_figures_reader(run.stage)
    if read is not None and "result" in run.__dict__ and isinstance(run.result, Mapping):
        figures.extend(read(run.result))
    return figures


def job_figures(job: AdaptationJob) -> list[tuple[StageRun, Figure]]:
    """Every figure of the job's latest stage attempts that succeeded, in stage order, with
    the run it comes from."""
    return [(run, figure) for run in job_current_stage_runs(job) for figure in run_figures(run)]


@dataclass(frozen=True)
class BaselineValue:
    """One good run's value of a metric: the job and run it comes from."""

    job_id: int
    stage_run_id: int
    value: float


def _good_runs(job: AdaptationJob, stage: str, scope: str) -> QuerySet[StageRun]:
    """The latest attempts of `stage` that succeeded, of jobs on `job`'s pool created before it
    (same release, or same family), newest job first."""
    later_attempt = StageRun.objects.filter(
        job_id=OuterRef("job_id"), stage=OuterRef("stage"), attempt__gt=OuterRef("attempt")
    )
    before = Q(job__created_at__lt=job.created_at) | Q(
        job__created_at=job.created_at, job_id__lt=job.pk
    )
    runs = StageRun.objects.filter(
        before,
        stage=stage,
        status=StageStatus.SUCCEEDED,
        job__pool_id=job.pool_id,
    ).exclude(job_id=job.pk)
    if scope == BaselineScope.RELEASE:
        runs = runs.filter(job__release_id=job.release_id)
    else:
        runs = runs.filter(job__release__family=job.release.family)
    runs = runs.filter(~Exists(later_attempt)).order_by("-job__created_at", "-job_id")
    if result_figures_reader(stage) is None:
        runs = runs.defer("result")
    return runs.defer("log", "error", "attempts")


def baseline_values(
    *, job: AdaptationJob, stage: str, metrics: Iterable[str], scope: str, runs: int
) -> dict[str, list[BaselineValue]]:
    """For each of `metrics` (of `stage`), the values of its newest `runs` good runs in
    `scope` ("release" or "family"; see the module docstring), newest first, leaving out
    values that were themselves regressions. Two queries; it looks through at most
    `SCAN_FACTOR` x `runs` runs per metric. A family scope of a release without a family
    finds nothing."""
    wanted: dict[str, list[BaselineValue]] = {metric: [] for metric in metrics}
    if not wanted or (scope == BaselineScope.FAMILY and not job.release.family):
        return wanted
    # A figure that was itself a regression is not a good value: a slowdown that persists
    # would otherwise widen the spread and pass unnoticed from the next run on.
    regressed = set(
        Regression.objects.filter(
            metric__in=list(wanted), job__pool_id=job.pool_id, job__created_at__lte=job.created_at
        ).values_list("job_id", "metric")
    )
    for run in _good_runs(job, stage, scope)[: SCAN_FACTOR * runs * len(wanted)]:
        for figure in run_figures(run):
            found = wanted.get(figure.metric)
            if (run.job_id, figure.metric) in regressed:
                continue
            if found is not None and len(found) < runs:
                found.append(BaselineValue(run.job_id, run.pk, figure.value))
        if all(len(found) >= runs for found in wanted.values()):
            break
    return wanted


def job_regressions(job: AdaptationJob) -> list[Regression]:
    """The job's stored regressions, in stage order then metric (one query)."""
    rows = list(Regression.objects.filter(job=job).select_related("stage_run"))
    # A row whose stage run was deleted sorts last.
    return sorted(rows, key=lambda r: (r.stage_run.position if r.stage_run else math.inf, r.metric))


def regressions_of_jobs(job_ids: Iterable[int]) -> list[Regression]:
    """The stored regressions of `job_ids`, by job then metric (one query)."""
    ids = list(job_ids)
    if not ids:
        return []
    return list(Regression.objects.filter(job_id__in=ids).order_by("job_id", "metric"))


def release_ids_of_jobs(job_ids: Iterable[int]) -> dict[int, int]:
    """The release id of each of `job_ids` (the baseline jobs a regression links, which may be
    another release's in a family baseline), in one query."""
    ids = list(set(job_ids))
    if not ids:
        return {}
    return dict(AdaptationJob.objects.filter(pk__in=ids).values_list("pk", "release_id"))


def regressions_detected_between(
    *, start: datetime, end: datetime, pools: Iterable[str] = ()
) -> tuple[int, int]:
    """(regressions, jobs that regressed) detected from `start` to before `end`, of jobs on
    `pools` (names; every pool when empty), whatever their release's discovery date: a
    regression is news when it is found (one aggregate query). A regression judged again keeps
    its first `detected_at`; one a re-run cleared is gone."""
    rows = Regression.objects.filter(detected_at__gte=start, detected_at__lt=end)
    names = list(pools)
    if names:
        rows = rows.filter(job__pool__name__in=names)
    counts = rows.aggregate(regressions=Count("id"), jobs=Count("job", distinct=True))
    return counts["regressions"] or 0, counts["jobs"] or 0
