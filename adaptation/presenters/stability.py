"""The release page's Stability section: each job's newest finished `stability` run (the scaled
twin served back to back, memory and step time sampled), its figures beside their thresholds
and its charts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adaptation.charts import stability as stability_charts
from adaptation.models import AdaptationJob, ModelRelease, StageRun, StageStatus
from adaptation.presenters.chart_slot import ChartSlot
from adaptation.presenters.stages import SkippedBecause, finished_run, skipped_because
from adaptation.selectors.jobs import latest_runs_by_stage
from engine.formatting import finite
from engine.stored import as_list, as_mapping, numbers

STABILITY_STAGE = "stability"


@dataclass(frozen=True)
class Judged:
    """The stability run's figures beside the thresholds it was judged by, and whether each
    was within (None: not judged, too few samples).

    A leak needs both a memory slope (bytes/step) above `leak_above` and a fitted growth
    (bytes) above `growth_limit`; over a short run the growth limit is the stricter one, so
    `leak_above` is the larger of the slope floor (`slope_floor`) and the growth limit over
    the run's steps. Step-time drift is a fraction of the first quarter's median step time
    (`drift_basis`: which time)."""

    slope: float | None
    leak_above: float | None
    slope_floor: float | None
    floor_raised: bool  # the growth limit over the run's steps is above the floor
    growth: float | None
    growth_limit: float | None
    no_leak: bool | None
    nonfinite: float | None
    nonfinite_limit: float | None
    nonfinite_within: bool | None
    errors: float | None
    errors_within: bool | None
    drift: float | None
    drift_limit: float | None
    drift_basis: str
    drift_within: bool | None


def _judged(result: Mapping[str, Any]) -> Judged:
    limits = as_mapping(result.get("thresholds"))
    slope = finite(result.get("memory_slope_bytes_per_step"))
    growth = finite(result.get("memory_growth_bytes"))
    floor = finite(limits.get("leak_bytes_per_step"))
    growth_limit = finite(limits.get("leak_min_growth_bytes"))
    effective = finite(limits.get("leak_effective_bytes_per_step"))
    drift = finite(result.get("step_time_drift"))
    drift_limit = finite(limits.get("max_step_time_drift"))
    nonfinite = finite(result.get("nonfinite_outputs"))
    nonfinite_limit = finite(limits.get("max_nonfinite_outputs"))
    errors = finite(result.get("errors"))
    return Judged(
        slope=slope,
        leak_above=None if floor is None else max(floor, effective or 0),
        slope_floor=floor,
        floor_raised=bool(effective and floor is not None and effective > floor),
        growth=growth,
        growth_limit=growth_limit,
        no_leak=None
        if slope is None or floor is None
        else not (slope > floor and (growth or 0) > (growth_limit or 0)),
        nonfinite=nonfinite,
        nonfinite_limit=nonfinite_limit,
        nonfinite_within=None
        if nonfinite is None or nonfinite_limit is None
        else nonfinite <= nonfinite_limit,
        errors=errors,
        errors_within=None if errors is None else errors == 0,
        drift=drift,
        drift_limit=drift_limit,
        drift_basis=str(result.get("step_time_drift_basis") or ""),
        drift_within=None if drift is None or drift_limit is None else drift <= drift_limit,
    )


@dataclass(frozen=True)
class StabilityRun:
    """How the run went: how long (s), how many steps (and warm-up steps left out of the
    fits), what each step served (a batch of prompts and decode steps, in a dtype on a
    device), its step time's median and p95 (s) and wall-time
    drift (a fraction, reported only), memory from start to end and its maximum (bytes), how
    memory was read, and why it stopped early ("" when it did not)."""

    duration_s: float | None
    steps: Any
    warmup_steps: Any
    batch_size: Any
    prompt_len: Any
    decode_steps: Any
    dtype: Any
    device: Any
    step_time_median_s: float | None
    step_time_p95_s: float | None
    wall_time_drift: float | None
    memory_start_bytes: float | None
    memory_end_bytes: float | None
    memory_max_bytes: float | None
    memory_method: str
    stopped_early: str


def _run(result: Mapping[str, Any]) -> StabilityRun:
    workload = as_mapping(result.get("workload"))
    return StabilityRun(
        steps=result.get("steps"),
        warmup_steps=result.get("warmup_steps"),
        batch_size=workload.get("batch_size"),
        prompt_len=workload.get("prompt_len"),
        decode_steps=workload.get("decode_steps"),
        dtype=workload.get("dtype"),
        device=workload.get("device"),
        memory_method=str(result.get("memory_method") or result.get("memory_kind") or ""),
        stopped_early=str(result.get("stopped_early") or ""),
        **numbers(
            result,
            "duration_s",
            "step_time_median_s",
            "step_time_p95_s",
            "wall_time_drift",
            "memory_start_bytes",
            "memory_end_bytes",
            "memory_max_bytes",
        ),
    )


@dataclass
class StabilityPanel:
    """One job's stability run: its newest finished `stability` attempt (`run`; None before
    one finished) and its newest attempt (`latest`). `state` is "passed", "failed" or
    "waiting"; `reason` the stage's verdict in its words ("" when it gave none)."""

    job: AdaptationJob
    run: StageRun | None
    latest: StageRun
    state: str = "waiting"
    passed: bool | None = None
    reason: str = ""
    reasons: list[str] = field(default_factory=list)
    judged: Judged | None = None
    figures: StabilityRun | None = None
    charts: list[ChartSlot] = field(default_factory=list)
    error_messages: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: SkippedBecause | None = None

    @property
    def dom_id(self) -> str:
        return f"stability-job-{self.job.pk}"

    @property
    def showing_older(self) -> bool:
        return self.run is not None and self.run.pk != self.latest.pk


