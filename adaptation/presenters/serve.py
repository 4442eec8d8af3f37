"""The release page's "Serving engine" panel: each job's latest `serve` attempt.

The stage (`engine/stages/serve/`, docs/stages/serve.md) launches the pool's serving engine
from the plan's own command on a scaled twin's checkpoint (or a small release's real
weights), or attaches to an endpoint a team runs, and measures through the engine: loading,
precision against transformers on the same checkpoint, a load sweep, the engine's metrics
over it and the plan's TP against TP=1; every one of those figures is measured on the engine
serving that checkpoint, and the plan's predictions (full-size, its split) are drawn beside
the sweep in their own panels. Then, where the plan fits the pool, it launches the plan's
command at full size with dummy weights and sweeps workloads (`full_size`): measured ·
engine · full size · dummy weights, beside the plan's prediction for the same workload;
speed, memory and scheduling only, never precision.
The run's result is read, and judged, by the stage's own type
(`engine/stages/serve/result.py`, `ServeResult`): the panel shows its parts as they are.
Values only: `panels/serve.html` and `partials/serve_full_size.html` word them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from adaptation.charts import serve as serve_charts
from adaptation.models import AcceleratorPool, AdaptationJob, ModelRelease, StageRun, StageStatus
from adaptation.presenters.chart_slot import ChartSlot
from adaptation.presenters.release_jobs import release_jobs
from adaptation.presenters.stages import SkippedBecause, settle_unfinished
from adaptation.selectors.jobs import latest_runs_by_stage
from engine import formatting
from engine.stages.plan.result import DecodePoint, PlanResult, PlanWorkload, Split
from engine.stages.serve.full_size_result import (
    FullSizeRun,
    Level,
    WorkloadComparison,
    comparisons,
)
from engine.stages.serve.result import (
    EngineLaunch,
    Failure,
    Knee,
    PrecisionCheck,
    ServedCheckpoint,
    ServeResult,
    SweepSettings,
    TPCheck,
)
from engine.stored import as_mapping

SERVE_STAGE = "serve"
PLAN_STAGE = "plan"
# The result's own statuses (docs/stages/serve.md, "The result") as the panel's states.
RESULT_STATES = {
    "served": "served",
    "attached": "attached",
    "not_configured": "not-configured",
    "failed": "failed",
}


@dataclass(frozen=True)
class PlanPrediction:
    """The job's plan beside the sweep (predicted for the full-size model): its split and
    devices, its predicted decode curve at its batch sizes (empty when it predicted none) and
    its predicted served workload with the fit it names (None when it predicted none)."""

    split: Split
    devices: int | None
    accelerator: str
    curve: list[DecodePoint]
    workload: PlanWorkload | None = None


def plan_prediction(job: AdaptationJob) -> PlanPrediction | None:
    """What the job's succeeded `plan` run predicted (runs prefetched), or None without one."""
    run = latest_runs_by_stage(job).get(PLAN_STAGE)
    if run is None or run.status != StageStatus.SUCCEEDED or not as_mapping(run.result):
        return None
    result = PlanResult.from_stored(run.result)
    return PlanPrediction(
        split=result.split,
        devices=result.devices,
        accelerator=result.accelerator,
        curve=result.predicted.decode_curve if result.predicted else [],
        workload=result.workload,
    )


@dataclass
class ServePanel:
    """One job's serving-engine run: its latest `serve` attempt. `state` is "served",
    "attached", "not-configured", "failed", "waiting" (pending, queued, running), "skipped" or
    "cancelled"; `checkpoint_kind` ("twin" or "real") says what every figure was measured on."""

    job: AdaptationJob
    run: StageRun
    state: str = "waiting"
    waiting_for: AcceleratorPool | None = None
    skipped: SkippedBecause | None = None
    reason: str = ""  # a cancelled run's error
    failure: Failure | None = None
    passed: bool | None = None
    engine: EngineLaunch | None = None
    checkpoint: ServedCheckpoint | None = None
    load_s: float | None = None
    peak_memory_bytes: float | None = None
    startup_log: list[str] = field(default_factory=list)
    precision: PrecisionCheck | None = None
    tp: TPCheck | None = None
    sweep: list[Level] = field(default_factory=list)
    sweep_settings: SweepSettings | None = None
    knee: Knee | None = None
    metrics_interval_s: float | None = None
    plan: PlanPrediction | None = None
    charts: list[ChartSlot] = field(default_factory=list)
    # The full-size run on the engine with dummy weights (None: the result has none), each
    # workload it measured beside the plan's prediction for it, and its metrics chart.
    full_size: FullSizeRun | None = None
    full_size_comparisons: list[WorkloadComparison] = field(default_factory=list)
    full_size_charts: list[ChartSlot] = field(default_factory=list)

    @property
    def dom_id(self) -> str:
        return f"serve-job-{self.job.pk}"

    @property
    def checkpoint_kind(self) -> str:
        return self.checkpoint.kind if self.checkpoint else "twin"

    @property
    def measured_anything(self) -> bool:
        """Whether the run measured a figure the panel shows under the engine."""
        return any(
            (
                self.load_s is not None,
                self.peak_memory_bytes is not None,
                self.precision is not None,
                self.tp is not None,
                bool(self.sweep),
                self.full_size is not None and self.full_size.status != "skipped",
            )
        )


