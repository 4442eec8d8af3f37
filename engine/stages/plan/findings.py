"""The plan stage's known limitations: nothing fits the pool (with what would), or the
plan's context is capped below the model's maximum (how many full-context sequences memory
holds). Registered as the stage's `findings` in `engine.registry`, which passes the
release's analysis (`findings_read_analysis`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine import markdown as md
from engine.findings import BLOCKER, INFO, MAJOR, MINOR, Finding, cut_title


def _plan_no_fit(result: Mapping[str, Any], pool: str) -> Finding:
    suggestions = result.get("suggestions") or {}
    layout = result.get("pool") or {}
    inputs = result.get("inputs") or {}
    kind = str(result.get("accelerator") or "?")
    have = layout.get("devices")
    devices = suggestions.get("devices")
    if devices:
        title = (
            f"Needs more devices than pool {pool} has: {devices} x {kind} would fit, "
            f"the pool has {have}"
        )
    else:
        title = f"Does not fit pool {pool} ({have} x {kind}) at any size the planner tried"
    fits = []
    if devices:
        fits.append(f"{devices} x {md.code(kind)} (the pool has {have})")
    if suggestions.get("context_tokens"):
        fits.append(
            f"a context of {fmt.count(suggestions['context_tokens'])} tokens on this pool "
            f"(planned: {fmt.count(inputs.get('context_tokens'))})"
        )
    if suggestions.get("dtype"):
        fits.append(
            f"serving in {md.code(suggestions['dtype'])} on this pool "
            f"(planned: {md.code(inputs.get('dtype') or 'checkpoint')})"
        )
    accelerator = md.text(result.get("accelerator_name") or kind)
    lines = [
        f"The plan for pool {md.code(pool)} ({have} x {accelerator}, "
        f"{fmt.gib(result.get('accelerator_memory_bytes'))} each) found no split that fits, at "
        f"context {fmt.count(inputs.get('context_tokens'))} tokens x "
        f"{fmt.count(inputs.get('concurrency'))} sequences, dtype "
        f"{md.code(inputs.get('dtype') or 'checkpoint')}.",
        "",
        f"The planner says: {md.text(result.get('reason') or '')}",
        "",
        "What would fit:",
        "",
    ]
    lines += [f"- {item}" for item in fits] or ["- nothing the planner tried"]
    return Finding(
        key="plan:no-fit", title=cut_title(title), body="\n".join(lines), severity=BLOCKER
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
    split = f"TP{result.get('tp')} PP{result.get('pp')} EP{result.get('ep')} DP{dp}"
    lines = [
        f"The plan for pool {md.code(pool)} ({split} on "
        f"{fmt.counted(result.get('devices'), 'device')}) "
        f"serves a context of {planned:,} tokens x {concurrency} sequences; the model's "
        f"max_position_embeddings is {max_context:,} tokens. Its launch commands cap the "
        f"context at {planned:,}.",
        "",
        f"- KV cache room per device: {fmt.gib(room)} (budget {fmt.gib(memory['budget'])} minus "
        f"weights {fmt.gib(memory['weights'])}, activations "
        f"{fmt.gib(memory['activations_workspace'])} and runtime overhead "
        f"{fmt.gib(memory.get('runtime_overhead', 0))})",
        f"- KV cache of one sequence per device: {fmt.gib(per_sequence)} at {planned:,} tokens, "
        f"{fmt.gib(full_per_device)} at {max_context:,} tokens",
        f"- sequences at the full context ({max_context:,} tokens): {sequences:,}"
        + (f" ({sequences // dp:,} per DP replica)" if dp > 1 else ""),
        f"- longest context one sequence can hold: {low:,} tokens",
    ]
    if sequences < 1:
        severity = MAJOR
        title = (
            f"Context capped by memory on pool {pool}: at most {low:,} of {max_context:,} "
            "tokens per sequence"
        )
        lines += ["", "The full context does not fit even one sequence on this split."]
    elif sequences < concurrency:
        severity = MINOR
        title = (
            f"Context capped at {planned:,} of {max_context:,} tokens on pool {pool}: "
            f"{fmt.counted(sequences, 'sequence')} {'fits' if sequences == 1 else 'fit'} "
            f"at {max_context:,}"
        )
        lines += [
            "",
            f"At the full context ({max_context:,} tokens) memory holds "
            f"{fmt.counted(sequences, 'sequence')}, fewer than the {concurrency} planned (at "
            f"the planned {planned:,} tokens it holds them all).",
        ]
    else:
        severity = INFO
        title = f"Context capped at {planned:,} of {max_context:,} tokens on pool {pool}"
        lines += [
            "",
            f"Memory holds the {concurrency} planned sequences at the full context: raise the "
            "engine's max model length (plan option `context_tokens`) to serve it.",
        ]
    return Finding(
        key="plan:context-capped", title=cut_title(title), body="\n".join(lines), severity=severity
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
