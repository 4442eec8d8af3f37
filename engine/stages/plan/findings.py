"""The plan stage's known limitations: nothing fits the pool (with what would), or the
plan's context is capped below the model's maximum (how many full-context sequences memory
holds). Registered as the stage's `findings` in `engine.registry`, which passes the
release's analysis (`findings_read_analysis`); their words are `templates/limitations/plan/`.
What they say of the plan and the analysis they ask their typed results (`PlanResult`,
`AnalysisResult`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.findings import BLOCKER, INFO, MAJOR, MINOR, Finding
from engine.stages.analyze.result import AnalysisResult
from engine.stages.plan.result import PlanResult


def _plan_no_fit(plan: PlanResult, pool: str) -> Finding:
    suggestions = plan.suggestions
    return Finding(
        key="plan:no-fit",
        template="plan/no-fit",
        data={
            "pool": pool,
            "kind": plan.accelerator or "?",
            "accelerator_name": plan.accelerator_name,
            "accelerator_memory_bytes": plan.accelerator_memory_bytes,
            "have": plan.pool.devices if plan.pool is not None else None,
            "context_tokens": plan.context_tokens,
            "concurrency": plan.concurrency,
            "dtype": plan.inputs.dtype if plan.inputs is not None else "",
            "reason": plan.reason,
            # What would fit, as the planner suggests it (each None when it suggests none).
            "fit_devices": suggestions.devices or None,
            "fit_context_tokens": suggestions.context_tokens or None,
            "fit_dtype": suggestions.dtype or None,
        },
        severity=BLOCKER,
    )


def kv_bytes_per_sequence(analysis: Mapping[str, Any], tokens: int) -> float | None:
    """KV-cache bytes of one sequence of `tokens` tokens over the whole model, from a stored
    analysis (`AnalysisResult.kv_bytes_at_context`: a sliding layer keeps at most its window,
    a chunked one its chunk). None when the analysis lacks the figures."""
    return AnalysisResult.from_stored(analysis).kv_bytes_at_context(tokens)


def _plan_context_capped(plan: PlanResult, analysis: AnalysisResult, pool: str) -> Finding | None:
    planned = plan.context_tokens
    concurrency = plan.concurrency or 1
    max_context = analysis.max_position_embeddings
    per_sequence = plan.kv_bytes_per_sequence_per_device
    if planned is None or not isinstance(max_context, int) or planned >= max_context:
        return None
    at_planned = analysis.kv_bytes_at_context(planned)
    at_max = analysis.kv_bytes_at_context(max_context)
    room = plan.kv_room_bytes()
    if not at_planned or at_max is None or per_sequence is None or room is None:
        return None
    # The device's share of one sequence's KV scales with the whole model's.
    share = per_sequence / at_planned
    memory = plan.memory_per_device_bytes  # budget, weights and activations: room is not None
    dp = plan.split.dp or 1
    full_per_device = at_max * share
    sequences = int(room // full_per_device) * dp if full_per_device > 0 and room > 0 else 0
    low, high = planned, max_context  # the longest context one sequence can hold
    if (analysis.kv_bytes_at_context(low) or 0) * share > room:
        low = 0
    while low < high:
        mid = (low + high + 1) // 2
        if (analysis.kv_bytes_at_context(mid) or 0) * share <= room:
            low = mid
        else:
            high = mid - 1
    # How many sequences of the full context memory holds against the planned concurrency:
    # none (major), fewer (minor) or all of them (info).
    if sequences < 1:
        severity, full_context_fits = MAJOR, "none"
    elif sequences < concurrency:
        severity, full_context_fits = MINOR, "fewer"
    else:
        severity, full_context_fits = INFO, "all"
    return Finding(
        key="plan:context-capped",
        template="plan/context-capped",
        data={
            "pool": pool,
            "split": plan.split.to_dict() | {"dp": dp},
            "devices": plan.devices,
            "planned": planned,
            "concurrency": concurrency,
            "max_context": max_context,
            "room_bytes": room,
            "budget_bytes": memory["budget"],
            "weights_bytes": memory["weights"],
            "activations_bytes": memory["activations_workspace"],
            "overhead_bytes": memory.get("runtime_overhead", 0),
            "per_sequence_bytes": per_sequence,
            "full_per_device_bytes": full_per_device,
            "sequences": sequences,
            "sequences_per_replica": sequences // dp,
            "longest": low,
            "full_context_fits": full_context_fits,
        },
        severity=severity,
    )


def findings(
    result: Mapping[str, Any], *, pool: str, analysis: Mapping[str, Any] | None = None
) -> list[Finding] | None:
    """A blocker when nothing fits the pool (with what would fit), or for a plan that fits, a
    note when its context is below the model's max context (major when not even one full
    sequence fits, minor when fewer than the planned concurrency do, info otherwise; needs
    the release's `analysis`). None for a result that is not a plan."""
    plan = PlanResult.from_stored(result)
    if plan.does_not_fit:
        return [_plan_no_fit(plan, pool)]
    if not plan.planned:
        return None
    if not analysis:
        return []
    capped = _plan_context_capped(plan, AnalysisResult.from_stored(analysis), pool)
    return [capped] if capped else []
