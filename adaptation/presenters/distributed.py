"""The release page's "Multi-device validation" panel: each job's latest `distributed` run.

The stage (`engine/stages/distributed/`) runs the plan's tensor-parallel split of the scaled
twin, with expert parallelism for a MoE release whose plan uses it, across that many
torch.distributed processes on the pool's worker, and compares every rank with the
single-process float32 reference. Every figure here is measured on the twin, never the full
model's, and the panel says so; the plan's split (a prediction) is shown beside the one
validated, with why the degree differs when it does.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adaptation.models import AcceleratorPool, AdaptationJob, ModelRelease, StageRun, StageStatus
from adaptation.presenters.plan import DISTRIBUTED_STAGE
from adaptation.presenters.plan_figures import Split, whole
from adaptation.presenters.release_jobs import release_jobs
from adaptation.presenters.stages import SkippedBecause, settle_unfinished
from adaptation.selectors.jobs import latest_runs_by_stage
from engine.formatting import finite
from engine.stored import as_list, as_mapping, numbers


@dataclass(frozen=True)
class Divergence:
    """The first module of a rank whose output left its tolerance: its path, layer and kind
    (attention, mlp, ...), and its error against its tolerance, or the shape that did not
    match the reference's."""

    module: str
    layer: Any
    kind: str
    max_abs_error: float | None
    tolerance: float | None
    shape: Any

    @property
    def placed(self) -> bool:
        """Whether the stage said where the module is (its layer or kind)."""
        return self.layer is not None or bool(self.kind)

    @property
    def sized(self) -> bool:
        """Whether the stage said by how much it diverged (an error, or a shape)."""
        return self.max_abs_error is not None or bool(self.shape)


@dataclass(frozen=True)
class RankRow:
    """One rank against the float32 reference (measured on the twin): its largest logit
    error and tolerance, top-1 agreement (a fraction), first divergent module (None when
    every module stayed within its tolerance), decode step time (s) and share of time in
    collectives (a fraction); `error` when its outputs could not be compared."""

    rank: Any
    max_abs_error: float | None
    tolerance: float | None
    top1_agreement: float | None
    divergence: Divergence | None
    step_time_s: float | None
    comm_fraction: float | None
    passed: bool | None
    error: str = ""


@dataclass(frozen=True)
class DivisibilityRow:
    """Heads or experts over the degree, in the release and in its twin, and whether each
    divides (None: not said) and the split was kept."""

    name: str
    release: Any
    twin: Any
    degree: Any
    release_divisible: bool | None
    twin_divisible: bool | None
    kept: bool | None


@dataclass(frozen=True)
class RankLog:
    """The end of one rank's log and how its process ended: killed by `signal` (its name in
    `signal_name`, "" for one Python does not name), else with its `exit_code` (None for
    both: not recorded)."""

    rank: Any
    excerpt: str
    exit_code: int | None = None
    signal: int | None = None
    signal_name: str = ""
    failing: bool = False

    @property
    def ended(self) -> bool:
        """Whether the log says how the process ended."""
        return self.signal is not None or self.exit_code is not None


def rank_log(entry: Mapping[str, Any], *, failing: int | None = None) -> RankLog:
    """A rank's stored log entry ({"rank", "exit_code" as `subprocess` reports it: negative
    for a signal, "excerpt"})."""
    code = whole(entry.get("exit_code"))
    killed = -code if code is not None and code < 0 else None
    name = ""
    if killed is not None:
        try:
            name = signal.Signals(killed).name
        except ValueError:
            name = ""  # a signal number Python does not name
    return RankLog(
        rank=entry.get("rank"),
        excerpt=str(entry.get("excerpt") or ""),
        exit_code=code if killed is None else None,
        signal=killed,
        signal_name=name,
        failing=failing is not None and entry.get("rank") == failing,
    )


@dataclass(frozen=True)
class Headline:
    """Decode across the ranks (measured on the twin): the step time (s, the slowest rank's
    median) and tokens/s at TP=`tp` and at TP=1, the share of time in collectives and the
    scaling efficiency (fractions), with the timed steps and the batch they ran."""

    tp: Any
    step_time_s: float | None
    step_time_tp1_s: float | None
    tokens_per_s: float | None
    tokens_per_s_tp1: float | None
    comm_fraction: float | None
    scaling_efficiency: float | None
    timing_steps: Any
    batch: Any


def _headline(result: Mapping[str, Any]) -> Headline | None:
    """None when the run measured none of the headline figures (a crashed rank)."""
    measured = numbers(
        result,
        "step_time_s",
        "step_time_tp1_s",
        "tokens_per_s",
        "tokens_per_s_tp1",
        "comm_fraction",
        "scaling_efficiency",
    )
    if all(figure is None for figure in measured.values()):
        return None
    return Headline(
        tp=result.get("tp"),
        timing_steps=result.get("timing_steps"),
        batch=as_mapping(result.get("prompt")).get("batch"),
        **measured,
    )


@dataclass(frozen=True)
class RunFacts:
    """How the run was made: the twin (class, parameters, where its weights come from), the
    prompt (batch x tokens) and the decode steps compared and timed, the reference, the
    launcher and the ranks' wall time (s)."""

    twin_class: str | None = None  # None: the result describes no twin
    twin_parameters: float | None = None
    weights_source: str = ""
    prompted: bool = False  # the result says what prompt the ranks ran
    batch: Any = None
    prompt_tokens: Any = None
    decode_steps: Any = None
    timing_steps: Any = None
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


