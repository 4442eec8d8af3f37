"""Known limitations: what users of a release must know before deploying it.

Two kinds of `KnownLimitation` rows live side by side:

- notes a stage raised from its findings, with a stable `key` ("operators:missing:aten::foo",
  "precision:float16", "plan:no-fit", "distributed:mismatch", "analyze:mtp", ...).
  `limitations_sync_for_stage` runs after each stage attempt that produced a result: it
  raises or updates the note of every current finding (reopening a resolved one whose problem
  is back) and resolves the stage's open or mitigated notes whose problem is no longer found
  (a note the attempt could not judge, `unjudged_keys`, is left as it is). Their title, body
  and severity come from the stage; people may only change their status (mitigated,
  resolved).
- notes people write (`key` blank, `author` set): never touched by a stage.

`findings_for_stage` is the pure part: from a stage's stored result (the shapes of
`workers/stages/*.py`) to `Finding`s, without torch. A finding's body is Markdown; figures
and names taken from a result are put in code spans or escaped, so a config's strings cannot
inject links or markup (`adaptation.safe_markdown` renders without raw HTML anyway).

Severities: blocker (the release cannot run on the pool as planned: an operator is missing,
nothing fits, its split gives other outputs than one device or a rank crashes), major (it
runs, with a problem that matters: a dtype fails its precision thresholds, the full context
does not fit), minor (a known shortcoming: MTP modules not validated, a multi-device split
or its expert parallelism not validated here, out of memory on the twin before the end of a
sweep), info (worth knowing: the plan's context is capped below the model's).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from adaptation.models import (
    AcceleratorPool,
    KnownLimitation,
    LimitationStatus,
    ModelRelease,
    Severity,
    StageRun,
    StageStatus,
)
from engine import formatting as fmt
from engine.architecture.rope import TRANSFORMERS_ROPE_TYPES
from engine.stages.distributed.degree import EP_NOT_VALIDATED
from engine.stages.precision.checks import CHECKS as PRECISION_CHECKS

logger = logging.getLogger(__name__)

_TITLE_MAX = KnownLimitation._meta.get_field("title").max_length or 200
_KEY_MAX = KnownLimitation._meta.get_field("key").max_length or 200


class LimitationError(ValueError):
    """A change to a note the domain refuses, with a message for the person who made it."""


@dataclass(frozen=True)
class Finding:
    """One problem a stage found: the note it raises or keeps up to date.

    `key` is stable across re-runs ("operators:missing:aten::_grouped_mm"); `body` is
    Markdown with the figures; `all_pools` marks a finding about the release itself (from its
    analysis), stored with pool None, where other findings belong to the job's pool.
    """

    key: str
    title: str
    body: str
    severity: str
    all_pools: bool = False


# --- Markdown helpers --------------------------------------------------------------------------

_MARKDOWN_SPECIALS = re.compile(r"([\\`*_\[\]<>|#&~])")


def md_text(value: Any) -> str:
    """`value` as Markdown text that renders literally: its Markdown punctuation escaped, its
    line breaks folded to spaces (stage reasons and config strings go through this)."""
    text = " ".join(str(value).split())
    return _MARKDOWN_SPECIALS.sub(r"\\\1", text)


def md_code(value: Any) -> str:
    """`value` as a Markdown code span, whatever backticks it holds."""
    text = " ".join(str(value).split())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _title(text: str) -> str:
    """A note title that fits the column (cut with an ellipsis)."""
    text = " ".join(text.split())
    return text if len(text) <= _TITLE_MAX else text[: _TITLE_MAX - 1] + "…"


def _key(text: str) -> str:
    return text[:_KEY_MAX]


# --- operators ---------------------------------------------------------------------------------


def _operator_name(name: str) -> str:
    """The dispatcher's spelling: "aten::mm" for the default overload, "aten::add.Tensor"."""
    return name.removesuffix(".default")


def _missing_operator(row: Mapping[str, Any], result: Mapping[str, Any], pool: str) -> Finding:
    name = _operator_name(str(row.get("name") or "?"))
    feature = str(row.get("feature") or "")
    via = str(row.get("via") or "")
    dtypes = [str(d) for d in row.get("dtypes") or []]
    lacking = [str(d) for d in row.get("missing_dtypes") or []]
    run_device = str(result.get("device") or "")
    devices = [str(d) for d in row.get("devices") or []]
    # Only "kernel lacks <dtype>" (or a manifest listing the operator for other dtypes) is a
    # dtype gap; anything else is an operator the backend does not have at all.
    dtype_gap = bool(lacking) and (
        via.startswith("kernel lacks")
        or (via == "manifest" and bool(dtypes) and not set(dtypes) <= set(lacking))
    )
    host_only = devices == ["cpu"] and run_device not in ("", "cpu")
    severity = Severity.MAJOR if host_only else Severity.BLOCKER
    needed_by = f" ({feature})" if feature else ""
    if dtype_gap:
        title = f"{name} lacks {', '.join(lacking)} on pool {pool}{needed_by}"
    else:
        title = f"{name} is missing on pool {pool}{needed_by}"
    checked = str(result.get("checked_against") or "the pool's backend")
    lines = [
        f"The scaled twin's prefill and decode on pool {md_code(pool)} (device "
        f"{md_code(run_device or '?')}, {md_code(result.get('dtype') or '?')}) called "
        f"{md_code(name)}"
        + (f" for **{md_text(feature)}**" if feature else "")
        + f"; checked against {md_text(checked)}, "
        + (
            f"its kernel lacks {', '.join(md_code(d) for d in lacking)}."
            if dtype_gap
            else "the backend has no kernel for it."
        ),
        "",
        f"- how it was found: {md_text(via or 'missing')}",
        f"- dtypes it ran in: {', '.join(md_code(d) for d in dtypes) or '—'}",
    ]
    if lacking:
        lines.append(f"- dtypes missing: {', '.join(md_code(d) for d in lacking)}")
    lines.append(f"- calls: {fmt.count(row.get('calls'))}")
    lines += [
        "",
        (
            "It saw only CPU tensors, so it runs on the host: a cost, not a stop."
            if host_only
            else "The stage ran it on the CPU to go on checking; serving on this backend "
            "needs a kernel for it (or a model change that avoids it)."
        ),
    ]
    return Finding(
        key=_key(f"operators:missing:{name}"),
        title=_title(title),
        body="\n".join(lines),
        severity=severity,
    )


