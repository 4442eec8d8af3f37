"""The plan's section of the release notes ("configuration"): the recommended pool, the
plan's TP/PP/EP/DP split, serving dtype, context, concurrency (sized for, and the largest
batch that fits), memory per device, and the plan's vLLM and SGLang launch commands as the
plan wrote them; a plan that fits nothing says why and what would fit
(`templates/release_notes/sections/plan.md`).

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from typing import Any

from engine.notes import NotesContext, StageState
from engine.stages.plan.result import PlanResult

KEY = "configuration"
PLACE = 10


def section(state: StageState, notes: NotesContext) -> dict[str, Any]:
    """The serving configuration from the plan's result: "available" True with the split,
    devices, nodes, dtype, context and concurrency, memory per device (bytes by part) and
    launch commands; or "available" False with the plan's status, reason ("" when neither
    the plan nor its run gave one) and suggestions (a failed plan keeps them on its run)."""
    pool = notes.pool
    plan = PlanResult.from_stored(state.result)
    base = {
        "pool": getattr(pool, "name", ""),
        "accelerator": plan.accelerator or getattr(pool, "accelerator", "") or None,
        "accelerator_name": plan.accelerator_name or None,
    }
    if not state.succeeded or not plan.planned:
        return base | {
            "available": False,
            "fits": plan.fits,
            "status": state.status,
            "reason": plan.reason or state.reason,
            "suggestions": plan.suggestions.to_dict(),
            "context_tokens": plan.context_tokens,
            "concurrency": plan.concurrency,
            "dtype": (plan.inputs.dtype or None) if plan.inputs else None,
        }
    return base | {
        "available": True,
        "fits": True,
        "devices": plan.devices,
        "nodes": plan.nodes,
        "pool_layout": plan.pool.to_dict() if plan.pool else None,
        "split": plan.split.to_dict(),
        "dtype": plan.dtype or None,
        "dtype_label": plan.dtype_shown or None,
        "context_tokens": plan.context_tokens,
        "concurrency": plan.concurrency,
        "max_concurrency": plan.max_concurrency,
        "memory_per_device_bytes": dict(plan.memory_per_device_bytes),
        "launch": plan.artifacts.launch(),
        "launch_notes": list(plan.artifacts.notes),
        "validity_flags": list(plan.validity_flags),
        "notes": list(plan.notes),
    }
