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

KEY = "configuration"
PLACE = 10


def section(state: StageState, notes: NotesContext) -> dict[str, Any]:
    """The serving configuration from the plan's result: "available" True with the split,
    devices, nodes, dtype, context and concurrency, memory per device (bytes by part) and
    launch commands; or "available" False with the plan's status, reason ("" when neither
    the plan nor its run gave one) and suggestions (a failed plan keeps them on its run)."""
    pool = notes.pool
    result = state.result or {}
    base = {
        "pool": getattr(pool, "name", ""),
        "accelerator": result.get("accelerator") or getattr(pool, "accelerator", "") or None,
        "accelerator_name": result.get("accelerator_name"),
    }
    inputs = result.get("inputs") or {}
    if not state.succeeded or result.get("fits") is not True:
        return base | {
            "available": False,
            "fits": result.get("fits"),
            "status": state.status,
            "reason": result.get("reason") or state.reason,
            "suggestions": dict(result.get("suggestions") or {}),
            "context_tokens": inputs.get("context_tokens"),
            "concurrency": inputs.get("concurrency"),
            "dtype": inputs.get("dtype"),
        }
    predicted = result.get("predicted") or {}
    artifacts = result.get("artifacts") or {}
    return base | {
        "available": True,
        "fits": True,
        "devices": result.get("devices"),
        "nodes": result.get("nodes"),
        "pool_layout": result.get("pool"),
        "split": {key: result.get(key) for key in ("tp", "pp", "ep", "dp")},
        "dtype": result.get("dtype"),
        "dtype_label": result.get("dtype_label") or result.get("dtype"),
        "context_tokens": inputs.get("context_tokens"),
        "concurrency": inputs.get("concurrency"),
        "max_concurrency": predicted.get("largest_batch_sequences")
        or result.get("max_sequences_at_context"),
        "memory_per_device_bytes": dict(result.get("memory_per_device_bytes") or {}),
        "launch": {
            engine: artifacts[engine]
            for engine in ("vllm", "sglang")
            if isinstance(artifacts.get(engine), str)
        },
        "launch_notes": [str(n) for n in artifacts.get("notes") or []],
        "validity_flags": [str(f) for f in result.get("validity_flags") or []],
        "notes": [str(n) for n in result.get("notes") or []],
    }