def _facts(result: Mapping[str, Any]) -> RunFacts:
    twin = as_mapping(result.get("twin"))
    prompt = as_mapping(result.get("prompt"))
    return RunFacts(
        twin_class=str(twin.get("class") or "") if twin else None,
        twin_parameters=finite(twin.get("parameters")),
        weights_source=str(twin.get("weights_source") or ""),
        prompted=bool(prompt),
        batch=prompt.get("batch"),
        prompt_tokens=prompt.get("tokens"),
        decode_steps=result.get("decode_steps"),
        timing_steps=result.get("timing_steps"),
        reference=str(as_mapping(result.get("tolerance")).get("reference") or ""),
        launcher=str(result.get("launcher") or ""),
        elapsed_s=finite(result.get("elapsed_s")),
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
    tp: Any = None
    ep: Any = None
    world_size: int | None = None
    backend: str = ""
    device_type: str = ""
    threads_per_rank: Any = None
    plan_split: Split | None = None  # the plan's split, beside the one validated
    pool_devices: int | None = None
    degree_reason: str = ""  # why the degree validated differs from the plan's
    headline: Headline | None = None
    ranks: list[RankRow] = field(default_factory=list)
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


def _divergence(value: Any) -> Divergence | None:
    div = as_mapping(value)
    if not div:
        return None
    return Divergence(
        module=str(div.get("module") or ""),
        layer=div.get("layer"),
        kind=str(div.get("kind") or ""),
        max_abs_error=finite(div.get("max_abs_error")),
        tolerance=finite(div.get("tolerance")),
        shape=div.get("shape"),
    )


def _rank_row(row: Mapping[str, Any]) -> RankRow:
    passed = row.get("passed")
    return RankRow(
        rank=row.get("rank"),
        divergence=_divergence(row.get("first_divergent")),
        passed=passed if isinstance(passed, bool) else None,
        error=str(row.get("error") or ""),
        **numbers(
            row, "max_abs_error", "tolerance", "top1_agreement", "step_time_s", "comm_fraction"
        ),
    )


def _yes_no(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _divisibility(rows: Any) -> list[DivisibilityRow]:
    return [
        DivisibilityRow(
            name=str(row.get("name") or ""),
            release=row.get("release"),
            twin=row.get("twin"),
            degree=row.get("degree"),
            release_divisible=_yes_no(row.get("release_divisible")),
            twin_divisible=_yes_no(row.get("twin_divisible")),
            kept=_yes_no(row.get("kept")),
        )
        for row in (as_mapping(r) for r in as_list(rows))
    ]


def _failing_rank(result: Mapping[str, Any]) -> int | None:
    """The rank the failure is about: the one that crashed (`failed_rank`), else the first
    whose outputs are off the reference."""
    failed = whole(result.get("failed_rank"))
    if failed is not None:
        return failed
    for row in (as_mapping(r) for r in as_list(result.get("ranks"))):
        if row.get("passed") is False and whole(row.get("rank")) is not None:
            return row["rank"]
    return None


def _validated(panel: DistributedPanel, result: Mapping[str, Any]) -> None:
    """Fill the figures of a run that validated the split (passed or failed)."""
    panel.validated = True
    panel.tp, panel.ep = result.get("tp"), result.get("ep")
    panel.world_size = whole(result.get("world_size"))
    panel.backend = str(result.get("backend") or "")
    panel.device_type = str(result.get("device_type") or "")
    panel.threads_per_rank = result.get("threads_per_rank")
    panel.headline = _headline(result)
    panel.ranks = [_rank_row(as_mapping(r)) for r in as_list(result.get("ranks"))]
    panel.tolerance_rule = str(as_mapping(result.get("tolerance")).get("rule") or "")
    panel.facts = _facts(result)
    failing = _failing_rank(result) if panel.state == "failed" else None
    panel.rank_logs = [
        rank_log(entry, failing=failing)
        for entry in (as_mapping(e) for e in as_list(result.get("rank_logs")))
    ]
    if failing is not None:
        panel.failed_rank = failing
        panel.failed_log = next((log for log in panel.rank_logs if log.failing), None)
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
    result = as_mapping(run.result)
    if settle_unfinished(panel, job, run, pools_without_worker):
        return panel
    if run.status == StageStatus.FAILED:
        panel.state = "failed"
        panel.reason = str(result.get("reason") or run.error or "").strip()
    elif result.get("validated") is False or result.get("passed") is None:
        panel.state = "not-validated"
        panel.reason = str(result.get("reason") or "")
    else:
        panel.state = "passed" if result.get("passed") is True else "failed"
        panel.reason = str(result.get("reason") or "")
    plan = as_mapping(result.get("plan"))
    panel.plan_split = Split.of(plan) if plan else None
    panel.pool_devices = whole(result.get("pool_devices"))
    degree_reason = str(result.get("degree_reason") or "")
    # A degree below 2 is the not-validated reason itself: said once.
    panel.degree_reason = "" if degree_reason == panel.reason else degree_reason
    panel.divisibility = _divisibility(result.get("divisibility"))
    panel.ep_note = str(result.get("ep_note") or "")
    panel.notes = [str(n) for n in as_list(result.get("notes"))]
    # A failure the job asked for, to prove the checks: said under the verdict.
    panel.inject = list(as_mapping(result.get("inject")).items())
    if result.get("validated") is True:
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
