"""The multi-device validation's known limitations: the plan's split not validated here,
its outputs off the single-device reference, a rank that crashed or hung, and expert
parallelism left out; and the keys a run could not judge (`unjudged_keys`). Registered as
the stage's `findings` and `unjudged_keys` in `engine.registry`; their words are
`templates/limitations/distributed/`. What they say of the run they ask its typed result
(`DistributedResult`)."""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from typing import Any

from engine.findings import BLOCKER, MINOR, Finding, gist
from engine.stages.distributed.result import (
    FAILED,
    PASSED,
    DistributedResult,
    Divergence,
    RankComparison,
)

DISTRIBUTED_NOT_VALIDATED = "distributed:not-validated"
DISTRIBUTED_MISMATCH = "distributed:mismatch"
DISTRIBUTED_RANK_FAILED = "distributed:rank-failed"
DISTRIBUTED_EP_NOT_VALIDATED = "distributed:ep-not-validated"
# Lines of a failed run's reason quoted in its note, and the longest line kept.
_REASON_LINES = 8
_REASON_LINE_CHARS = 300
# What a divergent module's note says of it.
_DIVERGENCE_KEYS = ("module", "layer", "kind", "max_abs_error", "tolerance", "shape")


def _planned_split(run: DistributedResult) -> dict[str, Any] | None:
    """The plan's split the stage was asked to validate ({"tp", "pp", "ep", "dp"}), None when
    the result names none."""
    if run.plan is None or not run.plan.tp:
        return None
    return run.plan.to_dict()


def _run(run: DistributedResult, pool: str) -> dict[str, Any]:
    """What every note's words say of the run: where its ranks ran (`world_size` processes of
    `backend` on `pool`, device `device_type`), the split it validated (`validated`: "tp",
    "ep"), the plan's (`plan`, None when unnamed) and why that degree (`degree_reason`)."""
    return {
        "pool": pool,
        "world_size": run.world_size,
        "backend": run.backend,
        "device_type": run.device_type,
        "validated": {"tp": run.tp, "ep": run.ep},
        "plan": _planned_split(run),
        "degree_reason": run.degree_reason,
    }


def _distributed_not_validated(run: DistributedResult, pool: str) -> Finding:
    reason = run.reason or "no reason given"
    degree = run.degree_reason
    return Finding(
        key=DISTRIBUTED_NOT_VALIDATED,
        template="distributed/not-validated",
        data=_run(run, pool)
        | {
            "reason": reason,
            "pool_devices": run.pool_devices,
            # The split it would have run, when that says more than the reason.
            "degree_reason": degree if degree != reason else "",
        },
        severity=MINOR,
    )


def _rank_row(row: RankComparison) -> dict[str, Any]:
    """One rank's comparison with the reference, as its note's table shows it."""
    divergent = row.divergence
    return {
        "rank": row.rank,
        "max_abs_error": row.max_abs_error,
        "tolerance": row.tolerance,
        "top1_agreement": row.top1_agreement,
        "module": divergent.module if divergent is not None else None,
        "layer": divergent.layer if divergent is not None else None,
        "passed": row.passed is True,
    }


def _divergence(divergent: Divergence | None) -> dict[str, Any]:
    """The first divergent module as the note says it (every key None without one)."""
    if divergent is None:
        return dict.fromkeys(_DIVERGENCE_KEYS)
    return divergent.where() | {
        "max_abs_error": divergent.max_abs_error,
        "tolerance": divergent.tolerance,
        "shape": divergent.shape,
    }


def _distributed_mismatch(run: DistributedResult, pool: str) -> Finding:
    failing = run.failing_ranks
    first = failing[0] if failing else None
    # The first failing rank's figures; the run's where no rank failed by name.
    divergent = (first.divergence if first is not None else None) or run.first_divergent
    return Finding(
        key=DISTRIBUTED_MISMATCH,
        template="distributed/mismatch",
        data=_run(run, pool)
        | {
            "ranks": [_rank_row(row) for row in run.ranks],
            "failing": len(failing),
            # The first failing rank: its number, its error, its figure against its limit.
            "first_rank": first.rank if first is not None else None,
            "first_error": first.error if first is not None else "",
            "error": first.max_abs_error if first is not None else run.max_abs_error,
            "limit": first.tolerance if first is not None else run.tolerance.max_abs_error,
            "divergent": _divergence(divergent),
            "tolerance_rule": run.tolerance.rule,
        },
        severity=BLOCKER,
    )


