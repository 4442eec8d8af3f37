"""The plan stage's known limitations: nothing fits the pool (with what would), or the
plan's context is capped below the model's maximum (how many full-context sequences memory
holds). Registered as the stage's `findings` in `engine.registry`, which passes the
release's analysis (`findings_read_analysis`); their words are `templates/limitations/plan/`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine.findings import BLOCKER, INFO, MAJOR, MINOR, Finding


def _plan_no_fit(result: Mapping[str, Any], pool: str) -> Finding:
    suggestions = result.get("suggestions") or {}
    layout = result.get("pool") or {}
    inputs = result.get("inputs") or {}
    return Finding(
        key="plan:no-fit",
        template="plan/no-fit",
        data={
            "pool": pool,
            "kind": str(result.get("accelerator") or "?"),
            "accelerator_name": str(result.get("accelerator_name") or ""),
            "accelerator_memory_bytes": result.get("accelerator_memory_bytes"),
            "have": layout.get("devices"),
            "context_tokens": inputs.get("context_tokens"),
            "concurrency": inputs.get("concurrency"),
            "dtype": str(inputs.get("dtype") or ""),
            "reason": str(result.get("reason") or ""),
            # What would fit, as the planner suggests it (each None when it suggests none).
            "fit_devices": suggestions.get("devices") or None,
            "fit_context_tokens": suggestions.get("context_tokens") or None,
            "fit_dtype": suggestions.get("dtype") or None,
        },
        severity=BLOCKER,
    )


def kv_bytes_per_sequence(analysis: Mapping[str, Any], tokens: int) -> float | None:
    """KV-cache bytes of one sequence of `tokens` tokens over the whole model, from the
    analysis (`engine.architecture.kv_cache.kv_cache_bytes_at_context`: a sliding
    layer keeps at most its window, a chunked one its chunk). None when the analysis lacks
    the figures."""
    attention = analysis.get("attention") or {}
    per_token = fmt.finite(analysis.get("kv_cache_bytes_per_token"))
    layers = fmt.finite(attention.get("kv_cache_layers"))
    if not per_token or not layers:
        return None
    per_layer = per_token / layers
    window = attention.get("sliding_window") or tokens
    chunk = attention.get("attention_chunk_size") or tokens
    return per_layer * (
        (attention.get("full_layers") or 0) * tokens
        + (attention.get("sliding_layers") or 0) * min(tokens, window)
        + (attention.get("chunked_layers") or 0) * min(tokens, chunk)
    )


def _plan_context_capped(
    result: Mapping[str, Any], analysis: Mapping[str, Any], pool: str
) -> Finding | None:
    inputs = result.get("inputs") or {}
    planned = inputs.get("context_tokens")
    concurrency = inputs.get("concurrency") or 1
    max_context = analysis.get("max_position_embeddings")
    memory = result.get("memory_per_device_bytes") or {}
    per_sequence = fmt.finite(result.get("kv_bytes_per_sequence_per_device"))
    if not isinstance(planned, int) or not isinstance(max_context, int) or planned >= max_context:
        return None
    at_planned = kv_bytes_per_sequence(analysis, planned)
    at_max = kv_bytes_per_sequence(analysis, max_context)
    parts = [memory.get(k) for k in ("budget", "weights", "activations_workspace")]
    if not at_planned or at_max is None or per_sequence is None or None in parts:
        return None
    # The device's share of one sequence's KV scales with the whole model's.
    share = per_sequence / at_planned
    room = (
        memory["budget"]
        - memory["weights"]
        - memory["activations_workspace"]
        - memory.get("runtime_overhead", 0)
    )
    dp = result.get("dp") or 1
    full_per_device = at_max * share
    sequences = int(room // full_per_device) * dp if full_per_device > 0 and room > 0 else 0
    low, high = planned, max_context  # the longest context one sequence can hold
    if (kv_bytes_per_sequence(analysis, low) or 0) * share > room:
        low = 0
    while low < high:
        mid = (low + high + 1) // 2
        if (kv_bytes_per_sequence(analysis, mid) or 0) * share <= room:
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
            "split": {k: result.get(k) for k in ("tp", "pp", "ep")} | {"dp": dp},
            "devices": result.get("devices"),
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
    fits = result.get("fits")
    if fits is False:
        return [_plan_no_fit(result, pool)]
    if fits is not True:
        return None
    capped = _plan_context_capped(result, analysis, pool) if analysis else None
    return [capped] if capped else []
