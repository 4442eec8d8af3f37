"""The release page's "Distributed plan" panel: the `plan` stage's result for each job's pool.

A plan is the planner's prediction from the architecture analysis (`engine/stages/plan/`):
memory per device, decode and prefill speeds and the scaling curve are computed, never
measured, and the panel says so. The one measured figure beside them is the scaling efficiency
the job's `distributed` stage measured on the scaled twin, drawn on the scaling chart and
written under its table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from adaptation.charts import plan as plan_charts
from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    JobStatus,
    ModelRelease,
    StageRun,
    StageStatus,
)
from adaptation.presenters.chart_slot import ChartSlot
from adaptation.presenters.plan_figures import (
    Calibration,
    Prediction,
    Split,
    Suggestion,
    calibration,
    whole,
    would_fit,
)
from adaptation.presenters.plan_tables import (
    ARTIFACT_KINDS,
    Artifact,
    Communication,
    RunnerUp,
    ScalingRow,
    communication,
    scaling_rows,
)
from adaptation.presenters.release_jobs import release_jobs
from adaptation.selectors.inventory import StartEstimate
from adaptation.selectors.jobs import latest_runs_by_stage
from engine.formatting import finite
from engine.stages.plan.predicted import PlanWorkload, plan_workload
from engine.stored import as_count, as_list, as_mapping

PLAN_STAGE = "plan"
DISTRIBUTED_STAGE = "distributed"


def plan_query(options: Mapping[str, Any] | None) -> str:
    """The compare page's query string (context, concurrency, dtype) for plan options as the
    planner names them ({"context_tokens": 8192, "concurrency": 16, "dtype": "fp8"})."""
    options = options or {}
    pairs = [
        (name, options[key])
        for name, key in (
            ("context", "context_tokens"),
            ("concurrency", "concurrency"),
            ("dtype", "dtype"),
        )
        if options.get(key) not in (None, "")
    ]
    return urlencode(pairs)


@dataclass(frozen=True)
class MeasuredScaling:
    """The scaling point a job's `distributed` run measured on the scaled twin: `devices`
    (processes), `efficiency` (the twin's TP=1 step time over devices x its TP=N step time;
    1 = linear), the split validated (`tp`, `ep`), the backend, and whether its outputs matched
    the float32 reference (`passed`)."""

    devices: int
    efficiency: float
    tp: Any
    ep: Any
    backend: str
    passed: bool

    def chart_point(self) -> dict[str, Any]:
        """The point as `charts.plan.scaling_curve` takes it."""
        return {
            "devices": self.devices,
            "efficiency": self.efficiency,
            "tp": self.tp,
            "ep": self.ep,
            "passed": self.passed,
        }


def measured_scaling(run: StageRun | None) -> MeasuredScaling | None:
    """What a job's `distributed` run measured, for the plan's scaling chart and table. None
    unless the run finished (succeeded, or failed with its figures: a wrong shard still times
    its steps) and validated the split on at least 2 processes with an efficiency."""
    if run is None or run.status not in (StageStatus.SUCCEEDED, StageStatus.FAILED):
        return None
    result = as_mapping(run.result)
    devices = whole(result.get("world_size"))
    efficiency = finite(result.get("scaling_efficiency"))
    if result.get("validated") is not True or efficiency is None or not devices or devices < 2:
        return None
    return MeasuredScaling(
        devices=devices,
        efficiency=efficiency,
        tp=result.get("tp"),
        ep=result.get("ep"),
        backend=str(result.get("backend") or ""),
        passed=result.get("passed") is True and run.status == StageStatus.SUCCEEDED,
    )


@dataclass(frozen=True)
class PlanFailure:
    """Why a plan did not fit or could not be made ("" when the stage gave no reason), whether
    the planner said it does not fit, and what would."""

    reason: str
    fits_false: bool
    would_fit: list[Suggestion]


def _failure(run: StageRun, result: Mapping[str, Any]) -> PlanFailure:
    reason = str(result.get("reason") or result.get("error") or run.error or "").strip()
    pool = as_mapping(result.get("pool"))
    per_node = pool.get("devices_per_node") or run.job.pool.devices_per_node
    kind = str(result.get("accelerator") or run.job.pool.accelerator or "")
    return PlanFailure(
        reason=reason,
        fits_false=result.get("fits") is False,
        would_fit=would_fit(as_mapping(result.get("suggestions")), kind=kind, per_node=per_node),
    )


# Where the plan's speed figures come from (`PlanPanel.speeds_from`).
CATALOG = "catalog"  # the accelerator catalog's datasheet figures
CPU_UNMEASURED = "cpu-unmeasured"  # a cpu pool whose performance runs measured nothing yet
CPU_MEASURED = "cpu-measured"  # a cpu pool: what its performance runs measured


@dataclass
class PlanPanel:
    """The plan of one job's pool: its latest `plan` attempt, shaped for the page. `state` is
    "planned", "failed" or "waiting" (pending, queued, running)."""

    job: AdaptationJob
    run: StageRun
    pool_name: str
    accelerator: str = ""
    state: str = "waiting"
    # Pending or queued on a pool no live worker serves: that pool (it says so), else None.
    waiting_for: AcceleratorPool | None = None
    split: Split | None = None
    devices: Any = None
    pool_devices: Any = None
    nodes: Any = None
    devices_per_node: Any = None
    dtype_label: str = ""
    context_tokens: float | None = None  # the inputs it was planned for (None: not recorded)
    concurrency: Any = None
    memory: Mapping[str, Any] = field(default_factory=dict)  # bytes per device, by part
    weights_by_dtype: list[tuple[str, Any]] = field(default_factory=list)
    predicted: Prediction | None = None
    predicted_reason: str = ""  # why there is no prediction ("" when there is one)
    # The served workload predicted with the fit it names (None: the plan predicted none).
    workload: PlanWorkload | None = None
    calibration: Calibration | None = None
    speeds_from: str = CATALOG
    # The cpu figures the plan predicted on ({"memory_bandwidth_bytes_per_s", "dense_bf16_flops",
    # "source", "host_busy"}), measured by the pool's performance runs ("host_busy": only on a
    # busy host, the panel says so); empty when not a measured cpu plan.
    measured_device: Mapping[str, Any] = field(default_factory=dict)
    charts: list[ChartSlot] = field(default_factory=list)
    scaling: list[ScalingRow] = field(default_factory=list)
    # No speed predicted for any device count: no scaling curve, and the reason ("" if none).
    scaling_unpredicted: bool = False
    scaling_reason: str = ""
    measured: MeasuredScaling | None = None  # drawn on the scaling chart too
    first_devices: Any = None  # the scaling curve's first device count
    runners_up: list[RunnerUp] = field(default_factory=list)
    communication: Communication | None = None
    artifacts: list[Artifact] = field(default_factory=list)
    artifact_notes: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    validity_flags: list[str] = field(default_factory=list)
    failure: PlanFailure | None = None
    start: StartEstimate | None = None
    compare_query: str = ""

    @property
    def dom_id(self) -> str:
        return f"plan-job-{self.job.pk}"

    @property
    def efficiency_above_one(self) -> bool:
        """Whether a scaling row's efficiency per device is above 1 (the panel says why)."""
        return any(row.above_one for row in self.scaling)


