"""The multi-device validation's section of the release notes: the split the `distributed`
stage ran on the twin (TP/EP, processes, backend) against the plan's, its worst max |logit
error| against the tolerance and its top-1 agreement, decode step time at TP=N and TP=1,
the share of time in collectives and the scaling efficiency, all measured on the twin; or
why the split was not validated (`templates/release_notes/sections/distributed.md`).

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.markdown import first_line
from engine.notes import (
    MEASURED_FULL,
    MEASURED_TWIN,
    NotesContext,
    StageState,
)
from engine.stages.distributed.degree import EP_NOT_VALIDATED

PLACE = 20


def ran_twin(state: StageState) -> bool:
    """Whether the stage ran the twin: only a split it tried (one it could not validate
    here ran nothing)."""
    return state.result is not None and state.result.get("validated") is True


def section(state: StageState, notes: NotesContext) -> dict[str, Any]:
    """The validation as data: "status", the plan's split ("plan_split": the one the stage
    read, else the configuration's), "available" and "validated"; for a split it ran: the
    verdict, the split run ({"tp", "ep", "processes", "backend", "device_type"}), the worst
    max |logit error| and its tolerance, top-1 agreement, the first divergent module, a
    failed rank with its process's exit code (None where unknown), step times (s) and
    tokens/s at TP=N and TP=1, the share of time in collectives, the scaling efficiency, and
    why expert parallelism was left out ("ep_note", and "ep_reason" without its "could not
    be validated" lead)."""
    result = state.result or {}
    configuration = notes.sections.get("plan") or {}
    plan_split = result.get("plan") if isinstance(result.get("plan"), Mapping) else None
    if plan_split is None and configuration.get("available"):
        plan_split = configuration.get("split")
    base: dict[str, Any] = {
        "status": state.status,
        "plan_split": dict(plan_split) if plan_split else None,
    }
    if state.status not in ("succeeded", "failed") or "validated" not in result:
        return base | {"available": False, "validated": False, "reason": state.reason}
    reason = first_line(result.get("reason") or state.reason, 400)
    if result.get("validated") is not True:
        return base | {
            "available": True,
            "validated": False,
            "passed": None,
            "reason": reason,
            "device_type": result.get("device_type"),
            "backend": result.get("backend"),
        }
    twin = result.get("twin") if isinstance(result.get("twin"), Mapping) else {}
    tolerance = result.get("tolerance") if isinstance(result.get("tolerance"), Mapping) else {}
    divergent = result.get("first_divergent")
    ep_note = result.get("ep_note") or ""
    return base | {
        "available": True,
        "validated": True,
        "passed": result.get("passed") is True,
        "verdict": "passed" if result.get("passed") is True else "failed",
        "reason": reason,
        "label": MEASURED_FULL if twin.get("weights_source") == "real" else MEASURED_TWIN,
        "split": {
            "tp": result.get("tp"),
            "ep": result.get("ep"),
            "processes": result.get("world_size"),
            "backend": result.get("backend"),
            "device_type": result.get("device_type"),
        },
        "degree_reason": result.get("degree_reason") or "",
        "max_abs_error": result.get("max_abs_error"),
        "tolerance": tolerance.get("max_abs_error"),
        "top1_agreement": result.get("top1_agreement"),
        "first_divergent": (
            {key: divergent.get(key) for key in ("module", "layer", "kind")}
            if isinstance(divergent, Mapping)
            else None
        ),
        "failed_rank": result.get("failed_rank"),
        "failed_rank_exit_code": next(
            (
                entry.get("exit_code")
                for entry in result.get("rank_logs") or []
                if isinstance(entry, Mapping) and entry.get("rank") == result.get("failed_rank")
            ),
            None,
        ),
        "step_time_s": result.get("step_time_s"),
        "step_time_tp1_s": result.get("step_time_tp1_s"),
        "tokens_per_s": result.get("tokens_per_s"),
        "tokens_per_s_tp1": result.get("tokens_per_s_tp1"),
        "comm_fraction": result.get("comm_fraction"),
        "scaling_efficiency": result.get("scaling_efficiency"),
        "ep_note": ep_note,
        "ep_reason": _ep_reason(str(ep_note)),
    }


def _ep_reason(note: str) -> str:
    """Why expert parallelism was not validated: the stage's `ep_note` without its lead
    (`EP_NOT_VALIDATED`), so that a sentence can say it after its own ("" without a note)."""
    if note.lower().startswith(EP_NOT_VALIDATED):
        return note[len(EP_NOT_VALIDATED) :]
    return note
