"""The plan's full-size predictions as performance points, kept beside the twin's measured ones
(never on one curve with them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.stages.performance.rows import UNITS


def predicted_points(plan: Mapping[str, Any] | None) -> tuple[list[dict[str, Any]], dict]:
    """(points, info) from the plan stage's result: its predictions for the full-size model
    (the step-time model with the fit the plan names). A point: {"kind": "predicted",
    "model": "full-size", "dtype" (the plan's serving dtype), "batch_size", "prompt_len",
    "context_tokens", "ttft_s", "ttft_p95_s", "tpot_s", "tpot_p95_s", "prefill_tokens_per_s",
    "decode_tokens_per_s", "peak_memory_bytes", "memory_kind"}, None where the model says
    nothing (p95s, memory). Decode points have `prompt_len` None and `context_tokens` the
    average context the prediction read each sequence's KV cache at (the workload's input +
    half its output tokens); prefill points are one prompt each (`batch_size` 1,
    `context_tokens` None). Where the plan carried a calibrated prediction (the pool's running
    calibration, `plan.calibration.calibrated_predictions`), decode points also have
    "calibrated_tpot_s" and "calibrated_decode_tokens_per_s", prefill points
    "calibrated_ttft_s" and "calibrated_prefill_tokens_per_s", beside the raw figures.
    `info` = {"available", "source", and "reason" or the plan's accelerator, split, dtype,
    context_tokens, "fit" (the fitted constants the figures come from), "calibrated" (its
    label, factors, runs, basis and caveat, or why not)}."""
    source = (
        "plan stage: engine/stages/plan/predictor.py, FullSizePredictor.predictions "
        "(full-size model)"
    )
    if not isinstance(plan, Mapping) or plan.get("fits") is not True:
        return [], {"available": False, "source": source, "reason": "no successful plan result"}
    predicted = plan.get("predicted")
    if not isinstance(predicted, Mapping) or not predicted.get("available"):
        why = predicted.get("reason") if isinstance(predicted, Mapping) else None
        return [], {
            "available": False,
            "source": source,
            "reason": why or "the plan made no prediction",
        }
    dtype = str(plan.get("dtype") or "checkpoint")
    context = (plan.get("inputs") or {}).get("context_tokens")
    empty = dict.fromkeys(UNITS)
    base = {"kind": "predicted", "model": "full-size", "dtype": dtype, "memory_kind": None}
    calibrated = predicted.get("calibrated")
    if not isinstance(calibrated, Mapping) or not calibrated.get("available"):
        calibrated = None
    decode_factor = calibrated.get("decode_factor") if calibrated else None
    prefill_factor = calibrated.get("prefill_factor") if calibrated else None
    points = []
    for entry in predicted.get("decode_curve") or []:
        point = (
            base
            | empty
            | {
                "batch_size": entry["concurrent_sequences"],
                "prompt_len": None,
                "context_tokens": entry.get("context_tokens") or context,
                "tpot_s": entry["tpot_s"],
                "decode_tokens_per_s": entry["decode_tokens_per_s"],
            }
        )
        if decode_factor:
            point["calibrated_tpot_s"] = entry["tpot_s"] / decode_factor
            point["calibrated_decode_tokens_per_s"] = entry["decode_tokens_per_s"] * decode_factor
        points.append(point)
    for entry in predicted.get("prefill") or []:
        ttft, tokens = entry["ttft_s"], entry["prompt_tokens"]
        point = (
            base
            | empty
            | {
                "batch_size": 1,
                "prompt_len": tokens,
                "context_tokens": None,
                "ttft_s": ttft,
                "prefill_tokens_per_s": tokens / ttft if ttft else None,
            }
        )
        if prefill_factor and ttft:
            point["calibrated_ttft_s"] = ttft / prefill_factor
            point["calibrated_prefill_tokens_per_s"] = tokens / point["calibrated_ttft_s"]
        points.append(point)
    info = {
        "available": True,
        "source": source,
        "accelerator": plan.get("accelerator"),
        "split": {k: plan.get(k) for k in ("tp", "pp", "ep", "dp", "devices")},
        "dtype": dtype,
        "dtype_label": plan.get("dtype_label"),
        "context_tokens": context,
        "fit": predicted.get("fit"),
        "calibrated": (
            {"available": True}
            | {
                key: calibrated.get(key)
                for key in (
                    "label",
                    "decode_factor",
                    "prefill_factor",
                    "runs",
                    "basis",
                    "caveat",
                    "warning",
                )
                if key in calibrated
            }
            if calibrated
            else {
                "available": False,
                "reason": (predicted.get("calibrated") or {}).get("reason")
                or "the plan carried no calibrated prediction",
            }
        ),
    }
    return points, info
