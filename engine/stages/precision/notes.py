"""The precision stage's section of the release notes: per dtype passed or failed, top-1
agreement, max abs error, cosine and KL, measured on the twin against the float32 reference
(`templates/release_notes/sections/precision.md`). A failed run's kept metrics are shown too.

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from typing import Any

from engine.markdown import first_line
from engine.notes import NotesContext, StageState

from .result import PrecisionStageResult

PLACE = 40


def ran_twin(state: StageState) -> bool:
    """Whether the stage compared the twin: it kept a result (a failed run keeps one)."""
    return state.result is not None


def section(state: StageState, notes: NotesContext) -> dict[str, Any]:
    """{"available", "status", "passed", "dtypes": [per dtype: "dtype", "passed",
    "top1_agreement", "max_abs_error", "cosine_similarity", "kl_divergence" (nats), the
    first divergent layer and module, "reason"], "skipped_dtypes", "reference",
    "target_device"}; "available" False (with status and reason) when the stage compared
    nothing."""
    result = PrecisionStageResult.from_stored(state.result)
    if state.status not in ("succeeded", "failed") or result.dtypes is None:
        return {"available": False, "status": state.status, "reason": state.reason}
    reference = {"device": result.reference_device, "dtype": result.reference_dtype}
    return {
        "available": True,
        "status": state.status,
        "passed": result.every_dtype_passed,
        "dtypes": [
            {
                "dtype": entry.dtype,
                "passed": bool(entry.passed),
                "top1_agreement": entry.top1_agreement,
                "max_abs_error": entry.max_abs_error,
                "cosine_similarity": entry.cosine_similarity,
                "kl_divergence": entry.kl_divergence,
                "first_divergent_layer": entry.first_divergent_layer,
                "first_divergent_module": entry.first_divergent_module or None,
                "reason": first_line(entry.reason, 240),
            }
            for entry in result.compared
        ],
        "skipped_dtypes": result.skipped_dtypes,
        "reference": reference if any(reference.values()) else None,
        "target_device": result.target_device or None,
    }
