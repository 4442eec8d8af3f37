"""The release notes' full-size figures (`sections["full_size"]`): what the serve stage measured
on the pool's engine serving the full-size model with dummy weights, beside what the plan
predicted for the same workloads and the fit it named
(`templates/release_notes/full_size.md` words them), as the serve stage's reader
(`engine/stages/serve/full_size_result.py`) and the plan's (`engine/stages/plan/result.py`)
judge them for every page.

Two labels, never mixed: `MEASURED_ENGINE_FULL` for the serve result's `full_size`
(docs/stages/serve.md, "Full size": random weights from the config, `--load-format dummy`,
so speed, memory and scheduling at full size, nothing of precision) and `PREDICTED_FULL` for
the plan's step-time model (`predicted.workload`, `predicted.fit`; or the prediction the
serve stage kept beside its measurement, `full_size.predicted_before`, made before it
measured). The release_notes stage builds it (not a stage's own `notes` module) because it
reads two stages: the serve stage's measurement and the plan's prediction.

The section: {"status": "measured" | "skipped" | "failed" | "none" (the serve stage left
no full-size run), "reason" (the skip or failure code, None when measured), "label",
"engine_name", "engine_version", "load_format", "tp", "dtype", "load_s" (s),
"peak_memory_bytes", "model" ({"architecture", "num_hidden_layers", "hidden_size",
"parameters"} or None), "workloads" ([{"label", "input_tokens", "output_tokens", "tp",
"stopped", "levels": [{"concurrency", "output_tokens_per_s", "ttft_s_p50", "tpot_s_p50",
"predicted_output_tokens_per_s", "predicted_ttft_s", "predicted_tpot_s"}], "predicted":
{"label", "made": "before" | "plan", "fit", "split"} or None}]), "predicted_before_reason"
(why the serve stage made no prediction before measuring, None when it made one or did not
say), "scaling" ([{"tp", "concurrency", "output_tokens_per_s", "baseline_tp", "speedup",
"efficiency"}]), "predicted" (the plan's own workload at its throughput-optimal load:
{"label", "input_tokens", "output_tokens", "engine", "concurrency", "output_tokens_per_s",
"ttft_s", "tpot_s", "fit"} or None), and the figures that decide a skip or failure
("devices_needed", "devices_held", "weight_bytes", "max_weight_bytes" (bytes), "by" (who
turned the run off: "pool" or "job"), "error"; None where the run stored none)}. A fit is
{"accelerator", "engine", "scope", "basis": "pool" | "published" | "prior", "points",
"residual", "source"} (`StoredFit.to_dict`).

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.notes import MEASURED_ENGINE_FULL, PREDICTED_FULL, StageState
from engine.stages.plan.result import PlanResult, PlanWorkload
from engine.stages.serve.full_size_result import (
    FullSizeRun,
    Prediction,
    WorkloadComparison,
    comparisons,
)
from engine.stages.serve.result import ServeResult


def _predicted(prediction: Prediction | None) -> dict[str, Any] | None:
    if prediction is None:
        return None
    return {
        "label": PREDICTED_FULL,
        "made": prediction.made,
        "fit": prediction.fit.to_dict() if prediction.fit else None,
        "split": prediction.split,
    }


def _workload(comparison: WorkloadComparison) -> dict[str, Any]:
    workload = comparison.workload
    return {
        "label": workload.label,
        "input_tokens": workload.input_tokens,
        "output_tokens": workload.output_tokens,
        "tp": workload.tp,
        "stopped": workload.stopped or None,
        "levels": [
            {
                "concurrency": row.measured.concurrency,
                "output_tokens_per_s": row.measured.output_tokens_per_s,
                "ttft_s_p50": row.measured.ttft_s_p50,
                "tpot_s_p50": row.measured.tpot_s_p50,
                "predicted_output_tokens_per_s": row.predicted.output_tokens_per_s
                if row.predicted
                else None,
                "predicted_ttft_s": row.predicted.ttft_s if row.predicted else None,
                "predicted_tpot_s": row.predicted.tpot_s if row.predicted else None,
            }
            for row in comparison.rows
        ],
        "predicted": _predicted(comparison.prediction),
    }


def _plan_predicted(plan: PlanWorkload | None) -> dict[str, Any] | None:
    """The plan's own workload at its throughput-optimal load, None without one."""
    best = plan.max_load if plan is not None else None
    if plan is None or best is None:
        return None
    return {
        "label": PREDICTED_FULL,
        "input_tokens": plan.input_tokens,
        "output_tokens": plan.output_tokens,
        "engine": plan.engine,
        "concurrency": best.concurrency,
        "output_tokens_per_s": best.output_tokens_per_s,
        "ttft_s": best.ttft_s,
        "tpot_s": best.tpot_s,
        "fit": plan.fit.to_dict() if plan.fit else None,
    }


def _run(run: FullSizeRun | None, plan: PlanWorkload | None) -> dict[str, Any]:
    """The section's figures of the serve stage's full-size run ("none": it left none)."""
    if run is None:
        return {"status": "none", "reason": None, "workloads": [], "scaling": []}
    measured = run.measured
    model = run.model
    return {
        "status": run.status,
        "reason": run.reason or None,
        "load_format": run.load_format,
        "tp": run.tp,
        "dtype": run.dtype,
        "load_s": run.load_s,
        "peak_memory_bytes": round(run.peak_memory_bytes)
        if run.peak_memory_bytes is not None
        else None,
        "model": {
            "architecture": model.architecture,
            "num_hidden_layers": model.num_hidden_layers,
            "hidden_size": model.hidden_size,
            "parameters": model.parameters,
        }
        if model
        else None,
        "workloads": [_workload(c) for c in comparisons(run, plan)] if measured else [],
        "scaling": [point.to_dict() for point in run.scaling] if measured else [],
        "predicted_before_reason": run.predicted_before_reason or None,
        "error": run.error or None,
        "devices_needed": run.devices_needed,
        "devices_held": run.devices_held,
        "weight_bytes": run.weight_bytes,
        "max_weight_bytes": run.max_weight_bytes,
        "by": run.disabled_by or None,
    }


def full_size_section(states: Mapping[str, StageState]) -> dict[str, Any] | None:
    """The full-size figures of a job (module docstring) from its serve and plan states;
    None when there is neither a full-size run nor a plan's workload prediction."""
    serve = states.get("serve")
    plan_state = states.get("plan")
    served = ServeResult.from_stored(serve.result if serve is not None else None)
    run = served.full_size
    plan = PlanResult.from_stored(
        plan_state.result if plan_state is not None and plan_state.succeeded else None
    ).workload
    if run is None and plan is None:
        return None
    engine = served.engine
    return {
        **_run(run, plan),
        "label": MEASURED_ENGINE_FULL,
        "engine_name": engine.name if engine else "",
        "engine_version": engine.version if engine else "",
        "predicted": _plan_predicted(plan),
    }
