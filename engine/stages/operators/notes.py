"""The operator coverage's section of the release notes: how many of the twin's operators
the pool covers, misses or serves through a fallback, and each missing one with the dtypes
it misses and the model feature that needs it
(`templates/release_notes/sections/operators.md`).

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.notes import NotesContext, StageState

PLACE = 50


def ran_twin(state: StageState) -> bool:
    """Whether the stage traced the twin: it kept a result."""
    return state.result is not None


def section(state: StageState, notes: NotesContext) -> dict[str, Any]:
    """{"available", "counts" ({"covered", "missing", "fallback"}), "checked_against",
    "device", "dtype", "missing": [{"name", "feature", "missing_dtypes"}]}; "available"
    False (with status and reason) unless the stage succeeded."""
    result = state.result or {}
    if not state.succeeded or not isinstance(result.get("counts"), Mapping):
        return {"available": False, "status": state.status, "reason": state.reason}
    missing = [
        {
            "name": op.get("name"),
            "feature": op.get("feature") or "",
            "missing_dtypes": list(op.get("missing_dtypes") or []),
        }
        for op in result.get("operators") or []
        if isinstance(op, Mapping) and op.get("status") == "missing"
    ]
    return {
        "available": True,
        "counts": dict(result["counts"]),
        "checked_against": result.get("checked_against"),
        "device": result.get("device"),
        "dtype": result.get("dtype"),
        "missing": missing,
    }
