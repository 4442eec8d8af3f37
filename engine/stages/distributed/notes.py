"""The multi-device validation's section of the release notes: the split the `distributed`
stage ran on the twin (TP/EP, processes, backend) against the plan's, its worst max |logit
error| against the tolerance and its top-1 agreement, decode step time at TP=N and TP=1,
the share of time in collectives and the scaling efficiency, all measured on the twin; or
why the split was not validated (`templates/release_notes/sections/distributed.md`).

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from typing import Any

from engine.markdown import first_line
from engine.notes import (
    MEASURED_FULL,
    MEASURED_TWIN,
    NotesContext,
    StageState,
)
from engine.stages.distributed.result import DistributedResult

PLACE = 20


def ran_twin(state: StageState) -> bool:
    """Whether the stage ran the twin: only a split it tried (one it could not validate
    here ran nothing)."""
    return state.result is not None and DistributedResult.from_stored(state.result).ran


def section(state: StageState, notes: NotesContext) -> dict[str, Any]:
    """The validation as data: "status", the plan's split ("plan_split": the one the stage
    read, else the configuration's), "available" and "validated"; for a split it ran: the
    verdict, the split run ({"tp", "ep", "processes", "backend", "device_type"}), the worst
    max |logit error| and its tolerance, top-1 agreement, the first divergent module, a
    failed rank with its process's exit code (None where unknown), step times (s) and
    tokens/s at TP=N and TP=1, the share of time in collectives, the scaling efficiency, and
    why expert parallelism was left out ("ep_note", and "ep_reason" without its "could not
    be validated" lead)."""
    run = DistributedResult.from_stored(state.result)
    configuration = notes.sections.get("plan") or {}
    plan_split = run.plan.to_dict() if run.plan is not None else None
    if plan_split is None and configuration.get("available"):
        plan_split = configuration.get("split")
    base: dict[str, Any] = {
        "status": state.status,
        "plan_split": dict(plan_split) if plan_split else None,
    }
    if state.status not in ("succeeded", "failed") or run.validated is None:
        return base | {"available": False, "validated": False, "reason": state.reason}
    reason = first_line(run.reason or state.reason, 400)
    if not run.ran:
        return base | {
            "available": True,
            "validated": False,
            "passed": None,
            "reason": reason,
            "device_type": run.device_type or None,
            "backend": run.backend or None,
        }
    return base | {
        "available": True,
        "validated": True,
        "passed": run.passed is True,
        "verdict": "passed" if run.passed is True else "failed",
        "reason": reason,
        "label": MEASURED_FULL if run.real_weights else MEASURED_TWIN,
        "split": {
            "tp": run.tp,
            "ep": run.ep,
            "processes": run.world_size,
            "backend": run.backend or None,
            "device_type": run.device_type or None,
        },
        "degree_reason": run.degree_reason,
        "max_abs_error": run.max_abs_error,
        "tolerance": run.tolerance.max_abs_error,
        "top1_agreement": run.top1_agreement,
        "first_divergent": run.first_divergent.where() if run.first_divergent else None,
        "failed_rank": run.failed_rank,
        "failed_rank_exit_code": run.failed_rank_exit_code,
        "step_time_s": run.step_time_s,
        "step_time_tp1_s": run.step_time_tp1_s,
        "tokens_per_s": run.tokens_per_s,
        "tokens_per_s_tp1": run.tokens_per_s_tp1,
        "comm_fraction": run.comm_fraction,
        "scaling_efficiency": run.scaling_efficiency,
        "ep_note": run.ep_note,
        "ep_reason": run.ep_reason,
    }