def _charts(panel: ServePanel, result: ServeResult) -> list[ChartSlot]:
    plan = panel.plan
    figures = (
        (
            "sweep",
            serve_charts.sweep(
                result.sweep,
                knee=result.knee,
                predicted=plan.curve if plan else [],
                checkpoint_kind=panel.checkpoint_kind,
                predicted_split=formatting.split(plan.split) if plan else "",
            ),
        ),
        (
            "metrics",
            serve_charts.engine_metrics(
                result.metrics.samples if result.metrics else [],
                checkpoint_kind=panel.checkpoint_kind,
            ),
        ),
    )
    return [
        ChartSlot(f"{panel.dom_id}-{name}", figure, name)
        for name, figure in figures
        if figure is not None
    ]


def _measured(panel: ServePanel, result: ServeResult) -> None:
    """Fill what the run measured (a failed run keeps what it measured before failing)."""
    panel.engine = result.engine
    panel.checkpoint = result.checkpoint
    panel.load_s = result.load_s
    panel.peak_memory_bytes = result.peak_memory_bytes
    panel.startup_log = result.startup_log
    panel.precision = result.precision
    panel.tp = result.tp
    panel.knee = result.knee
    panel.sweep = result.sweep
    panel.sweep_settings = result.sweep_settings
    panel.metrics_interval_s = result.metrics.interval_s if result.metrics else None
    panel.charts = _charts(panel, result)
    panel.full_size = result.full_size
    if panel.full_size is not None:
        panel.full_size_comparisons = comparisons(
            panel.full_size, panel.plan.workload if panel.plan else None
        )
        metrics = serve_charts.engine_metrics(
            panel.full_size.metrics_series, checkpoint_kind="full-size"
        )
        if metrics is not None:
            panel.full_size_charts = [
                ChartSlot(f"{panel.dom_id}-full-size-metrics", metrics, "metrics")
            ]


def serve_panel(
    job: AdaptationJob, *, pools_without_worker: Mapping[int, AcceleratorPool] | None = None
) -> ServePanel | None:
    """The serving-engine panel of `job` (stage runs prefetched), or None when it has no
    `serve` run. `pools_without_worker` (by id) marks a pending or queued run whose pool no
    live worker serves as waiting for one."""
    run = latest_runs_by_stage(job).get(SERVE_STAGE)
    if run is None:
        return None
    panel = ServePanel(job=job, run=run)
    if settle_unfinished(panel, job, run, pools_without_worker):
        return panel
    result = ServeResult.from_stored(run.result)
    state = RESULT_STATES.get(result.status)
    if run.status == StageStatus.FAILED or state is None:
        state = "failed" if state != "not-configured" else state
    panel.state = state
    if state == "not-configured":
        return panel
    panel.passed = result.passed
    if state == "failed":
        stored = result.failure or Failure(phase="", reason="")
        # A run refused before the stage started names its reason in the run's error only.
        panel.failure = replace(stored, reason=(stored.reason or str(run.error or "")).strip())
    panel.plan = plan_prediction(job)
    _measured(panel, result)
    return panel


def serve_panels(
    release: ModelRelease, *, pools_without_worker: Mapping[int, AcceleratorPool] | None = None
) -> list[ServePanel]:
    """A panel per job of the release with a `serve` run, newest job first (jobs and their
    stage runs prefetched, as `selectors.release_detail` does)."""
    return [
        panel
        for job in release_jobs(release)
        if (panel := serve_panel(job, pools_without_worker=pools_without_worker)) is not None
    ]
