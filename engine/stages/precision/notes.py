"""The precision stage's section of the release notes: per dtype passed or failed, top-1
agreement, max abs error, cosine and KL, measured on the twin against the float32 reference
(`templates/release_notes/sections/precision.md`). A failed run's kept metrics are shown too.

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.markdown import first_line
from engine.notes import NotesContext, StageState

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
    result = state.result or {}
    dtypes = result.get("dtypes") if isinstance(result.get("dtypes"), Mapping) else None
    if state.status not in ("succeeded", "failed") or dtypes is None:
        return {"available": False, "status": state.status, "reason": state.reason}
    rows = []
    for dtype, entry in dtypes.items():
        if not isinstance(entry, Mapping):
            continue
        rows.append(
            {
                "dtype": dtype,
                "passed": bool(entry.get("passed")),
                "top1_agreement": entry.get("top1_agreement"),
                "max_abs_error": entry.get("max_abs_error"),
                "cosine_similarity": entry.get("cosine_similarity"),
                "kl_divergence": entry.get("kl_divergence"),
                "first_divergent_layer": entry.get("first_divergent_layer"),
                "first_divergent_module": entry.get("first_divergent_module"),
                "reason": first_line(entry.get("reason"), 240),
            }
        )
    return {
        "available": True,
        "status": state.status,
        "passed": bool(rows) and all(r["passed"] for r in rows),
        "dtypes": rows,
        "skipped_dtypes": dict(result.get("skipped_dtypes") or {}),
        "reference": result.get("reference"),
        "target_device": result.get("target_device"),
    }
