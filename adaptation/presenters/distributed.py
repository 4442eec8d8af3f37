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

from adaptation.models import AcceleratorPool, AdaptationJob, ModelRelease, StageRun, StageStatus
from adaptation.presenters.plan import DISTRIBUTED_STAGE
from adaptation.presenters.release_jobs import release_jobs
from adaptation.presenters.stages import SkippedBecause, settle_unfinished
from adaptation.selectors.jobs import latest_runs_by_stage
from engine.stages.distributed.result import FAILED, PASSED, DistributedResult, RankLog


@dataclass
class DistributedPanel:
    """One job's multi-device validation: its latest `distributed` attempt. `state` is
    "passed", "failed", "not-validated", "waiting" (pending, queued, running), "skipped" or
    "cancelled"; `reason` the stage's own words ("" when it gave none). The figures are its
    typed `result`'s, read there by the template: the split, ranks, headline, logs and how it
    was run only when `validated` (the run validated a split, passed or failed)."""

    job: AdaptationJob
    run: StageRun
    result: DistributedResult = field(default_factory=DistributedResult)
    state: str = "waiting"
    # Pending or queued on a pool no live worker serves: that pool (it says so), else None.
    waiting_for: AcceleratorPool | None = None
    skipped: SkippedBecause | None = None
    reason: str = ""
    validated: bool = False
    degree_reason: str = ""  # why the degree validated differs from the plan's
    failed_rank: int | None = None
    failed_log: RankLog | None = None

    @property
    def dom_id(self) -> str:
        return f"distributed-job-{self.job.pk}"

    @property
    def divisibility_broken(self) -> bool:
        """Whether a size the degree must divide was not kept for the twin (the panel then
        shows how the run was set up unfolded)."""
        return any(row.kept is False for row in self.result.divisibility)

    @property
    def described(self) -> bool:
        """Whether a validated run says how it was made: the twin, the prompt, the
        reference, the launcher or the ranks' wall time."""
        result = self.result
        return self.validated and any(
            (
                result.twin is not None,
                result.prompted,
                result.tolerance.reference,
                result.launcher,
                result.elapsed_s is not None,
            )
        )


def _validated(panel: DistributedPanel, result: DistributedResult) -> None:
    """Mark a run that validated the split (passed or failed), with its failing rank's log."""
    panel.validated = True
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
    result = DistributedResult.from_stored(run.result)
    panel = DistributedPanel(job=job, run=run, result=result)
    if settle_unfinished(panel, job, run, pools_without_worker):
        return panel
    if run.status == StageStatus.FAILED:
        panel.state = FAILED
        panel.reason = (result.reason or run.error or "").strip()
    else:
        verdict = result.verdict
        panel.state = verdict if verdict in (PASSED, FAILED) else "not-validated"
        panel.reason = result.reason
    # A degree below 2 is the not-validated reason itself: said once.
    panel.degree_reason = "" if result.degree_reason == panel.reason else result.degree_reason
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