def _seconds(text: str) -> float | None:
    """A time limit as a reason writes it ("300", "12.5", "1,200") in seconds; None when it
    reads as no number."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _distributed_rank_failed(run: DistributedResult, pool: str) -> Finding:
    reason = run.reason
    failed = run.rank_log(run.failed_rank)
    hung = re.search(r"did not finish within ([0-9.,]+) s", reason)
    # The reason's first line is "<headline>: <the culprit rank and how it ended>".
    culprit = next(iter(reason.splitlines()), "").partition(": ")[2]
    quoted = [
        line if len(line) <= _REASON_LINE_CHARS else line[: _REASON_LINE_CHARS - 1] + "…"
        for line in (ln.rstrip() for ln in reason.splitlines())
        if line.strip()
    ]
    return Finding(
        key=DISTRIBUTED_RANK_FAILED,
        template="distributed/rank-failed",
        data=_run(run, pool)
        | {
            "culprit": culprit,
            # A rank that fell behind: its peers timed out, so the run hung.
            "hung": bool(hung) or "stopped after" in culprit,
            # The time limit the ranks ran past, in seconds (as `run.py` writes it, `:g`).
            "hung_within_s": _seconds(hung.group(1)) if hung else None,
            "failed_rank": run.failed_rank,
            "failed_exit_code": failed.exit_code if failed is not None else None,
            "reason_gist": gist(reason),
            "elapsed_s": run.elapsed_s,
            # The reason's first lines, quoted as the stage wrote them, and where they were cut.
            "quoted": "\n".join(quoted[:_REASON_LINES]),
            "cut_at_lines": _REASON_LINES if len(quoted) > _REASON_LINES else None,
            "rank_logs": [{"rank": log.rank, "exit_code": log.exit_code} for log in run.rank_logs],
            # torchrun stops the other ranks with SIGTERM once one fails.
            "others_stopped": any(log.signal == signal.SIGTERM for log in run.rank_logs),
        },
        severity=BLOCKER,
    )


def _distributed_ep_not_validated(run: DistributedResult, pool: str) -> Finding:
    planned_ep = run.plan.ep if run.plan is not None else None
    return Finding(
        key=DISTRIBUTED_EP_NOT_VALIDATED,
        template="distributed/ep-not-validated",
        data=_run(run, pool)
        | {
            "why": run.ep_reason,
            "passed": run.passed,
            # The plan serves the experts with EP>1 (else the job's options asked for it).
            "planned_ep": planned_ep if planned_ep is not None and planned_ep > 1 else None,
        },
        severity=MINOR,
    )


def findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """The multi-device validation's notes: a minor note when the split could not be
    validated here (why: no tensor-parallel plan in transformers, the release's own modeling
    code, one device, a backend without torch.distributed); a blocker when a rank's outputs
    are off the single-device reference (the split, the rank, its logit error against the
    tolerance, the first divergent module) or when a rank crashed or the ranks hung (the
    rank, its exit status, the first lines of the reason); a minor note when expert
    parallelism was not validated beside the TP split (`ep_note`). None for a result that is
    not a distributed run. A run the job broke on purpose (its `inject` option) raises
    nothing: it proves the check, not a fault of the release."""
    run = DistributedResult.from_stored(result)
    if run.broken_on_purpose:
        return []
    if run.validated is False:
        return [_distributed_not_validated(run, pool)]
    if run.verdict not in (PASSED, FAILED):
        return None
    found = []
    if run.verdict == FAILED:
        # A crash (no rank's outputs compared) against outputs off the reference.
        if run.crashed:
            found.append(_distributed_rank_failed(run, pool))
        else:
            found.append(_distributed_mismatch(run, pool))
    if run.ep_note:
        found.append(_distributed_ep_not_validated(run, pool))
    return found


def unjudged_keys(result: Mapping[str, Any]) -> frozenset[str]:
    """The distributed notes a run could not judge: a run that validated nothing says nothing
    about a mismatch, a crash or expert parallelism found before; a run whose ranks crashed
    compared no outputs, so it says nothing about a mismatch; a run broken on purpose (its
    `inject` option) says nothing at all."""
    run = DistributedResult.from_stored(result)
    if run.broken_on_purpose:
        return frozenset(
            {
                DISTRIBUTED_NOT_VALIDATED,
                DISTRIBUTED_MISMATCH,
                DISTRIBUTED_RANK_FAILED,
                DISTRIBUTED_EP_NOT_VALIDATED,
            }
        )
    if run.validated is False:
        return frozenset(
            {DISTRIBUTED_MISMATCH, DISTRIBUTED_RANK_FAILED, DISTRIBUTED_EP_NOT_VALIDATED}
        )
    if run.crashed:
        return frozenset({DISTRIBUTED_MISMATCH})
    return frozenset()
