"""The release page's Performance section: each job's newest finished `performance` attempt,
drawn in the view the page's query string asks for, with its knee, out-of-memory stops,
problems, calibration and a table of the same numbers.

Curves are drawn from the job's `PerformancePoint` rows (read by `selectors.performance` and
handed in), the knee, the stops and the notes from the stage's result. Measured figures are
the scaled twin's on the pool's device; predicted ones for the full-size model are the
planner's step-time model on the pool's accelerators; they live in separate panels of every chart,
and every trace name says which it is.

Beside them, where the job's serve stage measured it, the full-size model on the pool's
engine with dummy weights (`EngineFullSize`: measured · engine · full size · dummy weights),
each workload beside the plan's prediction for the same lengths and the fit it names, on
shared axes: both are the full-size model's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.urls import reverse

from adaptation.charts import full_size as full_size_charts
from adaptation.charts.performance_metrics import (
    METRICS,
    is_efficiency,
    metric_info,
)
from adaptation.models import AdaptationJob, ModelRelease, StageRun, StageStatus
from adaptation.presenters.chart_slot import ChartSlot
from adaptation.presenters.performance_points import PointTable, point_table
from adaptation.presenters.performance_predictions import (
    CalibratedFullSize,
    FullSizePrediction,
    TwinCalibration,
    calibrated_full_size,
    full_size_prediction,
    twin_calibration,
)
from adaptation.presenters.performance_view import (
    PerformanceView,
    chart_source,
    off_axis,
    performance_view,
    view_charts,
    x_choices,
)
from adaptation.presenters.release_jobs import release_jobs
from adaptation.presenters.stages import SkippedBecause, finished_run, skipped_because
from adaptation.selectors.jobs import latest_runs_by_stage
from adaptation.selectors.performance import PERFORMANCE_STAGE
from engine.stages.performance.result import Knee, PerformanceResult, SweepOptions
from engine.stages.plan.result import PlanResult, PlanWorkload
from engine.stages.serve.full_size_result import (
    FullSizeRun,
    WorkloadComparison,
    comparisons,
    full_size_run,
)

# --- the release page's performance panel ---------------------------------------------------


@dataclass(frozen=True)
class Problems:
    """What the sweep could not measure: points where the twin raised (dtype, prompt length,
    batch, error), dtypes not measured (dtype, why) and prompt lengths not measured (length,
    why)."""

    errors: list[tuple[str | None, int | None, int | None, str]]
    skipped_dtypes: list[tuple[str, str]]
    skipped_prompts: list[tuple[int | None, str]]

    @property
    def any(self) -> bool:
        return bool(self.errors or self.skipped_dtypes or self.skipped_prompts)


def _problems(result: PerformanceResult) -> Problems:
    return Problems(
        errors=[(e.dtype, e.prompt_len, e.batch_size, e.error) for e in result.errors],
        skipped_dtypes=list(result.skipped_dtypes.items()),
        skipped_prompts=list(result.skipped_prompt_lens),
    )


@dataclass(frozen=True)
class Sweep:
    """How a performance run measured: the device and backend, the twin's parameters, the
    timer and memory reading, the sweep (`swept`: the result says; batches 1 to
    `max_batch_size`, the prompt lengths, the timed steps and warm-ups of decode and
    prefill), the CPU threads and how long it took (s)."""

    device: str | None
    backend: str | None
    twin_parameters: float | None
    timer: str
    memory_kind: str
    memory_method: str
    swept: bool
    max_batch_size: int | None
    prompt_lens: list[int]
    repeats: int | None
    warmup: int | None
    prefill_repeats: int | None
    prefill_warmup: int | None
    threads: int | None
    duration_s: float | None


def _sweep(result: PerformanceResult) -> Sweep:
    options = result.options or SweepOptions()
    return Sweep(
        device=result.device,
        backend=result.backend,
        twin_parameters=result.twin_parameters,
        timer=result.timer or "",
        memory_kind=result.memory_kind or "",
        memory_method=result.memory_method or "",
        swept=result.options is not None,
        max_batch_size=options.max_batch_size,
        prompt_lens=list(options.prompt_lens),
        repeats=options.repeats,
        warmup=options.warmup,
        prefill_repeats=options.prefill_repeats,
        prefill_warmup=options.prefill_warmup,
        threads=result.threads,
        duration_s=result.duration_s,
    )


SERVE_STAGE = "serve"
PLAN_STAGE = "plan"


@dataclass(frozen=True)
class EngineFullSize:
    """The full-size model measured on the job's engine with dummy weights (its newest serve
    attempt's `full_size`) beside the plan's prediction for the same workloads: the run, each
    workload it measured with the prediction for its lengths (`comparisons`, the primary
    first), a chart per workload (`charts`, named by the workload's key) and the plan's own
    workload (None when the plan predicted none)."""

    run: FullSizeRun
    comparisons: list[WorkloadComparison]
    charts: list[ChartSlot]
    plan: PlanWorkload | None

    @property
    def best(self) -> WorkloadComparison | None:
        """The primary workload's comparison (None when it measured no level)."""
        return next((c for c in self.comparisons if c.workload.primary), None)


def _workload_chart(comparison: WorkloadComparison, stem: str) -> ChartSlot | None:
    workload, prediction = comparison.workload, comparison.prediction
    figure = full_size_charts.workload_curves(
        workload.levels,
        prediction.points if prediction else [],
        label=workload.label,
        input_tokens=workload.input_tokens,
        output_tokens=workload.output_tokens,
        fit=prediction.fit if prediction else None,
        made=prediction.made if prediction else "",
    )
    if figure is None:
        return None
    return ChartSlot(f"{stem}-full-size-{workload.key}", figure, workload.key)


def engine_full_size(job: AdaptationJob, *, stem: str) -> EngineFullSize | None:
    """What the job's newest serve attempt measured at full size on the engine (stage runs
    prefetched with their results), beside its succeeded plan's prediction; None when the
    job has no serve attempt with a full-size run. `stem` prefixes the charts' element ids."""
    runs = latest_runs_by_stage(job)
    serve = runs.get(SERVE_STAGE)
    run = full_size_run(serve.result) if serve is not None else None
    if run is None:
        return None
    plan = runs.get(PLAN_STAGE)
    workload = (
        PlanResult.from_stored(plan.result).workload
        if plan is not None and plan.status == StageStatus.SUCCEEDED
        else None
    )
    compared = comparisons(run, workload)
    charts = [slot for c in compared if (slot := _workload_chart(c, stem)) is not None]
    return EngineFullSize(run=run, comparisons=compared, charts=charts, plan=workload)


@dataclass
class PerformancePanel:
    """One job's performance: its newest finished `performance` attempt (`run`; None while the
    first has not finished) and its newest attempt whatever its status (`latest`). `state` is
    "measured", "failed", "empty" or "waiting"; `failure` the failed run's error."""

    job: AdaptationJob
    run: StageRun | None
    latest: StageRun
    state: str = "waiting"
    rows: list[dict[str, Any]] = field(default_factory=list)
    charts: list[ChartSlot] = field(default_factory=list)
    off_axis: list[tuple[str, str]] = field(default_factory=list)  # curves the charts leave out
    sweep: Sweep | None = None
    knees: list[Knee] = field(default_factory=list)  # each dtype's, in the order measured
    knee_rule: str = ""
    # (dtype, prompt length, reason) of each sweep that stopped early
    stops: list[tuple[str | None, int | None, str]] = field(default_factory=list)
    problems: Problems | None = None
    twin_calibration: TwinCalibration | None = None
    calibrated: CalibratedFullSize | None = None
    notes: list[str] = field(default_factory=list)
    full_size: FullSizePrediction | None = None
    failed: bool = False
    failure: str = ""
    skipped: SkippedBecause | None = None
    table: PointTable | None = None
    # Other jobs with performance rows: (group, jobs), group "same-release", "same-pool" or
    # "other".
    compare_choices: list[tuple[str, list[AdaptationJob]]] = field(default_factory=list)
    # The full-size model measured on the job's engine beside the prediction (None: the job's
    # serve stage measured none).
    engine_full_size: EngineFullSize | None = None

    @property
    def dom_id(self) -> str:
        return f"performance-job-{self.job.pk}"

    @property
    def csv_url(self) -> str:
        return reverse("adaptation:job_performance_csv", args=[self.job.pk])

    @property
    def showing_older(self) -> bool:
        return self.run is not None and self.run.pk != self.latest.pk


def _compare_choices(
    job: AdaptationJob, candidates: Sequence[AdaptationJob]
) -> list[tuple[str, list[AdaptationJob]]]:
    """Other jobs with performance rows, grouped: same release on other pools, same pool with
    other releases, the rest."""
    groups: dict[str, list[AdaptationJob]] = {"same-release": [], "same-pool": [], "other": []}
    for other in candidates:
        if other.pk == job.pk:
            continue
        if other.release_id == job.release_id:
            groups["same-release"].append(other)
        elif other.pool_id == job.pool_id:
            groups["same-pool"].append(other)
        else:
            groups["other"].append(other)
    return [(group, jobs) for group, jobs in groups.items() if jobs]


def job_performance_run(job: AdaptationJob) -> StageRun | None:
    """The job's newest finished `performance` attempt (stage runs prefetched): the one its
    panel draws."""
    return finished_run(r for r in job.stage_runs.all() if r.stage == PERFORMANCE_STAGE)


def release_performance_runs(release: ModelRelease) -> list[StageRun]:
    """The runs the release's Performance section draws (jobs and stage runs prefetched): each
    job's newest finished `performance` attempt, newest job first."""
    return [run for job in release_jobs(release) if (run := job_performance_run(job)) is not None]


def performance_panel(
    job: AdaptationJob,
    view: PerformanceView,
    *,
    rows_by_run: Mapping[int, list[dict[str, Any]]],
    candidates: Sequence[AdaptationJob] = (),
) -> PerformancePanel | None:
    """The performance panel of `job` (stage runs prefetched), or None without a
    `performance` run; `rows_by_run` holds its drawn run's points
    (`selectors.performance.point_rows_by_run`)."""
    latest = latest_runs_by_stage(job).get(PERFORMANCE_STAGE)
    if latest is None:
        return None
    run = job_performance_run(job)
    panel = PerformancePanel(job=job, run=run, latest=latest, skipped=skipped_because(job, latest))
    panel.engine_full_size = engine_full_size(job, stem=panel.dom_id)
    if run is None:
        return panel
    result = PerformanceResult.from_stored(run.result)
    panel.rows = list(rows_by_run.get(run.pk, ()))
    if run.status == StageStatus.FAILED:
        panel.failed = True
        panel.failure = str(run.error or result.reason).strip()
    if not panel.rows:
        panel.state = "failed" if panel.failed else "empty"
        return panel
    panel.state = "failed" if panel.failed else "measured"
    panel.charts = view_charts(
        [chart_source(rows=panel.rows, result=result)], view, stem=panel.dom_id
    )
    panel.off_axis = off_axis(panel.rows, view)
    panel.sweep = _sweep(result)
    panel.knees = list(result.knee_by_dtype.values())
    panel.knee_rule = result.knee_rule
    panel.stops = [(s.dtype, s.prompt_len, s.reason) for s in result.stopped]
    panel.problems = _problems(result)
    panel.twin_calibration = twin_calibration(result)
    panel.calibrated = calibrated_full_size(result)
    panel.notes = list(result.notes)
    panel.full_size = full_size_prediction(result)
    panel.table = point_table(panel.rows)
    panel.compare_choices = _compare_choices(job, candidates)
    return panel


@dataclass
class PerformanceSection:
    """The release page's performance section: the view and a panel per job."""

    view: PerformanceView
    panels: list[PerformancePanel]

    @property
    def x_choices(self) -> list[tuple[str, str]]:
        return x_choices()

    @property
    def metric_choices(self) -> list[tuple[str, str]]:
        present = {r["metric"]: r["unit"] for p in self.panels for r in p.rows}
        names = [m for m in METRICS if m in present or m in ("decode_tokens_per_s",)]
        names += sorted(m for m in present if is_efficiency(m))
        return [(m, metric_info(m, present.get(m, "")).label) for m in names]


def performance_section(
    release: ModelRelease,
    *,
    params: Mapping[str, Any],
    rows_by_run: Mapping[int, list[dict[str, Any]]],
    candidates: Sequence[AdaptationJob] = (),
) -> PerformanceSection:
    """Every job of the release (jobs and stage runs prefetched) with a performance run,
    newest job first, drawn in the view `params` ask for: `rows_by_run` holds the points of
    `release_performance_runs(release)`, `candidates` the jobs offered to compare with
    (`selectors.performance`)."""
    view = performance_view(params)
    panels = [
        panel
        for job in release_jobs(release)
        if (panel := performance_panel(job, view, rows_by_run=rows_by_run, candidates=candidates))
    ]
    return PerformanceSection(view=view, panels=panels)