def operator_findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """One blocker per operator missing on the pool's backend (major when it only ever saw
    CPU tensors on a device pool), and one minor note for the operators that run through the
    backend's fallback. None when the result has no operator list."""
    rows = result.get("operators")
    if not isinstance(rows, list):
        return None
    findings = [
        _missing_operator(row, result, pool)
        for row in rows
        if isinstance(row, Mapping) and row.get("status") == "missing"
    ]
    fallback = [row for row in rows if isinstance(row, Mapping) and row.get("status") == "fallback"]
    if fallback:
        lines = [
            f"{len(fallback)} operator(s) have no kernel of their own on pool {md_code(pool)} "
            "and run through the backend's fallback (usually a copy to the CPU and back): "
            "correct, but slow on the paths that use them.",
            "",
        ]
        lines += [
            f"- {md_code(_operator_name(str(row.get('name'))))}"
            + (f": {md_text(row['feature'])}" if row.get("feature") else "")
            for row in fallback
        ]
        findings.append(
            Finding(
                key="operators:fallback",
                title=_title(f"{len(fallback)} operator(s) run through the fallback on {pool}"),
                body="\n".join(lines),
                severity=Severity.MINOR,
            )
        )
    return findings


# --- precision ---------------------------------------------------------------------------------


def _crossed(entry: Mapping[str, Any]) -> list[tuple[str, float, str, float]]:
    """(label, value, "<" | ">", limit) of each enforced check the entry failed."""
    thresholds = entry.get("thresholds") or {}
    crossed = []
    for metric, key, side, label in PRECISION_CHECKS:
        value, limit = fmt.finite(entry.get(metric)), fmt.finite(thresholds.get(key))
        if value is None or limit is None:
            continue
        if side == "max" and value > limit:
            crossed.append((label, value, ">", limit))
        elif side == "min" and value < limit:
            crossed.append((label, value, "<", limit))
    return crossed


def _precision_failure(dtype: str, entry: Mapping[str, Any], pool: str) -> Finding:
    crossed = _crossed(entry)
    layer = entry.get("first_divergent_layer")
    module = entry.get("first_divergent_module")
    name = entry.get("first_divergent_name")
    nonfinite = entry.get("non_finite_values")
    if nonfinite:
        what = f"NaN/Inf logits ({fmt.count(nonfinite)} values)"
    elif crossed:
        what = ", ".join(label for label, *_ in crossed)
    elif layer is not None:
        what = "a module's local error over its limit"
    else:
        what = "its thresholds"
    where = f"; first divergent layer {layer} ({module})" if layer is not None else ""
    reason = str(entry.get("reason") or what).removeprefix(f"{dtype}: ")
    lines = [
        f"The scaled twin in {md_code(dtype)} on pool {md_code(pool)} against the float32 "
        f"reference on the CPU fails: {md_text(reason)}",
        "",
    ]
    thresholds = entry.get("thresholds") or {}
    rows = [
        (label, entry.get(metric), side, thresholds.get(key))
        for metric, key, side, label in PRECISION_CHECKS
        if fmt.finite(thresholds.get(key)) is not None
    ]
    if rows:
        lines += ["| check | measured | limit | verdict |", "|---|---|---|---|"]
        for label, value, side, limit in rows:
            failed = any(label == c[0] for c in crossed)
            bound = "≤" if side == "max" else "≥"
            lines.append(
                f"| {label} | {fmt.sig(value, 5)} | {bound} {fmt.sig(limit, 5)} | "
                f"{'**failed**' if failed else 'ok'} |"
            )
        lines.append("")
    if layer is not None:
        local = fmt.finite(entry.get("first_divergent_local_error"))
        unit = fmt.finite(entry.get("unit_roundoff"))
        limit = fmt.finite(thresholds.get("max_local_relative_error"))
        size = ""
        if local is not None:
            size = f": local relative error {local:.4g}"
            if unit:
                size += f" ({local / unit:.3g}u)"
            if limit is not None:
                size += f" over the limit {limit:.4g}" + (f" ({limit / unit:.3g}u)" if unit else "")
        lines.append(
            f"First divergent module: layer {layer}, {md_code(module or '?')}"
            + (f" ({md_code(name)})" if name else "")
            + size
            + "."
        )
    lines += [
        "",
        f"Serve in another dtype, or find the module's problem before serving {md_code(dtype)}.",
    ]
    return Finding(
        key=_key(f"precision:{dtype}"),
        title=_title(f"{dtype} fails precision on pool {pool}: {what}{where}"),
        body="\n".join(lines),
        severity=Severity.MAJOR,
    )


def precision_findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """One major note per dtype that failed its thresholds (which metric, which layer), and
    one per dtype the pool declares that its device cannot run. None without per-dtype
    results."""
    dtypes = result.get("dtypes")
    if not isinstance(dtypes, Mapping):
        return None
    findings = [
        _precision_failure(str(dtype), entry, pool)
        for dtype, entry in dtypes.items()
        if isinstance(entry, Mapping) and entry.get("passed") is False
    ]
    for dtype, why in (result.get("skipped_dtypes") or {}).items():
        findings.append(
            Finding(
                key=_key(f"precision:unsupported:{dtype}"),
                title=_title(f"{dtype} does not run on pool {pool}'s device"),
                body=(
                    f"Pool {md_code(pool)} declares {md_code(dtype)} as a serving dtype, but its "
                    f"device cannot run it, so it was not validated: {md_text(why)}"
                ),
                severity=Severity.MAJOR,
            )
        )
    return findings


