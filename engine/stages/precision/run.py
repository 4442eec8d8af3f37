"""The precision stage's flow: reference run, then per dtype a target, its runs and verdict."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from engine.contract import StageContext, StageFailed
from engine.twin import Twin, twin_for_release
from engine.twin.run import DECODE_STEPS, Trace, resolve_device

from .drift import (
    Point,
    Recording,
    first_divergence,
    hook_points,
    layer_drift,
    run_local,
    run_recorded,
)
from .metrics import count_non_finite, failed_checks, logit_metrics
from .targets import make_target, perturb_norm_eps
from .thresholds import thresholds_for

NULL_METRICS = (
    "max_abs_error",
    "mean_abs_error",
    "relative_logit_error",
    "max_relative_logit_error",
    "cosine_similarity",
    "top1_agreement",
    "kl_divergence",
)


def _json_rows(rows: list[dict[str, Any]], limit: float) -> list[dict[str, Any]]:
    """Layer rows for the result: non-finite errors as None, `local_error_exceeds_limit`."""
    out = []
    for row in rows:
        row = {k: v for k, v in row.items() if k != "finite"}
        for key in ("max_abs_error", "relative_error", "local_max_abs_error"):
            if row.get(key) is not None and not math.isfinite(row[key]):
                row[key] = None
        local = row.get("local_relative_error")
        row["local_error_exceeds_limit"] = local is not None and (
            not math.isfinite(local) or local > limit
        )
        if local is not None and not math.isfinite(local):
            row["local_relative_error"] = None
        out.append(row)
    return out


def _where(row: dict[str, Any] | None, u: float) -> str:
    if row is None:
        return "no module's local error exceeds the limit"
    local = row["local_relative_error"]
    size = f"{local:.4g} = {local / u:.3g}u" if math.isfinite(local) else "not finite"
    return (
        f"first divergent layer {row['layer']} ({row['module']}: {row['name']}, "
        f"local relative error {size})"
    )


def reduction_width(model: torch.nn.Module) -> int:
    """The widest trailing dimension of the model's weights (elements): an upper bound of the
    length of its dot products (nn.Linear's in_features; a fused expert weight's last dim)."""
    return max((int(p.shape[-1]) for p in model.parameters() if p.dim() >= 2), default=1)


def compare_dtype(
    twin: Twin,
    dtype: str,
    device: torch.device,
    ref_trace: Trace,
    reference: Recording,
    points: list[Point],
    thresholds: Mapping[str, Any],
    *,
    steps: int,
    perturb: Mapping[str, Any] | None,
) -> tuple[dict[str, Any] | None, str | None]:
    """(metrics entry, skip reason) for one dtype: see `measure_precision` for the keys."""
    target, skip, notes = make_target(twin, dtype, device)
    if target is None:
        return None, skip
    if perturb:
        perturb_norm_eps(
            target,
            layer=int(perturb["layer"]),
            module=str(perturb["module"]),
            eps=float(perturb["eps"]),
        )
        notes.append(
            f"perturbed on purpose: layer {perturb['layer']} "
            f"{perturb['module']} eps = {perturb['eps']}"
        )
    tgt_trace, tgt_rec = run_recorded(
        target, twin.input_ids, points, forced=ref_trace.tokens, steps=steps, route_from=reference
    )
    local = run_local(target, twin.input_ids, points, reference)
    rows = layer_drift(reference, tgt_rec, local, points)
    u = thresholds["unit_roundoff"]
    limit = thresholds["max_local_relative_error"]
    diverged = first_divergence(rows, limit)
    flips = [
        {
            "layer": row["layer"],
            "local": row["routing_flips"],
            "end_to_end": row["end_to_end_routing_flips"],
            "prefill_tokens": row["routed_tokens"],
        }
        for row in rows
        if "routing_flips" in row
    ]
    entry: dict[str, Any] = {
        "thresholds": dict(thresholds),
        "notes": notes,
        "unit_roundoff": u,
        "first_divergent_layer": diverged["layer"] if diverged else None,
        "first_divergent_module": diverged["module"] if diverged else None,
        "first_divergent_name": diverged["name"] if diverged else None,
        "first_divergent_local_error": (
            diverged["local_relative_error"]
            if diverged and math.isfinite(diverged["local_relative_error"])
            else None
        ),
        "worst_local_relative_error": max(
            (r["local_relative_error"] for r in rows if r["local_relative_error"] is not None),
            default=None,
        ),
        "routing_flips": flips,
        "layers": _json_rows(rows, limit),
    }
    if entry["worst_local_relative_error"] is not None and not math.isfinite(
        entry["worst_local_relative_error"]
    ):
        entry["worst_local_relative_error"] = None
    bad = count_non_finite(tgt_trace)
    if bad:
        first_bad = next((row for row in rows if not row["finite"]), None)
        where = (
            f"; first non-finite hidden state at layer {first_bad['layer']} "
            f"({first_bad['module']}: {first_bad['name']})"
            if first_bad
            else ""
        )
        entry.update(dict.fromkeys(NULL_METRICS))
        entry.update(
            {
                "passed": False,
                "non_finite_values": bad,
                "reason": f"{dtype}: the target's logits hold NaN/Inf ({bad} values){where}",
            }
        )
        return entry, None
    metrics = logit_metrics(ref_trace, tgt_trace)
    failures = failed_checks(metrics, dict(thresholds))
    if diverged is not None:
        failures.append(f"local error over {limit:.4g} ({limit / u:.3g}u)")
    verdict = ", ".join(failures) if failures else "within thresholds"
    entry.update(metrics)
    entry["passed"] = not failures
    entry["reason"] = f"{dtype}: {verdict}; {_where(diverged, u)}"
    return entry, None


def measure_precision(
    twin: Twin,
    pool: Any,
    *,
    steps: int = DECODE_STEPS,
    perturb: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The precision result for `twin` on `pool` (a PoolSpec or the same fields).

    Returns {"reference": {"device": "cpu", "dtype": "float32"}, "target_device", "dtypes":
    {dtype: entry}, "skipped_dtypes": {dtype: reason}, "twin" (its description), "passed",
    "decode_steps", "prompt": {"batch", "tokens"}}.

    An entry holds the logit metrics (metrics.py: max_abs_error, mean_abs_error,
    relative_logit_error, max_relative_logit_error, cosine_similarity, min_cosine_similarity,
    top1_agreement, prefill/decode_top1_agreement, kl_divergence, positions,
    reference_logit_rms), "passed", "reason", "thresholds", "unit_roundoff", "notes",
    "first_divergent_layer"/"_module"/"_name"/"_local_error", "worst_local_relative_error",
    "routing_flips" ([{"layer", "local", "end_to_end", "prefill_tokens"}]: tokens whose top-k
    expert set differed from the reference's and were forced back) and "layers" (drift.py
    rows plus "local_error_exceeds_limit"); a target with NaN/Inf logits has the metrics None
    and "non_finite_values".

    `perturb` ({"layer", "module", "eps"}) changes one norm's epsilon in every target (see
    `targets.perturb_norm_eps`). Raises `StageFailed` (device absent; the reference itself not
    finite; a dtype failed: the exception's `result` attribute holds this dict).
    """
    device = resolve_device(pool.device, pool.name)
    points = hook_points(twin.model)
    ref_trace, reference = run_recorded(
        twin.model, twin.input_ids, points, forced=None, steps=steps, inputs=True
    )
    if count_non_finite(ref_trace):
        raise StageFailed(
            "the float32 reference twin itself produces NaN/Inf: "
            "the config's values overflow even in float32"
        )
    overrides = pool.precision_thresholds or {}
    width = reduction_width(twin.model)
    result: dict[str, Any] = {
        "reference": {"device": "cpu", "dtype": "float32"},
        "target_device": str(device),
        "dtypes": {},
        "skipped_dtypes": {},
        "decode_steps": steps,
        "prompt": {"batch": int(twin.input_ids.shape[0]), "tokens": int(twin.input_ids.shape[1])},
        "twin": twin.description,
    }
    for dtype in pool.dtypes:
        entry, skipped = compare_dtype(
            twin,
            dtype,
            device,
            ref_trace,
            reference,
            points,
            thresholds_for(dtype, overrides, reduction_width=width),
            steps=steps,
            perturb=perturb,
        )
        if entry is None:
            result["skipped_dtypes"][dtype] = skipped
        else:
            result["dtypes"][dtype] = entry
    result["passed"] = all(e["passed"] for e in result["dtypes"].values())
    if not result["passed"]:
        reasons = "; ".join(e["reason"] for e in result["dtypes"].values() if not e["passed"])
        exc = StageFailed(reasons)
        exc.result = result  # type: ignore[attr-defined]  # stored by the lead on failure
        raise exc
    return result


def run(ctx: StageContext) -> dict[str, Any]:
    """Compare the twin on the pool's device in each declared dtype with the float32 reference.

    The twin is the release's real model where its weights are present and small enough
    (`twin.real.twin_for_release`), so the figures are the release's own; else the seeded twin.
    A release that needs its own modeling code runs in the sandboxed child (remote_code.py).

    Raises `StageFailed` (with `.result`) when a dtype crosses a threshold or yields NaN/Inf.
    """
    from engine.remote_code import sandbox as remote_code

    config = remote_code.fetched_config(ctx)
    if remote_code.needs_remote_code(config):
        return remote_code.run_stage_in_sandbox(ctx, "precision", config)
    result = measure_precision(twin_for_release(ctx, config), ctx.pool)
    for entry in result["dtypes"].values():
        ctx.log(
            f"{entry['reason']} (relative logit error {entry['relative_logit_error']:.2e}, "
            f"top-1 {entry['top1_agreement']:.3f}, KL {entry['kl_divergence']:.2e})"
        )
    for dtype, why in result["skipped_dtypes"].items():
        ctx.log(f"{dtype} skipped: {why}")
    return result
