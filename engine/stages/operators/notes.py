"""The operator coverage's section of the release notes: how many of the twin's operators
the pool covers, misses or serves through a fallback, and each missing one with the dtypes
it misses and the model feature that needs it
(`templates/release_notes/sections/operators.md`), read through `OperatorsResult`.

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from typing import Any

from engine.notes import NotesContext, StageState
from engine.stages.operators.result import OperatorsResult

PLACE = 50


def ran_twin(state: StageState) -> bool:
    """Whether the stage traced the twin: it kept a result."""
    return state.result is not None


def section(state: StageState, notes: NotesContext) -> dict[str, Any]:
    """{"available", "counts" ({"covered", "missing", "fallback"}), "checked_against",
    "device", "dtype", "missing": [{"name", "feature", "missing_dtypes"}]}; "available"
    False (with status and reason) unless the stage succeeded with its counts."""
    result = OperatorsResult.from_stored(state.result)
    if not state.succeeded or result.counts is None:
        return {"available": False, "status": state.status, "reason": state.reason}
    return {
        "available": True,
        "counts": result.counts.to_dict(),
        "checked_against": result.checked_against or None,
        "device": result.device or None,
        "dtype": result.dtype or None,
        "missing": [
            {"name": op.name, "feature": op.feature, "missing_dtypes": list(op.missing_dtypes)}
            for op in result.missing_operators
        ],
    }
