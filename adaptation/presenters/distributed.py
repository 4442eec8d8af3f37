"""The release page's "Multi-device validation" panel: each job's latest `distributed` run.

The stage (`engine/stages/distributed/`) runs the plan's tensor-parallel split of the scaled
twin, with expert parallelism for a MoE release whose plan uses it, across that many
torch.distributed processes on the pool's worker, and compares every rank with the
single-process float32 reference. Every figure here is measured on the twin, never the full
model's, and the panel says so; the plan's split (a prediction) is shown beside the one
validated, with why the degree differs when it does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adaptation.models import AcceleratorPool, AdaptationJob, ModelRelease, StageRun, StageStatus
from adaptation.presenters.plan import DISTRIBUTED_STAGE
from adaptation.presenters.release_jobs import release_jobs
from adaptation.presenters.stages import SkippedBecause, settle_unfinished
from adaptation.selectors.jobs import latest_runs_by_stage
from engine.stages.distributed.result import (
    FAILED,
    PASSED,
    DistributedResult,
    DivisibilityRow,
    Headline,
    RankComparison,
    RankLog,
)
from engine.stages.plan.result import Split


@dataclass(frozen=True)
class RunFacts:
    """How the run was made: the twin (class, parameters, where its weights come from), the
    prompt (batch x tokens) and the decode steps compared and timed, the reference, the
    launcher and the ranks' wall time (s)."""

    twin_class: str | None = None  # None: the result describes no twin
    twin_parameters: float | None = None
    weights_source: str = ""
    prompted: bool = False  # the result says what prompt the ranks ran
    batch: int | None = None
    prompt_tokens: int | None = None
    decode_steps: int | None = None
    timing_steps: int | None = None
    reference: str = ""
    launcher: str = ""
    elapsed_s: float | None = None

    @property
    def any(self) -> bool:
        return any(
            (
                self.twin_class is not None,
                self.prompted,
                self.reference,
                self.launcher,
                self.elapsed_s is not None,
            )
        )


def _facts(result: DistributedResult) -> RunFacts:
    twin = result.twin
    return RunFacts(
        twin_class=twin.model_class if twin else None,
        twin_parameters=twin.parameters if twin else None,
        weights_source=twin.weights_source if twin else "",
        prompted=result.prompted,
        batch=result.prompt_batch,
        prompt_tokens=result.prompt_tokens,
        decode_steps=result.decode_steps,
        timing_steps=result.timing_steps,
        reference=result.tolerance.reference,
        launcher=result.launcher,
        elapsed_s=result.elapsed_s,
    )


@dataclass
class DistributedPanel:
    """One job's multi-device validation: its latest `distributed` attempt. `state` is
    "passed", "failed", "not-validated", "waiting" (pending, queued, running), "skipped" or
    "cancelled"; `reason` the stage's own words ("" when it gave none)."""

    job: AdaptationJob
    run: StageRun
    state: str = "waiting"
    # Pending or queued on a pool no live worker serves: that pool (it says so), else None.
    waiting_for: AcceleratorPool | None = None
    skipped: SkippedBecause | None = None
    reason: str = ""
    inject: list[tuple[str, Any]] = field(default_factory=list)  # broken on purpose: how
    validated: bool = False  # the run validated a split: the figures below are its
    tp: int | None = None
    ep: int | None = None
    world_size: int | None = None
    backend: str = ""
    device_type: str = ""
    threads_per_rank: int | None = None
    plan_split: Split | None = None  # the plan's split, beside the one validated
    pool_devices: int | None = None
    degree_reason: str = ""  # why the degree validated differs from the plan's
    headline: Headline | None = None
    ranks: list[RankComparison] = field(default_factory=list)
    tolerance_rule: str = ""
    divisibility: list[DivisibilityRow] = field(default_factory=list)
    ep_note: str = ""
    failed_rank: int | None = None
    failed_log: RankLog | None = None
    rank_logs: list[RankLog] = field(default_factory=list)
    facts: RunFacts = field(default_factory=RunFacts)
    notes: list[str] = field(default_factory=list)

    @property
    def dom_id(self) -> str:
        return f"distributed-job-{self.job.pk}"

    @property
    def divisibility_broken(self) -> bool:
        """Whether a size the degree must divide was not kept for the twin (the panel then
        shows how the run was set up unfolded)."""
        return any(row.kept is False for row in self.divisibility)


def _validated(panel: DistributedPanel, result: DistributedResult) -> None:
    """Fill the figures of a run that validated the split (passed or failed)."""
    panel.validated = True
    panel.tp, panel.ep = result.tp, result.ep
    panel.world_size = result.world_size
    panel.backend = result.backend
    panel.device_type = result.device_type
    panel.threads_per_rank = result.threads_per_rank
    panel.headline = result.headline
    panel.ranks = result.ranks
    panel.tolerance_rule = result.tolerance.rule
    panel.facts = _facts(result)
    panel.rank_logs = result.rank_logs
    failing = result.failing_rank if panel.state == FAILED else None
    if failing is not None:
        panel.failed_rank = failing
        panel.failed_log = result.rank_log(failing)
        if panel.failed_log is not None:
            # The stage's reason quotes the same log after its first line: shown once, below.
            panel.reason = panel.reason.split("\n", 1)[0]


def distributed_panel(
    job: AdaptationJob, *, pools_without_worker: Mapping[int, AcceleratorPool] | None = None
) -> DistributedPanel | None:
    """The multi-device validation panel of `job` (stage runs prefetched), or None when it
    has no `distributed` run. `pools_without_worker` (by id) marks a pending or queued run
    whose pool no live worker serves as waiting for one."""
    run = latest_runs_by_stage(job).get(DISTRIBUTED_STAGE)
    if run is None:
        return None
    panel = DistributedPanel(job=job, run=run)
    result = DistributedResult.from_stored(run.result)
    if settle_unfinished(panel, job, run, pools_without_worker):
        return panel
    if run.status == StageStatus.FAILED:
        panel.state = FAILED
        panel.reason = (result.reason or run.error or "").strip()
    else:
        verdict = result.verdict
        panel.state = verdict if verdict in (PASSED, FAILED) else "not-validated"
        panel.reason = result.reason
    panel.plan_split = result.plan
    panel.pool_devices = result.pool_devices
    # A degree below 2 is the not-validated reason itself: said once.
    panel.degree_reason = "" if result.degree_reason == panel.reason else result.degree_reason
    panel.divisibility = result.divisibility
    panel.ep_note = result.ep_note
    panel.notes = result.notes
    # A failure the job asked for, to prove the checks: said under the verdict.
    panel.inject = list(result.inject.items())
    if result.ran:
        _validated(panel, result)
    return panel


def distributed_panels(
    release: ModelRelease, *, pools_without_worker: Mapping[int, AcceleratorPool] | None = None
) -> list[DistributedPanel]:
    """A panel per job of the release with a `distributed` run, newest job first (jobs and
    their stage runs prefetched, as `selectors.release_detail` does)."""
    return [
        panel
        for job in release_jobs(release)
        if (panel := distributed_panel(job, pools_without_worker=pools_without_worker)) is not None
    ]