def _speeds_from(
    result: Mapping[str, Any], predicted: Mapping[str, Any]
) -> tuple[str, Mapping[str, Any]]:
    """Where the plan's speed figures come from, and for a cpu pool the measured device
    figures the planner predicted on (empty when none)."""
    if result.get("accelerator") != "cpu":
        return CATALOG, {}
    if not predicted.get("available"):
        return CPU_UNMEASURED, {}
    return CPU_MEASURED, as_mapping(result.get("measured_device"))


def _charts(panel: PlanPanel, result: Mapping[str, Any]) -> list[ChartSlot]:
    memory = as_mapping(result.get("memory_per_device_bytes"))
    predicted = as_mapping(result.get("predicted"))
    measured = panel.measured.chart_point() if panel.measured else None
    figures = (
        ("memory", plan_charts.memory_per_device(memory, split=result)),
        ("decode", plan_charts.decode_curve(predicted)),
        ("prefill", plan_charts.prefill_curve(predicted)),
        ("scaling", plan_charts.scaling_curve(as_list(result.get("scaling")), measured)),
    )
    return [
        ChartSlot(f"{panel.dom_id}-{name}", figure, name)
        for name, figure in figures
        if figure is not None
    ]


def _planned(
    panel: PlanPanel, result: Mapping[str, Any], measured: MeasuredScaling | None = None
) -> None:
    """Fill `panel` from a succeeded plan's result, with the scaling point the job's
    `distributed` run measured on the twin when there is one."""
    pool = as_mapping(result.get("pool"))
    inputs = as_mapping(result.get("inputs"))
    predicted = as_mapping(result.get("predicted"))
    panel.state = "planned"
    panel.split = Split.of(result)
    panel.devices = result.get("devices")
    panel.pool_devices = pool.get("devices")
    panel.nodes = as_count(result.get("nodes"))
    panel.devices_per_node = pool.get("devices_per_node")
    panel.dtype_label = str(result.get("dtype_label") or result.get("dtype") or "")
    if inputs:
        panel.context_tokens = finite(inputs.get("context_tokens"))
        panel.concurrency = inputs.get("concurrency")
    panel.memory = as_mapping(result.get("memory_per_device_bytes"))
    panel.weights_by_dtype = [
        (str(label), size)
        for label, size in as_mapping(result.get("memory_weights_by_dtype_bytes")).items()
    ]
    panel.predicted = Prediction.of(predicted)
    panel.workload = plan_workload(result)
    if panel.predicted is None:
        panel.predicted_reason = str(predicted.get("reason") or "")
    panel.calibration = calibration(as_mapping(predicted.get("calibrated")))
    panel.speeds_from, panel.measured_device = _speeds_from(result, predicted)
    panel.measured = measured
    panel.charts = _charts(panel, result)
    scaling = [as_mapping(p) for p in as_list(result.get("scaling"))]
    panel.first_devices = next((p["devices"] for p in scaling if p.get("devices")), None)
    if any(finite(p.get("decode_tokens_per_s")) is not None for p in scaling):
        panel.scaling = scaling_rows(scaling)
    else:  # a split per count, but no speed to draw: say why instead of an empty chart
        panel.scaling_unpredicted = True
        panel.scaling_reason = panel.predicted_reason or str(predicted.get("reason") or "")
    panel.runners_up = [
        RunnerUp(
            split=Split.of(item),
            devices=item.get("devices"),
            fits=bool(item.get("fits")),
            memory_bytes=finite(item.get("memory_per_device_bytes")),
            tokens_per_s=finite(item.get("decode_tokens_per_s")),
            why_lost=str(item.get("why_lost") or ""),
        )
        for item in (as_mapping(r) for r in as_list(result.get("runners_up")))
    ]
    panel.communication = communication(as_mapping(result.get("communication")))
    artifacts = as_mapping(result.get("artifacts"))
    panel.artifacts = [
        Artifact(kind, str(artifacts[kind]), f"{panel.dom_id}-artifact-{kind.replace('_', '-')}")
        for kind in ARTIFACT_KINDS
        if artifacts.get(kind)
    ]
    panel.artifact_notes = [str(n) for n in as_list(artifacts.get("notes"))]
    panel.assumptions = [str(a) for a in as_list(result.get("assumptions"))]
    panel.notes = [str(n) for n in as_list(result.get("notes"))]
    panel.validity_flags = [str(flag) for flag in as_list(result.get("validity_flags"))]


