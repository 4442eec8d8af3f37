"""The performance stage's section of the release notes ("performance"): the knee batch size
with its TPOT and decode tokens/s, measured on the scaled twin (`MEASURED_TWIN`), beside the
plan's full-size roofline at that batch (`PREDICTED_FULL`, and `CALIBRATED_FULL` where the
pool had a calibration); the knee of every measured dtype
(`templates/release_notes/sections/performance.md`).

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine.markdown import first_line
from engine.notes import (
    CALIBRATED_FULL,
    MEASURED_FULL,
    MEASURED_TWIN,
    PREDICTED_FULL,
    NotesContext,
    StageState,
)
from engine.stages.performance.result import PerformanceResult

PLACE = 30


def ran_twin(state: StageState) -> bool:
    """Whether the stage measured the twin: it kept a result."""
    return state.result is not None


def _predicted_at(
    performance: PerformanceResult, plan: Mapping[str, Any] | None, batch: int
) -> dict[str, Any] | None:
    """The plan's full-size decode prediction at `batch` sequences (the largest predicted
    batch at or below it), from the performance result's predicted points, else from the
    plan's decode curve; None when there is none."""
    point = performance.predicted_decode_at(batch)
    if point is not None:
        return {
            "batch_size": point.batch_size,
            "tpot_s": point.tpot_s,
            "decode_tokens_per_s": point.decode_tokens_per_s,
            "calibrated_tpot_s": point.calibrated_tpot_s,
            "calibrated_decode_tokens_per_s": point.calibrated_decode_tokens_per_s,
            "context_tokens": point.context_tokens,
            "dtype": point.dtype,
        }
    candidates: list[dict[str, Any]] = []
    if plan and plan.get("fits") is True:
        predicted = plan.get("predicted") or {}
        context = (plan.get("inputs") or {}).get("context_tokens")
        for entry in predicted.get("decode_curve") or [] if predicted.get("available") else []:
            if isinstance(entry, Mapping):
                candidates.append(
                    {
                        "batch_size": entry.get("concurrent_sequences"),
                        "tpot_s": entry.get("tpot_s"),
                        "decode_tokens_per_s": entry.get("decode_tokens_per_s"),
                        "context_tokens": context,
                        "dtype": plan.get("dtype"),
                    }
                )
    below = [
        c
        for c in candidates
        if isinstance(c.get("batch_size"), int) and not isinstance(c["batch_size"], bool)
        if c["batch_size"] <= batch
    ]
    if not below:
        return None
    return max(below, key=lambda c: c["batch_size"])


def section(perf: StageState, notes: NotesContext) -> dict[str, Any]:
    """The recommendation as data: "available" False with the stage's status and reason when
    no knee was found ("no_knee": the stage succeeded but found none); else the knee batch
    size and the recommended one (the knee, capped at the sequences the plan fits at its
    context: "capped_by_plan"), the knee as measured (twin or real weights, with its TPOT
    (s) and decode tokens/s), the plan's full-size prediction at that batch (and its
    calibrated one) or the stage's reason why there is none ("" when it gave none), the
    largest batch that fits, each dtype's knee, the sweeps that stopped early ({"dtype",
    "prompt_len", "batch_size", "reason"}), the dtypes skipped and the prompt lengths
    measured."""
    plan = notes.state("plan")
    twin = notes.twin
    result = PerformanceResult.from_stored(perf.result)
    knee = result.knee
    if not perf.succeeded or knee is None:
        return {
            "available": False,
            "status": perf.status,
            "reason": perf.reason,
            "no_knee": perf.succeeded,
        }
    measured_model = result.measured_model
    label = MEASURED_FULL if measured_model == "release" else MEASURED_TWIN
    batch = knee.batch_size
    measured = {
        "label": label,
        "model": measured_model,
        "dtype": knee.dtype,
        "prompt_len": knee.prompt_len,
        "batch_size": batch,
        "tpot_s": knee.tpot_s,
        "tpot_p95_s": knee.tpot_p95_s,
        "decode_tokens_per_s": knee.decode_tokens_per_s,
        "found": knee.found,
        "reason": knee.reason,
        "device": result.device,
        "twin_parameters": (twin or {}).get("parameters"),
    }
    predicted = None
    plan_result = plan.result if plan.succeeded else None
    if isinstance(batch, int):
        at = _predicted_at(result, plan_result, batch)
        if at is not None:
            predicted = {
                "label": PREDICTED_FULL,
                "accelerator": (plan_result or {}).get("accelerator"),
                **{k: at.get(k) for k in ("batch_size", "tpot_s", "decode_tokens_per_s")},
                "context_tokens": at.get("context_tokens"),
                "dtype": at.get("dtype"),
            }
            if fmt.finite(at.get("calibrated_tpot_s")) is not None:
                predicted["calibrated"] = {
                    "label": CALIBRATED_FULL,
                    "tpot_s": at.get("calibrated_tpot_s"),
                    "decode_tokens_per_s": at.get("calibrated_decode_tokens_per_s"),
                }
    by_dtype = [
        {
            "dtype": entry.dtype,
            "prompt_len": entry.prompt_len,
            "batch_size": entry.batch_size,
            "tpot_s": entry.tpot_s,
            "decode_tokens_per_s": entry.decode_tokens_per_s,
            "found": entry.found,
        }
        for entry in result.knee_by_dtype.values()
    ]
    largest = None
    if plan_result and plan_result.get("fits") is True:
        big = ((plan_result.get("predicted") or {}).get("largest_batch")) or None
        if isinstance(big, Mapping):
            largest = {
                "label": PREDICTED_FULL,
                "concurrent_sequences": big.get("concurrent_sequences"),
                "tpot_s": big.get("tpot_s"),
                "decode_tokens_per_s": big.get("decode_tokens_per_s"),
            }
    # The twin's knee is measured on the twin's memory: never recommend more sequences than
    # the plan fits at its full context on the pool.
    cap = None
    if plan_result and plan_result.get("fits") is True:
        fits = (plan_result.get("predicted") or {}).get("largest_batch_sequences") or (
            plan_result.get("max_sequences_at_context")
        )
        if isinstance(batch, int) and isinstance(fits, int) and 1 <= fits < batch:
            cap = {
                "sequences": fits,
                "context_tokens": (plan_result.get("inputs") or {}).get("context_tokens"),
            }
    return {
        "available": True,
        "knee_batch_size": batch,
        "recommended_batch_size": cap["sequences"] if cap else batch,
        "capped_by_plan": cap,
        "measured": measured,
        "predicted": predicted,
        "predicted_reason": ""
        if predicted or result.predicted is None
        else result.predicted.reason,
        "largest_batch": largest,
        "by_dtype": by_dtype,
        "knee_rule": result.knee_rule,
        "stopped": [
            {
                "dtype": s.dtype,
                "prompt_len": s.prompt_len,
                "batch_size": s.batch_size,
                "reason": first_line(s.reason, 160),
            }
            for s in result.stopped
        ],
        "skipped_dtypes": dict(result.skipped_dtypes),
        "prompt_lens": list(result.options.prompt_lens) if result.options else [],
    }