# --- plan --------------------------------------------------------------------------------------


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
        fits.append(f"{devices} x {md_code(kind)} (the pool has {have})")
    if suggestions.get("context_tokens"):
        fits.append(
            f"a context of {fmt.count(suggestions['context_tokens'])} tokens on this pool "
            f"(planned: {fmt.count(inputs.get('context_tokens'))})"
        )
    if suggestions.get("dtype"):
        fits.append(
            f"serving in {md_code(suggestions['dtype'])} on this pool "
            f"(planned: {md_code(inputs.get('dtype') or 'checkpoint')})"
        )
    accelerator = md_text(result.get("accelerator_name") or kind)
    lines = [
        f"The plan for pool {md_code(pool)} ({have} x {accelerator}, "
        f"{fmt.gib(result.get('accelerator_memory_bytes'))} each) found no split that fits, at "
        f"context {fmt.count(inputs.get('context_tokens'))} tokens x "
        f"{fmt.count(inputs.get('concurrency'))} sequences, dtype "
        f"{md_code(inputs.get('dtype') or 'checkpoint')}.",
        "",
        f"The planner says: {md_text(result.get('reason') or '')}",
        "",
        "What would fit:",
        "",
    ]
    lines += [f"- {item}" for item in fits] or ["- nothing the planner tried"]
    return Finding(
        key="plan:no-fit", title=_title(title), body="\n".join(lines), severity=Severity.BLOCKER
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
        f"The plan for pool {md_code(pool)} ({split} on {result.get('devices')} device(s)) "
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
        f"- sequences at the full context: {sequences:,}"
        + (f" ({sequences // dp:,} per DP replica)" if dp > 1 else ""),
        f"- longest context one sequence can hold: {low:,} tokens",
    ]
    if sequences < 1:
        severity = Severity.MAJOR
        title = (
            f"Context capped by memory on pool {pool}: at most {low:,} of {max_context:,} "
            "tokens per sequence"
        )
        lines += ["", "The full context does not fit even one sequence on this split."]
    elif sequences < concurrency:
        severity = Severity.MINOR
        title = (
            f"Context capped at {planned:,} of {max_context:,} tokens on pool {pool}: "
            f"{sequences} sequence(s) fit at the full context"
        )
        lines += [
            "",
            f"At the full context memory holds {sequences} sequence(s), fewer than the "
            f"{concurrency} planned.",
        ]
    else:
        severity = Severity.INFO
        title = f"Context capped at {planned:,} of {max_context:,} tokens on pool {pool}"
        lines += [
            "",
            f"Memory holds the {concurrency} planned sequences at the full context: raise the "
            "engine's max model length (plan option `context_tokens`) to serve it.",
        ]
    return Finding(
        key="plan:context-capped", title=_title(title), body="\n".join(lines), severity=severity
    )


