"""The multi-device validation's known limitations: the plan's split not validated here,
its outputs off the single-device reference, a rank that crashed or hung, and expert
parallelism left out; and the keys a run could not judge (`unjudged_keys`). Registered as
the stage's `findings` and `unjudged_keys` in `engine.registry`; their words are
`templates/limitations/distributed/`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine.findings import BLOCKER, MINOR, Finding, gist
from engine.stages.distributed.degree import EP_NOT_VALIDATED

DISTRIBUTED_NOT_VALIDATED = "distributed:not-validated"
DISTRIBUTED_MISMATCH = "distributed:mismatch"
DISTRIBUTED_RANK_FAILED = "distributed:rank-failed"
DISTRIBUTED_EP_NOT_VALIDATED = "distributed:ep-not-validated"
# Lines of a failed run's reason quoted in its note, and the longest line kept.
_REASON_LINES = 8
_REASON_LINE_CHARS = 300


def _planned_split(result: Mapping[str, Any]) -> dict[str, Any] | None:
    """The plan's split the stage was asked to validate ({"tp", "pp", "ep", "dp"}), None when
    the result names none."""
    plan = result.get("plan")
    if not isinstance(plan, Mapping) or not plan.get("tp"):
        return None
    return {key: plan.get(key) for key in ("tp", "pp", "ep", "dp")}


def _run(result: Mapping[str, Any], pool: str) -> dict[str, Any]:
    """What every note's words say of the run: where its ranks ran (`world_size` processes of
    `backend` on `pool`, device `device_type`), the split it validated (`validated`: "tp",
    "ep"), the plan's (`plan`, None when unnamed) and why that degree (`degree_reason`)."""
    return {
        "pool": pool,
        "world_size": result.get("world_size"),
        "backend": str(result.get("backend") or ""),
        "device_type": str(result.get("device_type") or ""),
        "validated": {"tp": result.get("tp"), "ep": result.get("ep")},
        "plan": _planned_split(result),
        "degree_reason": str(result.get("degree_reason") or ""),
    }


def _distributed_not_validated(result: Mapping[str, Any], pool: str) -> Finding:
    reason = str(result.get("reason") or "no reason given")
    degree = str(result.get("degree_reason") or "")
    return Finding(
        key=DISTRIBUTED_NOT_VALIDATED,
        template="distributed/not-validated",
        data=_run(result, pool)
        | {
            "reason": reason,
            "pool_devices": fmt.finite(result.get("pool_devices")),
            # The split it would have run, when that says more than the reason.
            "degree_reason": degree if degree != reason else "",
        },
        severity=MINOR,
    )


def _rank_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """One rank's comparison with the reference, as its note's table shows it."""
    divergent = row.get("first_divergent") or {}
    return {
        "rank": row.get("rank"),
        "max_abs_error": row.get("max_abs_error"),
        "tolerance": row.get("tolerance"),
        "top1_agreement": row.get("top1_agreement"),
        "module": divergent.get("module"),
        "layer": divergent.get("layer"),
        "passed": bool(row.get("passed")),
    }


