"""Shapes the `distributed` stage's results for the release page's "Multi-device validation"
panel.

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
from adaptation.performance_presenters import ms_text, skipped_reason
from adaptation.plan_presenters import (
    DISTRIBUTED_STAGE,
    Fact,
    split_text,
    tokens_per_s_text,
    validated_split_label,
)
from adaptation.selectors.jobs import latest_runs_by_stage
from engine.formatting import MISSING, duration, percent, scientific
from engine.formatting import finite as _number
from engine.formatting import params as params_short
from engine.stored import as_list, as_mapping

WAITING = (StageStatus.PENDING, StageStatus.QUEUED, StageStatus.RUNNING)


@dataclass(frozen=True)
class RankRow:
    """One rank against the float32 reference (measured on the twin)."""

    rank: str
    max_abs_error: str
    tolerance: str
    top1_agreement: str
    first_divergent: str  # "none" when every module stayed within its tolerance
    step_time: str
    comm_fraction: str
    passed: bool | None
    error: str = ""  # the rank's outputs could not be compared (shape mismatch, ...)


@dataclass(frozen=True)
class DivisibilityRow:
    """Heads or experts over the degree, in the release and in its twin."""

    name: str
    release: str
    twin: str
    degree: str
    release_divisible: bool | None
    twin_divisible: bool | None
    kept: bool | None


@dataclass(frozen=True)
class RankLog:
    """The end of one rank's log, with how the process ended."""

    rank: str
    exit_status: str  # "" when unknown
    excerpt: str
    failing: bool = False


@dataclass
class DistributedPanel:
    """One job's multi-device validation: its latest `distributed` attempt."""

    job: AdaptationJob
    run: StageRun
    # "passed", "failed", "not-validated", "waiting" (pending, queued, running), "skipped" or
    # "cancelled"
    state: str = "waiting"
    # Pending or queued on a pool no live worker serves: that pool (it says so), else None.
    waiting_for: AcceleratorPool | None = None
    skipped: str = ""  # why the attempt was skipped ("" unless it was)
    reason: str = ""
    injected: str = ""  # the job broke the run on purpose (its inject option): said so
    split_label: str = ""  # the split validated, "TP=2 EP=2"
    split: list[Fact] = field(default_factory=list)  # the split validated
    plan_split: list[Fact] = field(default_factory=list)  # the plan's, beside it
    degree_reason: str = ""
    headline: list[Fact] = field(default_factory=list)
    ranks: list[RankRow] = field(default_factory=list)
    tolerance_rule: str = ""
    divisibility: list[DivisibilityRow] = field(default_factory=list)
    ep_note: str = ""
    failed_rank: str = ""
    failed_log: RankLog | None = None
    rank_logs: list[RankLog] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def dom_id(self) -> str:
        return f"distributed-job-{self.job.pk}"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def exit_status_text(code: Any) -> str:
    """How a rank's process ended: -9 → "killed by SIGKILL", 1 → "exit code 1", None → ""."""
    code = _int(code)
    if code is None:
        return ""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _first_divergent(divergent: Any) -> str:
    div = as_mapping(divergent)
    if not div:
        return "none"
    where = ", ".join(
        part
        for part in (
            f"layer {div['layer']}" if div.get("layer") is not None else "",
            str(div.get("kind") or ""),
        )
        if part
    )
    error = _number(div.get("max_abs_error"))
    size = (
        f"error {scientific(error)} > {scientific(div.get('tolerance'))}"
        if error is not None
        else (f"shape {div['shape']}" if div.get("shape") else "")
    )
    details = "; ".join(part for part in (where, size) if part)
    return f"{div.get('module') or MISSING}" + (f" ({details})" if details else "")


def _rank_row(row: Mapping[str, Any]) -> RankRow:
    passed = row.get("passed")
    return RankRow(
        rank=str(row.get("rank", MISSING)),
        max_abs_error=scientific(row.get("max_abs_error")),
        tolerance=scientific(row.get("tolerance")),
        top1_agreement=percent(row.get("top1_agreement")),
        first_divergent=_first_divergent(row.get("first_divergent")),
        step_time=ms_text(row.get("step_time_s")),
        comm_fraction=percent(row.get("comm_fraction")),
        passed=passed if isinstance(passed, bool) else None,
        error=str(row.get("error") or ""),
    )