def start_devices(job: AdaptationJob) -> int | None:
    """The devices whose start on its pool the job's plan panel shows ("When can it run"):
    those its latest `plan` attempt chose when it succeeded and the job is still active (a
    finished job has run); None otherwise (stage runs prefetched)."""
    run = latest_runs_by_stage(job).get(PLAN_STAGE)
    if run is None or run.status != StageStatus.SUCCEEDED:
        return None
    if job.status not in (JobStatus.PENDING, JobStatus.RUNNING):
        return None
    devices = whole(as_mapping(run.result).get("devices"))
    return devices if devices and devices >= 1 else None


def plan_panel(
    job: AdaptationJob,
    *,
    pools_without_worker: Mapping[int, AcceleratorPool] | None = None,
    start: StartEstimate | None = None,
) -> PlanPanel | None:
    """The plan panel of `job` (stage runs prefetched), or None when it has no `plan` run.
    `pools_without_worker` (by id, `selectors.workers.pools_without_live_worker`) marks a
    pending or queued plan whose pool no live worker serves as waiting for one; `start` is
    when the plan can start on its pool (`selectors.inventory.plan_start_estimate` for
    `start_devices(job)`), shown while the job is active."""
    latest = latest_runs_by_stage(job)
    run = latest.get(PLAN_STAGE)
    if run is None:
        return None
    result = as_mapping(run.result)
    panel = PlanPanel(
        job=job,
        run=run,
        pool_name=job.pool.name,
        accelerator=str(result.get("accelerator_name") or job.pool.accelerator or ""),
        compare_query=plan_query(
            as_mapping(result.get("inputs")) or as_mapping(job.options).get("plan")
        ),
    )
    if run.status == StageStatus.SUCCEEDED and result:
        _planned(panel, result, measured_scaling(latest.get(DISTRIBUTED_STAGE)))
        # "When can it run" only while the job is active: a finished job has run.
        if start_devices(job) is not None:
            panel.start = start
    elif run.status == StageStatus.FAILED:
        panel.state = "failed"
        panel.failure = _failure(run, result)
    elif run.status in (StageStatus.PENDING, StageStatus.QUEUED):
        panel.waiting_for = (pools_without_worker or {}).get(job.pool_id)
    return panel


def plan_panels(
    release: ModelRelease,
    *,
    pools_without_worker: Mapping[int, AcceleratorPool] | None = None,
    starts: Mapping[int, StartEstimate] | None = None,
) -> list[PlanPanel]:
    """A plan panel per job of the release with a `plan` run, newest job first (jobs and
    their stage runs prefetched, as `selectors.release_detail` does); `pools_without_worker`
    as for `plan_panel`, `starts` each active job's start by job id."""
    return [
        panel
        for job in release_jobs(release)
        if (
            panel := plan_panel(
                job,
                pools_without_worker=pools_without_worker,
                start=(starts or {}).get(job.pk),
            )
        )
        is not None
    ]