def _charts(panel: StabilityPanel, result: Mapping[str, Any]) -> list[ChartSlot]:
    samples = [as_mapping(s) for s in as_list(result.get("samples"))]
    limits = as_mapping(result.get("thresholds"))
    warmup = result.get("warmup_steps") if isinstance(result.get("warmup_steps"), int) else None
    figures = (
        (
            "memory",
            stability_charts.memory(
                samples,
                warmup_steps=warmup,
                slope_bytes_per_step=finite(result.get("memory_slope_bytes_per_step")),
                threshold_bytes_per_step=finite(
                    limits.get("leak_effective_bytes_per_step") or limits.get("leak_bytes_per_step")
                ),
                memory_kind=str(result.get("memory_kind")),
            ),
        ),
        (
            "step-time",
            stability_charts.step_time(
                samples,
                warmup_steps=warmup,
                first_quarter_s=finite(result.get("step_time_first_quarter_s")),
                last_quarter_s=finite(result.get("step_time_last_quarter_s")),
                basis=str(result.get("step_time_drift_basis") or "step time"),
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
    result = as_mapping(run.result)
    if not result:
        panel.state = "failed"
        panel.passed = False
        panel.reason = str(run.error or "")
        return panel
    panel.passed = bool(result.get("passed")) and run.status == StageStatus.SUCCEEDED
    panel.state = "passed" if panel.passed else "failed"
    panel.reason = str(result.get("reason") or run.error or "")
    panel.reasons = [str(r) for r in as_list(result.get("reasons"))]
    panel.judged = _judged(result)
    panel.figures = _run(result)
    panel.error_messages = [str(m) for m in as_list(result.get("error_messages"))]
    panel.notes = [str(n) for n in as_list(result.get("notes"))]
    panel.charts = _charts(panel, result)
    return panel


def stability_panels(release: ModelRelease) -> list[StabilityPanel]:
    """A stability panel per job of the release with a `stability` run, newest job first."""
    return [p for job in release.jobs.all() if (p := stability_panel(job)) is not None]
