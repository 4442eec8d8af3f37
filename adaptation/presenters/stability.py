"""The release page's Stability section: each job's newest finished `stability` run (the scaled
twin served back to back, memory and step time sampled), its figures beside their thresholds
and its charts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from adaptation.charts import stability as stability_charts
from adaptation.models import AdaptationJob, ModelRelease, StageRun, StageStatus
from adaptation.presenters.chart_slot import ChartSlot
from adaptation.presenters.release_jobs import release_jobs
from adaptation.presenters.stages import SkippedBecause, finished_run, skipped_because
from adaptation.selectors.jobs import latest_runs_by_stage
from engine.stages.stability.result import StabilityResult, StabilityThresholds

STABILITY_STAGE = "stability"


def _within(crossed: bool | None) -> bool | None:
    """A crossed threshold (True) as "not within" (False); None stays not judged."""
    return None if crossed is None else not crossed


@dataclass(frozen=True)
class Judged:
    """The stability run's figures beside the thresholds it was judged by, and whether each
    was within (None: not judged), as the result judges them (`StabilityResult`).

    A leak needs both a memory slope (bytes/step) above `leak_above` and a fitted growth
    (bytes) above `growth_limit`; over a short run the growth limit is the stricter one, so
    `leak_above` is the larger of the slope floor (`slope_floor`) and the growth limit over
    the run's steps (`floor_raised`). Step-time drift is a fraction of the first quarter's
    median step time (`drift_basis`: which time)."""

    slope: float | None
    leak_above: float | None
    slope_floor: float | None
    floor_raised: bool
    growth: float | None
    growth_limit: float | None
    no_leak: bool | None
    nonfinite: int | None
    nonfinite_limit: int | None
    nonfinite_within: bool | None
    errors: int | None
    errors_within: bool | None
    drift: float | None
    drift_limit: float | None
    drift_basis: str
    drift_within: bool | None

    @classmethod
    def of(cls, result: StabilityResult) -> Judged:
        limits = result.thresholds or StabilityThresholds()
        return cls(
            slope=result.memory_slope_bytes_per_step,
            leak_above=result.leak_above,
            slope_floor=limits.leak_bytes_per_step,
            floor_raised=result.floor_raised,
            growth=result.memory_growth_bytes,
            growth_limit=limits.leak_min_growth_bytes,
            no_leak=_within(result.leaked()),
            nonfinite=result.nonfinite_outputs,
            nonfinite_limit=limits.max_nonfinite_outputs,
            nonfinite_within=_within(result.nonfinite_over()),
            errors=result.errors,
            errors_within=_within(result.raised()),
            drift=result.step_time_drift,
            drift_limit=limits.max_step_time_drift,
            drift_basis=result.step_time_drift_basis or "",
            drift_within=_within(result.drifted()),
        )


@dataclass
class StabilityPanel:
    """One job's stability run: its newest finished `stability` attempt (`run`; None before
    one finished) and its newest attempt (`latest`). `state` is "passed", "failed" or
    "waiting"; `reason` the stage's verdict in its words ("" when it gave none). The run's
    figures, reasons, exceptions and notes are its typed `result`'s (None: the run stored
    none), read there by the template; `judged` sets them beside their thresholds."""

    job: AdaptationJob
    run: StageRun | None
    latest: StageRun
    state: str = "waiting"
    passed: bool | None = None
    reason: str = ""
    result: StabilityResult | None = None
    judged: Judged | None = None
    charts: list[ChartSlot] = field(default_factory=list)
    skipped: SkippedBecause | None = None

    @property
    def dom_id(self) -> str:
        return f"stability-job-{self.job.pk}"

    @property
    def showing_older(self) -> bool:
        return self.run is not None and self.run.pk != self.latest.pk


def _charts(panel: StabilityPanel, result: StabilityResult) -> list[ChartSlot]:
    figures = (
        (
            "memory",
            stability_charts.memory(
                result.samples,
                warmup_steps=result.warmup_steps,
                slope_bytes_per_step=result.memory_slope_bytes_per_step,
                threshold_bytes_per_step=result.leak_above,
                memory_kind=str(result.memory_kind),
            ),
        ),
        (
            "step-time",
            stability_charts.step_time(
                result.samples,
                warmup_steps=result.warmup_steps,
                first_quarter_s=result.step_time_first_quarter_s,
                last_quarter_s=result.step_time_last_quarter_s,
                basis=result.step_time_drift_basis or "step time",
            ),
        ),
    )
    return [
        ChartSlot(f"{panel.dom_id}-{name}", figure, name)
        for name, figure in figures
        if figure is not None
    ]


def stability_panel(job: AdaptationJob) -> StabilityPanel | None:
    """The stability panel of `job` (stage runs prefetched), or None without a run."""
    latest = latest_runs_by_stage(job).get(STABILITY_STAGE)
    if latest is None:
        return None
    run = finished_run(r for r in job.stage_runs.all() if r.stage == STABILITY_STAGE)
    panel = StabilityPanel(job=job, run=run, latest=latest, skipped=skipped_because(job, latest))
    if run is None:
        return panel
    if not isinstance(run.result, Mapping) or not run.result:
        panel.state = "failed"
        panel.passed = False
        panel.reason = str(run.error or "")
        return panel
    result = StabilityResult.from_stored(run.result)
    panel.passed = bool(result.passed) and run.status == StageStatus.SUCCEEDED
    panel.state = "passed" if panel.passed else "failed"
    panel.reason = result.reason or str(run.error or "")
    panel.result = result
    panel.judged = Judged.of(result)
    panel.charts = _charts(panel, result)
    return panel


def stability_panels(release: ModelRelease) -> list[StabilityPanel]:
    """A stability panel per job of the release with a `stability` run, newest job first."""
    return [p for job in release_jobs(release) if (p := stability_panel(job)) is not None]