def plan_findings(
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


# --- analyze -----------------------------------------------------------------------------------


def analysis_findings(result: Mapping[str, Any]) -> list[Finding] | None:
    """Features of the release that serving or validation does not cover, from its analysis
    (notes for every pool): MTP modules (speculative decoding), a RoPE type transformers
    does not implement, modeling code shipped with the release for a family day0 does not
    know. None for a result that is not an analysis."""
    if "mtp_layers" not in result and "rope" not in result:
        return None
    findings = []
    mtp = result.get("mtp_layers") or 0
    if isinstance(mtp, int) and mtp > 0:
        findings.append(
            Finding(
                key="analyze:mtp",
                title=_title(
                    f"{mtp} MTP module(s) for speculative decoding are not validated or planned"
                ),
                body=(
                    f"The checkpoint holds {mtp} multi-token-prediction (MTP) module(s) "
                    f"({fmt.count(result.get('extra_params'))} params in `extra_params`), which "
                    "serving engines can use as a draft model for speculative decoding. "
                    "transformers' causal-LM class does not build them, so the scaled twin "
                    "runs without them, and the plan does not load them: speculative decoding "
                    "with MTP is neither validated nor sized here. Their bytes are counted in "
                    "the checkpoint's `weight_bytes` (the whole checkpoint, MTP included: "
                    f"{fmt.gib(result.get('weight_bytes'))})."
                ),
                severity=Severity.MINOR,
                all_pools=True,
            )
        )
    rope = result.get("rope") or {}
    rope_type = rope.get("type") if isinstance(rope, Mapping) else None
    if rope_type and rope_type not in TRANSFORMERS_ROPE_TYPES:
        findings.append(
            Finding(
                key="analyze:rope-type",
                title=_title(f"RoPE type {rope_type!s} is not one transformers implements"),
                body=(
                    f"The config's RoPE scaling type is {md_code(rope_type)}; transformers "
                    f"implements {', '.join(md_code(t) for t in sorted(TRANSFORMERS_ROPE_TYPES))}. "
                    "Only the release's own modeling code can run it: the scaled twin cannot "
                    "be built from transformers' class, and serving engines need support "
                    "for this type before they can serve the release."
                ),
                severity=Severity.MAJOR,
                all_pools=True,
            )
        )
    keys = result.get("config_keys") or []
    if "auto_map" in keys and result.get("family_known") is False:
        architecture = result.get("architecture") or result.get("model_type") or "?"
        findings.append(
            Finding(
                key="analyze:remote-code",
                title=_title(f"{architecture} needs the release's own modeling code"),
                body=(
                    f"day0 does not know the family of {md_code(architecture)} and the config "
                    "names modeling code shipped with the release (`auto_map`). Where "
                    "transformers lacks the architecture, it runs only with "
                    "`trust_remote_code`: on a pool whose `trust_remote_code_orgs` lists the "
                    "release's org (day0 runs it in a sandboxed process), and with the same "
                    "trust in the serving engine."
                ),
                severity=Severity.MAJOR,
                all_pools=True,
            )
        )
    return findings


# --- performance and stability -----------------------------------------------------------------


def performance_findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """Per dtype, out of memory before the end of the sweep (minor; major when no point of
    the dtype was measured) and the twin raising mid-sweep (major). None without a sweep."""
    if not isinstance(result.get("stopped"), list) and not isinstance(result.get("errors"), list):
        return None
    points = [p for p in result.get("points") or [] if isinstance(p, Mapping)]
    measured = [p for p in points if p.get("kind") == "measured"]
    largest_batch = (result.get("options") or {}).get("max_batch_size")
    by_dtype: dict[str, list[Mapping[str, Any]]] = {}
    for stop in result.get("stopped") or []:
        if isinstance(stop, Mapping):
            by_dtype.setdefault(str(stop.get("dtype")), []).append(stop)
    findings = []
    for dtype, stops in by_dtype.items():
        ran = [p for p in measured if p.get("dtype") == dtype]
        first = min(int(s.get("batch_size") or 0) for s in stops)
        lines = [
            f"The performance sweep of the scaled twin in {md_code(dtype)} on pool "
            f"{md_code(pool)} ran out of memory before the end of the sweep"
            + (f" (batch {largest_batch})" if largest_batch else "")
            + ":",
            "",
        ]
        lines += [
            f"- prompt {s.get('prompt_len')}: {md_text(s.get('reason') or '')}" for s in stops
        ]
        best = max((int(p.get("batch_size") or 0) for p in ran), default=0)
        lines += [
            "",
            f"Largest batch measured in {md_code(dtype)}: {best}."
            if ran
            else f"No point was measured in {md_code(dtype)}.",
            "These are the twin's figures on the pool's device, not the full model's.",
        ]
        findings.append(
            Finding(
                key=_key(f"performance:oom:{dtype}"),
                title=_title(
                    f"Out of memory at batch {first} in {dtype} on pool {pool} (performance sweep)"
                ),
                body="\n".join(lines),
                severity=Severity.MINOR if ran else Severity.MAJOR,
            )
        )
    errors: dict[str, list[Mapping[str, Any]]] = {}
    for error in result.get("errors") or []:
        if isinstance(error, Mapping):
            errors.setdefault(str(error.get("dtype")), []).append(error)
    for dtype, items in errors.items():
        first = items[0]
        findings.append(
            Finding(
                key=_key(f"performance:error:{dtype}"),
                title=_title(
                    f"The twin fails mid-sweep in {dtype} on pool {pool} at batch "
                    f"{first.get('batch_size')}"
                ),
                body=(
                    f"At prompt {first.get('prompt_len')}, batch {first.get('batch_size')} the "
                    f"scaled twin in {md_code(dtype)} on pool {md_code(pool)} raised: "
                    f"{md_text(first.get('error') or '')}"
                ),
                severity=Severity.MAJOR,
            )
        )
    return findings


def stability_findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """One note per crossed stability threshold, read from the run's figures against its
    thresholds: memory leak, NaN/Inf outputs, exceptions (major), step-time drift (minor).
    None for a result that is not a stability run."""
    if "passed" not in result or "thresholds" not in result:
        return None
    thresholds = result.get("thresholds") or {}
    workload = result.get("workload") or {}
    dtype = workload.get("dtype") or "?"
    run = (
        f"The scaled twin served back to back in {md_code(dtype)} on pool {md_code(pool)} for "
        f"{fmt.sig(result.get('duration_s'), 5)} s ({fmt.count(result.get('steps'))} steps)"
    )
    reasons = [str(r) for r in result.get("reasons") or []]

    def said(prefix: str) -> str:
        found = next((r for r in reasons if r.startswith(prefix)), "")
        return f"\n\nThe stage says: {md_text(found)}" if found else ""

    findings = []
    slope = fmt.finite(result.get("memory_slope_bytes_per_step"))
    growth = fmt.finite(result.get("memory_growth_bytes"))
    leak_slope = fmt.finite(thresholds.get("leak_bytes_per_step"))
    leak_growth = fmt.finite(thresholds.get("leak_min_growth_bytes"))
    if (
        slope is not None
        and growth is not None
        and leak_slope is not None
        and leak_growth is not None
        and slope > leak_slope
        and growth > leak_growth
    ):
        findings.append(
            Finding(
                key="stability:memory-leak",
                title=_title(f"Memory leak on pool {pool}: {slope:,.0f} bytes per step"),
                body=(
                    f"{run}: memory grew {slope:,.0f} bytes/step ({growth:,.0f} bytes fitted "
                    f"after the warm-up), over the limits of {leak_slope:,.0f} bytes/step and "
                    f"{leak_growth:,.0f} bytes of growth." + said("memory leak")
                ),
                severity=Severity.MAJOR,
            )
        )
    nonfinite = int(fmt.finite(result.get("nonfinite_outputs")) or 0)
    if nonfinite > (fmt.finite(thresholds.get("max_nonfinite_outputs")) or 0):
        findings.append(
            Finding(
                key="stability:nonfinite",
                title=_title(f"NaN/Inf outputs in {dtype} on pool {pool} under sustained load"),
                body=(
                    f"{run}: {nonfinite:,} next-token logit rows held NaN or Inf (threshold "
                    f"{thresholds.get('max_nonfinite_outputs') or 0})." + said("NaN/Inf")
                ),
                severity=Severity.MAJOR,
            )
        )
    errors = int(fmt.finite(result.get("errors")) or 0)
    if errors:
        first = (result.get("error_messages") or [""])[0]
        findings.append(
            Finding(
                key="stability:exceptions",
                title=_title(f"{errors} step(s) raised under sustained load on pool {pool}"),
                body=f"{run}: {errors} step(s) raised; the first: {md_text(first)}",
                severity=Severity.MAJOR,
            )
        )
    drift = fmt.finite(result.get("step_time_drift"))
    max_drift = fmt.finite(thresholds.get("max_step_time_drift"))
    if drift is not None and max_drift is not None and drift > max_drift:
        findings.append(
            Finding(
                key="stability:step-time-drift",
                title=_title(f"Step time drifts {drift:+.0%} under sustained load on {pool}"),
                body=(
                    f"{run}: the median step of the last quarter is {drift:+.0%} on the first "
                    f"quarter's, over the threshold of {max_drift:+.0%}." + said("step-time drift")
                ),
                severity=Severity.MINOR,
            )
        )
    return findings


# --- distributed -------------------------------------------------------------------------------

DISTRIBUTED_NOT_VALIDATED = "distributed:not-validated"
DISTRIBUTED_MISMATCH = "distributed:mismatch"
DISTRIBUTED_RANK_FAILED = "distributed:rank-failed"
DISTRIBUTED_EP_NOT_VALIDATED = "distributed:ep-not-validated"
# Lines of a failed run's reason quoted in its note, and the longest line kept.
_REASON_LINES = 8
_REASON_LINE_CHARS = 300


def _gist(reason: Any) -> str:
    """The first clause of a stage's reason, for a title: its first line up to ": " or "; "."""
    line = next((ln.strip() for ln in str(reason or "").splitlines() if ln.strip()), "")
    return re.split(r"[:;]\s", line, maxsplit=1)[0].rstrip(".")


def _sentence(value: Any) -> str:
    """`value` as Markdown text ending with one full stop."""
    return md_text(value).rstrip(".") + "."


def _md_block(lines: Sequence[str]) -> str:
    """`lines` as a fenced code block, the fence longer than any backtick run inside."""
    body = "\n".join(lines)
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{body}\n{fence}"


def _validated_split(result: Mapping[str, Any]) -> str:
    """The split the stage ran, as its reasons write it: "TP=2", "TP=2 EP=2"."""
    ep = result.get("ep")
    more = f" EP={ep}" if isinstance(ep, int) and not isinstance(ep, bool) and ep > 1 else ""
    return f"TP={result.get('tp')}{more}"


def _planned_split(result: Mapping[str, Any]) -> str:
    """The plan's split the stage was asked to validate, as the plan notes write it."""
    plan = result.get("plan")
    if not isinstance(plan, Mapping) or not plan.get("tp"):
        return "?"
    return " ".join(f"{key.upper()}{plan.get(key)}" for key in ("tp", "pp", "ep", "dp"))


def _where(result: Mapping[str, Any], pool: str) -> str:
    """Where the ranks ran: "2 `gloo` processes on pool `cpu` (device `cpu`)"."""
    return (
        f"{fmt.count(result.get('world_size'))} {md_code(result.get('backend') or '?')} "
        f"processes on pool {md_code(pool)} (device {md_code(result.get('device_type') or '?')})"
    )


def _degree_line(result: Mapping[str, Any]) -> str:
    planned = _planned_split(result)
    line = f"- validated: {_validated_split(result)}"
    if planned != "?":
        line = f"- the plan's split: {planned}; validated: {_validated_split(result)}"
    if result.get("degree_reason"):
        line += f" ({md_text(result['degree_reason'])})"
    return line


def _distributed_not_validated(result: Mapping[str, Any], pool: str) -> Finding:
    reason = str(result.get("reason") or "no reason given")
    devices = result.get("pool_devices")
    host = [f"device {md_code(result.get('device_type') or '?')}"]
    if result.get("backend"):
        host.append(f"backend {md_code(result['backend'])}")
    if fmt.finite(devices) is not None:
        host.append(f"{fmt.count(devices)} device(s) on the worker")
    lines = [
        f"The `distributed` stage validated no part of the plan's split "
        f"({_planned_split(result)}) across processes on pool {md_code(pool)} "
        f"({', '.join(host)}): {_sentence(reason)}",
        "",
    ]
    degree = str(result.get("degree_reason") or "")
    if degree and degree != reason:
        lines += [f"The split it would have run: {_sentence(degree)}", ""]
    lines += [
        "Not validated here: sharding the model by the split (transformers' tensor-parallel "
        "plan), its collectives, and its outputs against the single-device float32 reference. "
        "The plan's communication and scaling figures for this split are predicted only.",
    ]
    return Finding(
        key=DISTRIBUTED_NOT_VALIDATED,
        title=_title(f"Multi-device split not validated on pool {pool}: {_gist(reason)}"),
        body="\n".join(lines),
        severity=Severity.MINOR,
    )


def _distributed_mismatch(result: Mapping[str, Any], pool: str) -> Finding:
    split = _validated_split(result)
    ranks = [row for row in result.get("ranks") or [] if isinstance(row, Mapping)]
    failing = [row for row in ranks if row.get("passed") is False]
    first: Mapping[str, Any] = failing[0] if failing else {}
    tolerance = result.get("tolerance") if isinstance(result.get("tolerance"), Mapping) else {}
    error = first.get("max_abs_error", result.get("max_abs_error"))
    limit = first.get("tolerance", tolerance.get("max_abs_error"))
    divergent = first.get("first_divergent") or result.get("first_divergent") or {}
    title = [f"{split} on pool {pool} does not match the single-device reference"]
    title.append(f"rank {first['rank']}" if "rank" in first else "")
    if first.get("error"):
        title.append(_gist(first["error"]))
    if fmt.finite(error) is not None:
        title.append(f"max |logit error| {fmt.sig(error)} > {fmt.scientific(limit)}")
    if divergent.get("module"):
        title.append(f"first divergent module {divergent['module']}")
    lines = [
        f"The `distributed` stage ran the scaled twin split {split} across "
        f"{_where(result, pool)} through transformers' tensor-parallel plan, and compared every "
        "rank's logits and hidden states with the single-process float32 reference (the same "
        f"twin): {len(failing)} of {len(ranks)} rank(s) are off.",
        "",
        "| rank | max \\|logit error\\| | tolerance | top-1 agreement | first divergent module "
        "| verdict |",
        "|---|---|---|---|---|---|",
    ]
    for row in ranks:
        div = row.get("first_divergent") or {}
        lines.append(
            f"| {row.get('rank')} | {fmt.sig(row.get('max_abs_error'))} | "
            f"{fmt.scientific(row.get('tolerance'))} | {fmt.percent(row.get('top1_agreement'))} | "
            + (f"{md_code(div['module'])} (layer {div.get('layer')})" if div.get("module") else "—")
            + f" | {'ok' if row.get('passed') else '**failed**'} |"
        )
    lines.append("")
    if first.get("error"):
        lines += [f"Rank {first.get('rank')}: {_sentence(first['error'])}", ""]
    if divergent.get("module"):
        size = (
            f"max abs error {fmt.sig(divergent['max_abs_error'])} over its tolerance "
            f"{fmt.scientific(divergent.get('tolerance'))}"
            if fmt.finite(divergent.get("max_abs_error")) is not None
            else f"shape {md_code(divergent.get('shape'))}"
        )
        kind = f", {md_text(divergent['kind'])}" if divergent.get("kind") else ""
        lines += [
            f"First divergent module: {md_code(divergent['module'])} (layer "
            f"{divergent.get('layer')}{kind}): {size}.",
            "",
        ]
    if tolerance.get("rule"):
        lines += [f"Tolerance: {_sentence(tolerance['rule'])}", ""]
    lines += [_degree_line(result), ""]
    lines.append(
        "Split this way the model's outputs differ from the unsplit model's: served as planned "
        "it would produce wrong tokens. Check how the first divergent module is sharded (its "
        "entry in the class's tensor-parallel plan) before serving with tensor parallelism."
    )
    return Finding(
        key=DISTRIBUTED_MISMATCH,
        title=_title(": ".join([title[0], ", ".join(t for t in title[1:] if t)])),
        body="\n".join(lines),
        severity=Severity.BLOCKER,
    )


def _distributed_rank_failed(result: Mapping[str, Any], pool: str) -> Finding:
    split = _validated_split(result)
    reason = str(result.get("reason") or "")
    logs = [entry for entry in result.get("rank_logs") or [] if isinstance(entry, Mapping)]
    failed_rank = result.get("failed_rank")
    failed = next((entry for entry in logs if entry.get("rank") == failed_rank), None)
    hung = re.search(r"did not finish within ([0-9.,]+ s)", reason)
    # The reason's first line is "<headline>: <the culprit rank and how it ended>".
    culprit = next(iter(reason.splitlines()), "").partition(": ")[2]
    stopped = "stopped after" in culprit  # a rank that fell behind: its peers timed out
    if culprit:
        what = culprit
    elif hung:
        what = f"the ranks did not finish within {hung.group(1)} and were killed"
    elif failed_rank is not None:
        what = f"rank {failed_rank} {fmt.exit_status((failed or {}).get('exit_code'))}"
    else:
        what = _gist(reason) or "it failed"
    title = f"{split} run {'hung' if hung or stopped else 'failed'} on pool {pool}: {what}"
    quoted = [
        line if len(line) <= _REASON_LINE_CHARS else line[: _REASON_LINE_CHARS - 1] + "…"
        for line in (ln.rstrip() for ln in reason.splitlines())
        if line.strip()
    ]
    more = len(quoted) - _REASON_LINES
    lines = [
        f"The `distributed` stage ran the scaled twin split {split} across "
        f"{_where(result, pool)}: {what} after {fmt.sig(result.get('elapsed_s'))} s, before "
        "every rank reported, so no rank's outputs were compared with the reference.",
        "",
        "The stage says" + (f" (first {_REASON_LINES} lines):" if more > 0 else ":"),
        "",
        _md_block(quoted[:_REASON_LINES] or ["(no reason)"]),
        "",
    ]
    lines += [
        f"- rank {entry.get('rank')} {fmt.exit_status(entry.get('exit_code'))}" for entry in logs
    ]
    if any(entry.get("exit_code") == -15 for entry in logs):
        lines.append("- (torchrun stops the other ranks with SIGTERM once one fails)")
    lines += [_degree_line(result), ""]
    lines.append(
        "A rank that crashes or hangs at this split takes the whole serving group down: find "
        "the failing rank's cause (its log above) before serving with tensor parallelism."
    )
    return Finding(
        key=DISTRIBUTED_RANK_FAILED,
        title=_title(title),
        body="\n".join(lines),
        severity=Severity.BLOCKER,
    )


def _distributed_ep_not_validated(result: Mapping[str, Any], pool: str) -> Finding:
    note = str(result["ep_note"])
    why = note[len(EP_NOT_VALIDATED) :] if note.lower().startswith(EP_NOT_VALIDATED) else note
    plan = result.get("plan") if isinstance(result.get("plan"), Mapping) else {}
    verdict = {
        True: "it matched the single-device reference",
        False: "it did not pass (see its own note)",
    }.get(result.get("passed"), "")
    planned_ep = fmt.finite(plan.get("ep"))
    asked = (
        f"The plan serves the routed experts with EP{plan.get('ep')} ({_planned_split(result)})"
        if planned_ep is not None and planned_ep > 1
        else "The job's options asked for expert parallelism"
    )
    lines = [
        f"{asked}; the `distributed` stage ran {_validated_split(result)} "
        f"across {_where(result, pool)}"
        + (f", and {verdict}" if verdict else "")
        + f", without expert parallelism (EP=1): {_sentence(why)}",
        "",
        "Not validated here: sharding the experts by expert parallelism (transformers' "
        "expert-parallel plan), the routing of tokens to other ranks' experts, and its "
        "collectives.",
    ]
    return Finding(
        key=DISTRIBUTED_EP_NOT_VALIDATED,
        title=_title(f"Expert parallelism not validated on pool {pool}: {_gist(why)}"),
        body="\n".join(lines),
        severity=Severity.MINOR,
    )


def distributed_findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """The multi-device validation's notes: a minor note when the split could not be
    validated here (why: no tensor-parallel plan in transformers, the release's own modeling
    code, one device, a backend without torch.distributed); a blocker when a rank's outputs
    are off the single-device reference (the split, the rank, its logit error against the
    tolerance, the first divergent module) or when a rank crashed or the ranks hung (the
    rank, its exit status, the first lines of the reason); a minor note when expert
    parallelism was not validated beside the TP split (`ep_note`). None for a result that is
    not a distributed run. A run the job broke on purpose (its `inject` option) raises
    nothing: it proves the check, not a fault of the release."""
    if result.get("inject"):
        return []
    validated = result.get("validated")
    if validated is False:
        return [_distributed_not_validated(result, pool)]
    if validated is not True or result.get("passed") not in (True, False):
        return None
    findings = []
    if result["passed"] is False:
        ranks = [row for row in result.get("ranks") or [] if isinstance(row, Mapping)]
        if ranks:
            findings.append(_distributed_mismatch(result, pool))
        else:
            findings.append(_distributed_rank_failed(result, pool))
    if result.get("ep_note"):
        findings.append(_distributed_ep_not_validated(result, pool))
    return findings


def _distributed_unjudged(result: Mapping[str, Any]) -> frozenset[str]:
    """The distributed notes a run could not judge: a run that validated nothing says nothing
    about a mismatch, a crash or expert parallelism found before; a run whose ranks crashed
    compared no outputs, so it says nothing about a mismatch; a run broken on purpose (its
    `inject` option) says nothing at all."""
    if result.get("inject"):
        return frozenset(
            {
                DISTRIBUTED_NOT_VALIDATED,
                DISTRIBUTED_MISMATCH,
                DISTRIBUTED_RANK_FAILED,
                DISTRIBUTED_EP_NOT_VALIDATED,
            }
        )
    if result.get("validated") is False:
        return frozenset(
            {DISTRIBUTED_MISMATCH, DISTRIBUTED_RANK_FAILED, DISTRIBUTED_EP_NOT_VALIDATED}
        )
    ranks = [row for row in result.get("ranks") or [] if isinstance(row, Mapping)]
    if result.get("validated") is True and result.get("passed") is False and not ranks:
        return frozenset({DISTRIBUTED_MISMATCH})
    return frozenset()


# The stages whose results raise notes (`findings_for_stage`).
STAGES_WITH_FINDINGS = (
    "analyze",
    "operators",
    "precision",
    "plan",
    "distributed",
    "performance",
    "stability",
)


def findings_for_stage(
    stage: str,
    result: Mapping[str, Any] | None,
    *,
    pool: str,
    analysis: Mapping[str, Any] | None = None,
) -> list[Finding] | None:
    """The findings in a stage's stored result on pool `pool` (its name), deduplicated by
    key. `analysis` (the release's `analyze` result) lets the plan say when its context is
    capped. None when the stage raises no notes or the result holds nothing to judge (a
    stage that crashed before checking): its notes must then be left as they are."""
    if not isinstance(result, Mapping):
        return None
    if stage == "operators":
        found = operator_findings(result, pool=pool)
    elif stage == "precision":
        found = precision_findings(result, pool=pool)
    elif stage == "plan":
        found = plan_findings(result, pool=pool, analysis=analysis)
    elif stage == "analyze":
        found = analysis_findings(result)
    elif stage == "performance":
        found = performance_findings(result, pool=pool)
    elif stage == "distributed":
        found = distributed_findings(result, pool=pool)
    elif stage == "stability":
        found = stability_findings(result, pool=pool)
    else:
        return None
    if found is None:
        return None
    unique: dict[str, Finding] = {}
    for finding in found:
        unique.setdefault(finding.key, finding)
    return list(unique.values())


def unjudged_keys(stage: str, result: Mapping[str, Any] | None) -> frozenset[str]:
    """Keys of the stage's notes that `result` neither finds nor rules out (a run that could
    not check them): a sync leaves those notes as they are instead of resolving them."""
    if stage == "distributed" and isinstance(result, Mapping):
        return _distributed_unjudged(result)
    return frozenset()


# --- syncing a stage's notes -------------------------------------------------------------------


@dataclass
class SyncOutcome:
    """What one sync did, by note key."""

    raised: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    reopened: list[str] = field(default_factory=list)
    resolved: list[str] = field(default_factory=list)


def _analysis_of(run: StageRun) -> dict[str, Any] | None:
    """The newest succeeded `analyze` result of the run's job (one query)."""
    result = (
        StageRun.objects.filter(job_id=run.job_id, stage="analyze", status=StageStatus.SUCCEEDED)
        .order_by("-attempt")
        .values_list("result", flat=True)
        .first()
    )
    return result if isinstance(result, dict) else None


def limitations_sync_for_stage(*, stage_run: StageRun) -> SyncOutcome | None:
    """Bring the stage's notes on the release (and the job's pool) in line with what the
    finished attempt `stage_run` found.

    Each current finding's note is created, or updated (title, body, severity, `stage_run`;
    a resolved one is reopened as the problem is back; a mitigated one stays mitigated). The
    stage's open or mitigated notes whose key is no longer found are resolved (`resolved_at`
    now), except those the attempt could not judge (`unjudged_keys`: a distributed run that
    validated nothing leaves an earlier mismatch open). People's notes (blank `key`) are
    never touched. Nothing happens (None) for a run that is not finished or whose result
    holds nothing to judge: a stage that failed before checking resolves nothing.
    """
    if stage_run.stage not in STAGES_WITH_FINDINGS:
        return None
    run = StageRun.objects.select_related("job__release", "job__pool").get(pk=stage_run.pk)
    if run.status not in (StageStatus.SUCCEEDED, StageStatus.FAILED):
        return None
    job = run.job
    analysis = _analysis_of(run) if run.stage == "plan" else None
    findings = findings_for_stage(run.stage, run.result, pool=job.pool.name, analysis=analysis)
    if findings is None:
        return None
    outcome = SyncOutcome()
    now = timezone.now()
    with transaction.atomic():
        # One sync per release at a time: an analysis note (pool None) is not covered by the
        # unique constraint, as NULLs differ.
        list(ModelRelease.objects.select_for_update().filter(pk=job.release_id).values("pk"))
        scope = (
            KnownLimitation.objects.filter(release_id=job.release_id, stage=run.stage)
            .exclude(key="")
            .filter(Q(pool_id=job.pool_id) | Q(pool__isnull=True))
            .order_by("pk")
        )
        existing: dict[tuple[int | None, str], KnownLimitation] = {}
        for note in scope:
            existing.setdefault((note.pool_id, note.key), note)
        seen: set[tuple[int | None, str]] = set()
        for finding in findings:
            pool_id = None if finding.all_pools else job.pool_id
            seen.add((pool_id, finding.key))
            note = existing.get((pool_id, finding.key))
            if note is None:
                KnownLimitation.objects.create(
                    release_id=job.release_id,
                    pool_id=pool_id,
                    key=finding.key,
                    stage=run.stage,
                    stage_run=run,
                    title=finding.title,
                    body=finding.body,
                    severity=finding.severity,
                    status=LimitationStatus.OPEN,
                    created_at=now,
                    updated_at=now,
                )
                outcome.raised.append(finding.key)
                continue
            changed = (note.title, note.body, note.severity) != (
                finding.title,
                finding.body,
                finding.severity,
            )
            note.title, note.body, note.severity = finding.title, finding.body, finding.severity
            note.stage_run = run
            if note.status == LimitationStatus.RESOLVED:
                note.status, note.resolved_at = LimitationStatus.OPEN, None
                outcome.reopened.append(finding.key)
                changed = True
            elif changed:
                outcome.updated.append(finding.key)
            if changed:
                note.updated_at = now
            note.save(
                update_fields=[
                    "title",
                    "body",
                    "severity",
                    "stage_run",
                    "status",
                    "resolved_at",
                    "updated_at",
                ]
            )
        unjudged = unjudged_keys(run.stage, run.result)
        for identity, note in existing.items():
            if identity in seen or note.status == LimitationStatus.RESOLVED:
                continue
            if note.key in unjudged:
                continue
            note.status, note.resolved_at, note.updated_at = LimitationStatus.RESOLVED, now, now
            note.stage_run = run
            note.save(update_fields=["status", "resolved_at", "updated_at", "stage_run"])
            outcome.resolved.append(note.key)
    if outcome.raised or outcome.reopened or outcome.resolved:
        logger.info(
            "Known limitations of %s after %s: raised %s, reopened %s, resolved %s",
            job.release,
            run,
            outcome.raised,
            outcome.reopened,
            outcome.resolved,
        )
    return outcome


def limitations_sync_safely(*, stage_run: StageRun) -> SyncOutcome | None:
    """`limitations_sync_for_stage` that never raises, for the stage flow: its writes run in
    a savepoint, so a failure rolls back only them; it is logged. None after a failure."""
    try:
        with transaction.atomic():
            return limitations_sync_for_stage(stage_run=stage_run)
    except Exception:
        logger.exception("Could not sync the known limitations of stage run %s", stage_run.pk)
        return None


# --- people's notes ----------------------------------------------------------------------------

# What people may change on a note a stage raised: its title, body and severity are the
# stage's.
STAGE_OWNED_FIELDS = ("title", "body", "severity", "pool")
_EDITABLE_FIELDS = ("title", "body", "severity", "pool", "status")


def _apply_status(note: KnownLimitation, status: str, now: Any) -> None:
    if status not in LimitationStatus.values:
        raise LimitationError(
            f"Unknown status {status!r}; statuses: {', '.join(LimitationStatus.values)}."
        )
    if status == LimitationStatus.RESOLVED:
        if note.status != LimitationStatus.RESOLVED or note.resolved_at is None:
            note.resolved_at = now
    else:
        note.resolved_at = None
    note.status = status


def limitation_create(
    *,
    release: ModelRelease,
    author: Any,
    title: str,
    body: str = "",
    severity: str = Severity.MAJOR,
    pool: AcceleratorPool | None = None,
    status: str = LimitationStatus.OPEN,
) -> KnownLimitation:
    """A person's note on `release` (`pool` None: every pool). Raises `LimitationError` for a
    blank title or an unknown severity or status."""
    if not title.strip():
        raise LimitationError("A known limitation needs a title.")
    if severity not in Severity.values:
        raise LimitationError(
            f"Unknown severity {severity!r}; severities: {', '.join(Severity.values)}."
        )
    now = timezone.now()
    note = KnownLimitation(
        release=release,
        pool=pool,
        title=title.strip(),
        body=body,
        severity=severity,
        author=author if getattr(author, "pk", None) else None,
        created_at=now,
        updated_at=now,
    )
    _apply_status(note, status, now)
    note.save()
    return note


def limitation_update(*, limitation: KnownLimitation, **changes: Any) -> KnownLimitation:
    """Change a note's title, body, severity, pool or status (`changes`); only its status on a
    note a stage raised, whose other fields are the stage's. Raises `LimitationError` for
    such a change, an unknown field, or a blank title."""
    unknown = sorted(set(changes) - set(_EDITABLE_FIELDS))
    if unknown:
        raise LimitationError(f"A known limitation has no editable {', '.join(unknown)}.")
    if limitation.key:
        owned = [
            name
            for name in STAGE_OWNED_FIELDS
            if name in changes and changes[name] != getattr(limitation, name)
        ]
        if owned:
            raise LimitationError(
                f"The {limitation.stage or 'stage'} stage raised this note: its "
                f"{', '.join(owned)} come from the stage; only its status can change."
            )
    if "title" in changes and not str(changes["title"] or "").strip():
        raise LimitationError("A known limitation needs a title.")
    if "severity" in changes and changes["severity"] not in Severity.values:
        raise LimitationError(f"Unknown severity {changes['severity']!r}.")
    now = timezone.now()
    for name in ("title", "body", "severity", "pool"):
        if name in changes:
            value = changes[name]
            setattr(limitation, name, value.strip() if name == "title" else value)
    if "status" in changes:
        _apply_status(limitation, changes["status"], now)
    limitation.updated_at = now
    limitation.save()
    return limitation