def _distributed_mismatch(result: Mapping[str, Any], pool: str) -> Finding:
    ranks = [row for row in result.get("ranks") or [] if isinstance(row, Mapping)]
    failing = [row for row in ranks if row.get("passed") is False]
    first: Mapping[str, Any] = failing[0] if failing else {}
    tolerance = result.get("tolerance") if isinstance(result.get("tolerance"), Mapping) else {}
    divergent = first.get("first_divergent") or result.get("first_divergent") or {}
    return Finding(
        key=DISTRIBUTED_MISMATCH,
        template="distributed/mismatch",
        data=_run(result, pool)
        | {
            "ranks": [_rank_row(row) for row in ranks],
            "failing": len(failing),
            # The first failing rank: its number, its error, its figure against its limit.
            "first_rank": first.get("rank"),
            "first_error": str(first.get("error") or ""),
            "error": fmt.finite(first.get("max_abs_error", result.get("max_abs_error"))),
            "limit": first.get("tolerance", tolerance.get("max_abs_error")),
            "divergent": {
                key: divergent.get(key)
                for key in ("module", "layer", "kind", "max_abs_error", "tolerance", "shape")
            },
            "tolerance_rule": str(tolerance.get("rule") or ""),
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


def _distributed_rank_failed(result: Mapping[str, Any], pool: str) -> Finding:
    reason = str(result.get("reason") or "")
    logs = [entry for entry in result.get("rank_logs") or [] if isinstance(entry, Mapping)]
    failed_rank = result.get("failed_rank")
    failed = next((entry for entry in logs if entry.get("rank") == failed_rank), None)
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
        data=_run(result, pool)
        | {
            "culprit": culprit,
            # A rank that fell behind: its peers timed out, so the run hung.
            "hung": bool(hung) or "stopped after" in culprit,
            # The time limit the ranks ran past, in seconds (as `run.py` writes it, `:g`).
            "hung_within_s": _seconds(hung.group(1)) if hung else None,
            "failed_rank": failed_rank,
            "failed_exit_code": (failed or {}).get("exit_code"),
            "reason_gist": gist(reason),
            "elapsed_s": result.get("elapsed_s"),
            # The reason's first lines, quoted as the stage wrote them, and where they were cut.
            "quoted": "\n".join(quoted[:_REASON_LINES]),
            "cut_at_lines": _REASON_LINES if len(quoted) > _REASON_LINES else None,
            "rank_logs": [
                {"rank": entry.get("rank"), "exit_code": entry.get("exit_code")} for entry in logs
            ],
            # torchrun stops the other ranks with SIGTERM once one fails.
            "others_stopped": any(entry.get("exit_code") == -15 for entry in logs),
        },
        severity=BLOCKER,
    )


def _distributed_ep_not_validated(result: Mapping[str, Any], pool: str) -> Finding:
    note = str(result["ep_note"])
    why = note[len(EP_NOT_VALIDATED) :] if note.lower().startswith(EP_NOT_VALIDATED) else note
    plan = result.get("plan") if isinstance(result.get("plan"), Mapping) else {}
    planned_ep = fmt.finite(plan.get("ep"))
    return Finding(
        key=DISTRIBUTED_EP_NOT_VALIDATED,
        template="distributed/ep-not-validated",
        data=_run(result, pool)
        | {
            "why": why,
            "passed": result.get("passed") if result.get("passed") in (True, False) else None,
            # The plan serves the experts with EP>1 (else the job's options asked for it).
            "planned_ep": plan.get("ep") if planned_ep is not None and planned_ep > 1 else None,
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
    if result.get("inject"):
        return []
    validated = result.get("validated")
    if validated is False:
        return [_distributed_not_validated(result, pool)]
    if validated is not True or result.get("passed") not in (True, False):
        return None
    found = []
    if result["passed"] is False:
        ranks = [row for row in result.get("ranks") or [] if isinstance(row, Mapping)]
        if ranks:
            found.append(_distributed_mismatch(result, pool))
        else:
            found.append(_distributed_rank_failed(result, pool))
    if result.get("ep_note"):
        found.append(_distributed_ep_not_validated(result, pool))
    return found


def unjudged_keys(result: Mapping[str, Any]) -> frozenset[str]:
    """The distributed notes a run could not judge: a run that validated nothing says nothing
    about a mismatch, a crash or expert parallelism found before; a run whose ranks crashed
    compared no outputs, so it says nothing about a mismatch; a run broken on purpose (its
    `inject` option) says nothing at all."""
    if result.get("inject"):
        return frozenset(
            {
                DISTRIBUTED_NOT_VALIDATED,
                DISTRIBUTED_MISMATCH,
                DISTRIBUTED_RANK_FAILED,
                DISTRIBUTED_EP_NOT_VALIDATED,
            }
        )
    if result.get("validated") is False:
        return frozenset(
            {DISTRIBUTED_MISMATCH, DISTRIBUTED_RANK_FAILED, DISTRIBUTED_EP_NOT_VALIDATED}
        )
    ranks = [row for row in result.get("ranks") or [] if isinstance(row, Mapping)]
    if result.get("validated") is True and result.get("passed") is False and not ranks:
        return frozenset({DISTRIBUTED_MISMATCH})
    return frozenset()
