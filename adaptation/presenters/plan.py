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
from adaptation.presenters.plan_figures import Suggestion, would_fit
from adaptation.presenters.release_jobs import release_jobs
from adaptation.selectors.inventory import StartEstimate
from adaptation.selectors.jobs import latest_runs_by_stage
from engine.stages.distributed.result import DistributedResult, MeasuredScaling
from engine.stages.plan.result import ARTIFACT_KINDS, PlanResult
from engine.stored import as_mapping

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


def measured_scaling(run: StageRun | None) -> MeasuredScaling | None:
    """What a job's `distributed` run measured, for the plan's scaling chart and table. None
    unless the run finished (succeeded, or failed with its figures: a wrong shard still times
    its steps) and validated the split on at least 2 processes with an efficiency
    (`DistributedResult.measured_scaling`)."""
    if run is None or run.status not in (StageStatus.SUCCEEDED, StageStatus.FAILED):
        return None
    return DistributedResult.from_stored(run.result).measured_scaling(
        succeeded=run.status == StageStatus.SUCCEEDED
    )


@dataclass(frozen=True)
class PlanFailure:
    """Why a plan did not fit or could not be made ("" when the stage gave no reason), whether
    the planner said it does not fit, and what would."""

    reason: str
    fits_false: bool
    would_fit: list[Suggestion]


def _failure(run: StageRun, result: PlanResult) -> PlanFailure:
    reason = (result.reason or result.error or run.error or "").strip()
    per_node = (result.pool.devices_per_node if result.pool else None) or (
        run.job.pool.devices_per_node
    )
    kind = result.accelerator or run.job.pool.accelerator or ""
    return PlanFailure(
        reason=reason,
        fits_false=result.does_not_fit,
        would_fit=would_fit(result.suggestions, kind=kind, per_node=per_node),
    )


@dataclass(frozen=True)
class Artifact:
    """A deployment artifact to copy (`kind`: "vllm", "sglang", "kubernetes_deployment") and
    the id of the element that holds its text."""

    kind: str
    text: str
    element_id: str


@dataclass
class PlanPanel:
    """The plan of one job's pool: its latest `plan` attempt, shaped for the page. `state` is
    "planned", "failed" or "waiting" (pending, queued, running). A planned panel's figures
    are its typed `result`'s, read there by the template; the panel adds what the page makes
    of them: the charts, the scaling point measured on the twin, the artifacts to copy."""

    job: AdaptationJob
    run: StageRun
    pool_name: str
    result: PlanResult
    accelerator: str = ""
    state: str = "waiting"
    # Pending or queued on a pool no live worker serves: that pool (it says so), else None.
    waiting_for: AcceleratorPool | None = None
    charts: list[ChartSlot] = field(default_factory=list)
    measured: MeasuredScaling | None = None  # drawn on the scaling chart too
    artifacts: list[Artifact] = field(default_factory=list)
    failure: PlanFailure | None = None
    start: StartEstimate | None = None
    compare_query: str = ""

    @property
    def dom_id(self) -> str:
        return f"plan-job-{self.job.pk}"

    @property
    def devices_per_node(self) -> int | None:
        """The pool's devices per node as the plan read it (None: not recorded)."""
        return self.result.pool.devices_per_node if self.result.pool else None

    @property
    def first_devices(self) -> int | None:
        """The scaling curve's first device count (the measured point's basis)."""
        return self.result.scaling[0].devices if self.result.scaling else None

    @property
    def efficiency_above_one(self) -> bool:
        """Whether a scaling row's efficiency per device is above 1 (the panel says why)."""
        return any(row.above_one for row in self.result.scaling)


def _charts(panel: PlanPanel, result: PlanResult) -> list[ChartSlot]:
    predicted = result.predicted
    figures = (
        (
            "memory",
            plan_charts.memory_per_device(result.memory_per_device_bytes, split=result.split),
        ),
        ("decode", plan_charts.decode_curve(predicted.decode_curve if predicted else [])),
        ("prefill", plan_charts.prefill_curve(predicted.prefill if predicted else [])),
        ("scaling", plan_charts.scaling_curve(result.scaling, panel.measured)),
    )
    return [
        ChartSlot(f"{panel.dom_id}-{name}", figure, name)
        for name, figure in figures
        if figure is not None
    ]


def _planned(panel: PlanPanel, result: PlanResult, measured: MeasuredScaling | None = None) -> None:
    """Fill `panel` from a succeeded plan's result, with the scaling point the job's
    `distributed` run measured on the twin when there is one."""
    panel.state = "planned"
    panel.measured = measured
    panel.charts = _charts(panel, result)
    panel.artifacts = [
        Artifact(
            kind, result.artifacts.texts[kind], f"{panel.dom_id}-artifact-{kind.replace('_', '-')}"
        )
        for kind in ARTIFACT_KINDS
        if kind in result.artifacts.texts
    ]


def start_devices(job: AdaptationJob) -> int | None:
    """The devices whose start on its pool the job's plan panel shows ("When can it run"):
    those its latest `plan` attempt chose when it succeeded and the job is still active (a
    finished job has run); None otherwise (stage runs prefetched)."""
    run = latest_runs_by_stage(job).get(PLAN_STAGE)
    if run is None or run.status != StageStatus.SUCCEEDED:
        return None
    if job.status not in (JobStatus.PENDING, JobStatus.RUNNING):
        return None
    devices = PlanResult.from_stored(run.result).devices
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
    result = PlanResult.from_stored(run.result)
    panel = PlanPanel(
        job=job,
        run=run,
        pool_name=job.pool.name,
        result=result,
        accelerator=result.accelerator_name or job.pool.accelerator or "",
        compare_query=plan_query(
            (result.inputs.to_dict() if result.inputs else None)
            or as_mapping(job.options).get("plan")
        ),
    )
    if run.status == StageStatus.SUCCEEDED and as_mapping(run.result):
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