def _yes_no(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _divisibility(rows: Any) -> list[DivisibilityRow]:
    return [
        DivisibilityRow(
            name=str(row.get("name") or MISSING),
            release=str(row.get("release", MISSING)),
            twin=str(row.get("twin", MISSING)),
            degree=str(row.get("degree", MISSING)),
            release_divisible=_yes_no(row.get("release_divisible")),
            twin_divisible=_yes_no(row.get("twin_divisible")),
            kept=_yes_no(row.get("kept")),
        )
        for row in (as_mapping(r) for r in as_list(rows))
    ]


def _split(result: Mapping[str, Any]) -> list[Fact]:
    """The split the run validated (only for a run that validated one)."""
    world = _int(result.get("world_size"))
    backend, device = result.get("backend"), result.get("device_type")
    return [
        Fact("Tensor parallel (TP)", str(result.get("tp", MISSING))),
        Fact("Expert parallel (EP)", str(result.get("ep", MISSING))),
        Fact(
            "World size",
            MISSING if world is None else f"{world} process{'' if world == 1 else 'es'}",
        ),
        Fact(
            "Backend",
            " on ".join(str(v) for v in (backend, device) if v) or MISSING,
        ),
        Fact("Threads per rank", str(result.get("threads_per_rank") or MISSING)),
    ]


def _plan_split(result: Mapping[str, Any]) -> list[Fact]:
    plan = as_mapping(result.get("plan"))
    facts = []
    if plan:
        facts.append(Fact("The plan's split", split_text(plan)))
    devices = _int(result.get("pool_devices"))
    if devices is not None:
        facts.append(Fact("Devices on the worker", str(devices)))
    return facts


def _headline(result: Mapping[str, Any]) -> list[Fact]:
    """Step time and decode tokens/s at TP=N and TP=1, the share of time in collectives and
    the scaling efficiency; [] when the run measured none (a crashed rank)."""
    tp = result.get("tp", MISSING)
    prompt = as_mapping(result.get("prompt"))
    batch = prompt.get("batch")
    timed = result.get("timing_steps")
    figures = (
        "step_time_s",
        "step_time_tp1_s",
        "tokens_per_s",
        "tokens_per_s_tp1",
        "comm_fraction",
        "scaling_efficiency",
    )
    if all(_number(result.get(key)) is None for key in figures):
        return []
    efficiency = _number(result.get("scaling_efficiency"))
    return [
        Fact(
            f"Decode step at TP={tp} (measured, twin)",
            ms_text(result.get("step_time_s")),
            "median" + (f" of {timed} timed steps" if timed else "") + ", the slowest rank's",
        ),
        Fact(
            "Decode step at TP=1 (measured, twin)",
            ms_text(result.get("step_time_tp1_s")),
            "the unsplit twin on one rank's share of the worker",
        ),
        Fact(
            f"Decode at TP={tp} (measured, twin)",
            tokens_per_s_text(result.get("tokens_per_s")),
            f"batch {batch} / step time" if batch else "",
        ),
        Fact(
            "Decode at TP=1 (measured, twin)",
            tokens_per_s_text(result.get("tokens_per_s_tp1")),
            f"batch {batch} / step time" if batch else "",
        ),
        Fact(
            "Time in collectives (measured, twin)",
            percent(result.get("comm_fraction")),
            "mean over ranks of the profiled share of the timed run",
        ),
        Fact(
            "Scaling efficiency (measured, twin)",
            percent(efficiency) + ("" if efficiency is None else f" ({efficiency:.2f} x linear)"),
            f"TP=1 step time / ({tp} x TP={tp} step time); 100 % = linear",
        ),
    ]


def _facts(result: Mapping[str, Any]) -> list[Fact]:
    twin = as_mapping(result.get("twin"))
    prompt = as_mapping(result.get("prompt"))
    tolerance = as_mapping(result.get("tolerance"))
    facts = []
    if twin:
        facts.append(
            Fact(
                "Twin",
                f"{twin.get('class') or MISSING}, {params_short(twin.get('parameters'))} "
                "parameters",
                f"{twin['weights_source']} weights" if twin.get("weights_source") else "",
            )
        )
    if prompt:
        facts.append(
            Fact(
                "Run",
                f"batch {prompt.get('batch', MISSING)} x {prompt.get('tokens', MISSING)} "
                f"prompt tokens, then {result.get('decode_steps', MISSING)} decode steps compared"
                f" and {result.get('timing_steps', MISSING)} timed",
            )
        )
    if tolerance.get("reference"):
        facts.append(Fact("Reference", str(tolerance["reference"])))
    if result.get("launcher"):
        facts.append(Fact("Launcher", str(result["launcher"])))
    if _number(result.get("elapsed_s")) is not None:
        facts.append(Fact("Wall time of the ranks", duration(result["elapsed_s"])))
    return facts


def _logs(result: Mapping[str, Any], failing: int | None) -> list[RankLog]:
    return [
        RankLog(
            rank=str(entry.get("rank", MISSING)),
            exit_status=exit_status_text(entry.get("exit_code")),
            excerpt=str(entry.get("excerpt") or ""),
            failing=failing is not None and entry.get("rank") == failing,
        )
        for entry in (as_mapping(e) for e in as_list(result.get("rank_logs")))
    ]


def _failing_rank(result: Mapping[str, Any]) -> int | None:
    """The rank the failure is about: the one that crashed (`failed_rank`), else the first
    whose outputs are off the reference."""
    failed = _int(result.get("failed_rank"))
    if failed is not None:
        return failed
    for row in (as_mapping(r) for r in as_list(result.get("ranks"))):
        if row.get("passed") is False and _int(row.get("rank")) is not None:
            return row["rank"]
    return None


def _validated(panel: DistributedPanel, result: Mapping[str, Any]) -> None:
    """Fill the figures of a run that validated the split (passed or failed)."""
    panel.split_label = validated_split_label(result)
    panel.split = _split(result)
    panel.headline = _headline(result)
    panel.ranks = [_rank_row(as_mapping(r)) for r in as_list(result.get("ranks"))]
    panel.tolerance_rule = str(as_mapping(result.get("tolerance")).get("rule") or "")
    panel.facts = _facts(result)
    failing = _failing_rank(result) if panel.state == "failed" else None
    panel.rank_logs = _logs(result, failing)
    if failing is not None:
        panel.failed_rank = str(failing)
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
    if run.status in WAITING:
        if run.status != StageStatus.RUNNING:
            panel.waiting_for = (pools_without_worker or {}).get(job.pool_id)
        return panel
    if run.status == StageStatus.SKIPPED:
        panel.state = "skipped"
        panel.skipped = skipped_reason(job, run)
        return panel
    if run.status == StageStatus.CANCELLED:
        panel.state = "cancelled"
        panel.reason = str(run.error or "")
        return panel
    if run.status == StageStatus.FAILED:
        panel.state = "failed"
        panel.reason = (
            str(result.get("reason") or run.error or "").strip()
            or "the distributed stage failed without a reason"
        )
    elif result.get("validated") is False or result.get("passed") is None:
        panel.state = "not-validated"
        panel.reason = str(result.get("reason") or "the split was not validated")
    else:
        panel.state = "passed" if result.get("passed") is True else "failed"
        panel.reason = str(result.get("reason") or "")
    panel.plan_split = _plan_split(result)
    degree_reason = str(result.get("degree_reason") or "")
    # A degree below 2 is the not-validated reason itself: said once.
    panel.degree_reason = "" if degree_reason == panel.reason else degree_reason
    if panel.degree_reason and panel.state == "not-validated":  # not run: what it would have
        panel.degree_reason = f"The split it would have run: {panel.degree_reason}"
    panel.divisibility = _divisibility(result.get("divisibility"))
    panel.ep_note = str(result.get("ep_note") or "")
    panel.notes = [str(n) for n in as_list(result.get("notes"))]
    inject = as_mapping(result.get("inject"))
    if inject:  # a failure the job asked for, to prove the checks: said under the verdict
        asked = ", ".join(f"{key} {value}" for key, value in inject.items())
        panel.injected = f"Broken on purpose by the job's inject option ({asked})."
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
        for job in release.jobs.all()
        if (panel := distributed_panel(job, pools_without_worker=pools_without_worker)) is not None
    ]
