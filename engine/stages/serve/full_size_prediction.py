"""What the plan predicted for a full-size sweep before it was measured (`predicted_before`):
the plan stage's fit and split, the sweep's own input/output lengths and concurrency levels
(`engine/stages/plan/closed_loop.py` `predicted_sweep`). The page draws it beside the
measured curve; the measured sweep then refits the pool (the closed loop)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.catalog import CatalogError
from engine.contract import StageContext
from engine.stages.plan.closed_loop import fit_from_dict, predicted_sweep
from engine.stages.plan.errors import NoFittingPlan, PlanInputError
from engine.stages.plan.result import MeasuredDevice, PlanResult
from engine.stages.plan.run import layout_from_pool, pool_catalog_for_stage, pool_engine
from engine.stored import as_mapping

from .full_size_result import launch_split


def _measured_figures(device: MeasuredDevice | None) -> dict[str, Any] | None:
    """The cpu figures the plan predicted on (its `measured_device`), as the catalog reads
    a probe's; None for a datasheet kind."""
    if device is None:
        return None
    return {
        "memory_bandwidth_bytes_per_s": device.memory_bandwidth_bytes_per_s,
        "flops": {"bfloat16": device.dense_bf16_flops},
        "source": device.source,
        "host_busy": device.host_busy,
    }


def predicted_before(ctx: StageContext, full_size: Mapping[str, Any]) -> dict[str, Any]:
    """{"available": True, "fit" (the plan's, as `Fit.to_dict`), "split", "sweep" (the primary
    workload's predicted levels), "workloads" ([{"label", "input_tokens", "output_tokens",
    "sweep"}])}, or {"available": False, "reason"} when the plan made no prediction or the
    run's split cannot be predicted on the pool's layout (a cpu pool counts its machine as one
    device, so a TP=2 launch on it has no prediction)."""
    stored = as_mapping(ctx.previous.get("plan"))
    plan = PlanResult.from_stored(stored)
    analysis = ctx.previous.get("analyze")
    # The fitted constants themselves: the typed result names the fit, the refit reads them.
    constants = as_mapping(stored.get("predicted")).get("fit")
    if plan.predicted is None or not isinstance(constants, Mapping):
        return {"available": False, "reason": "the plan made no full-size prediction"}
    if not isinstance(analysis, Mapping):
        return {"available": False, "reason": "no architecture analysis"}
    tp = int(full_size.get("tp") or 1)
    pp, dp = plan.split.pp or 1, plan.split.dp or 1
    split = launch_split(tp, plan.split)
    settings = full_size.get("sweep_settings") or {}
    levels = [c for c in settings.get("concurrency") or [] if isinstance(c, int) and c > 0]
    workloads = [
        {
            "label": "primary",
            "input_tokens": settings.get("input_tokens"),
            "output_tokens": settings.get("output_tokens"),
        },
        *(
            {k: w.get(k) for k in ("label", "input_tokens", "output_tokens")}
            for w in full_size.get("workloads") or []
        ),
    ]
    try:
        catalog = pool_catalog_for_stage(
            ctx.pool, measured_figures=_measured_figures(plan.measured_device)
        )
        layout = layout_from_pool(ctx.pool, catalog)
        fit = fit_from_dict(constants)
        if tp * pp * dp > layout.devices:
            return {
                "available": False,
                "reason": f"{split} runs on more devices than the pool's layout counts "
                f"({layout.devices})",
            }
        for workload in workloads:
            workload["sweep"] = predicted_sweep(
                analysis,
                layout,
                split=split,
                dtype=str(full_size.get("dtype") or "checkpoint"),
                kv_dtype="bfloat16",
                engine=pool_engine(ctx.pool),
                fit=fit,
                input_tokens=int(workload["input_tokens"]),
                output_tokens=int(workload["output_tokens"]),
                concurrencies=levels,
                catalog=catalog,
            )
    except (PlanInputError, NoFittingPlan, CatalogError, KeyError, TypeError, ValueError) as err:
        return {"available": False, "reason": str(err)}
    return {
        "available": True,
        "fit": dict(constants),
        "split": split,
        "sweep": workloads[0]["sweep"],
        "workloads": workloads,
    }
