"""The `plan` stage: the TP/PP/EP/DP split a release needs on a pool, before the hardware.

Modules: `model` (the analysis as component bytes per dtype), `validity` (splits the
engines accept), `memory` (bytes per device), `communication` (bytes per token and their
time), `roofline` (predicted decode/prefill), `artifacts` (launch commands, Kubernetes),
`planner` (the choice, runners-up, scaling, `NoFittingPlan`).
"""

from __future__ import annotations

from typing import Any

from workers.catalog import CatalogError
from workers.stages.base import StageContext, StageFailed

from .errors import NoFittingPlan, PlanInputError
from .planner import Plan, PoolLayout, evaluate_split, plan_release


def _pool_int(pool: Any, name: str, default: int | None) -> int:
    value = getattr(pool, name, None)
    if value is None:
        if default is None:
            raise StageFailed(
                f"pool {getattr(pool, 'name', '?')!r} does not say its {name}: the plan needs "
                "the pool's accelerator kind, devices_per_node and nodes"
            )
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise StageFailed(f"pool {name} must be a positive integer, got {value!r}")
    return value


def layout_from_pool(pool: Any) -> PoolLayout:
    """A `PoolLayout` from a `PoolSpec` with `accelerator`, `devices_per_node`, `nodes`
    (and optionally the bandwidths). A "cpu" backend pool without an accelerator kind is
    the worker's own machine, one device."""
    kind = getattr(pool, "accelerator", None)
    if not kind and getattr(pool, "backend", None) == "cpu":
        kind = "cpu"
    if not kind:
        raise StageFailed(
            f"pool {getattr(pool, 'name', '?')!r} names no accelerator kind: the plan needs "
            "the pool's accelerator (a catalog kind such as h100), devices_per_node and nodes"
        )
    default = 1 if kind == "cpu" else None
    return PoolLayout(
        accelerator=str(kind),
        devices_per_node=_pool_int(pool, "devices_per_node", default),
        nodes=_pool_int(pool, "nodes", 1),
        intra_node_bandwidth_bytes_per_s=getattr(pool, "intra_node_bandwidth_bytes_per_s", None),
        inter_node_bandwidth_bytes_per_s=getattr(pool, "inter_node_bandwidth_bytes_per_s", None),
    )


def run(ctx: StageContext) -> dict[str, Any]:
    """Plan the release analysed by `ctx.previous["analyze"]` on `ctx.pool`.

    Per-job options (`context_tokens`, `concurrency`, `dtype`) come from a `plan_options`
    mapping on the context when the job frame provides one (defaults otherwise). A pool
    without a layout, bad input, or a model that fits no split fails the stage with the
    reason (`StageFailed`).
    """
    analysis = ctx.previous.get("analyze")
    if not isinstance(analysis, dict):
        raise StageFailed("the analyze stage produced no architecture analysis to plan from")
    layout = layout_from_pool(ctx.pool)
    options = getattr(ctx, "plan_options", None) or {}
    try:
        plan = plan_release(
            analysis,
            layout,
            context_tokens=options.get("context_tokens"),
            concurrency=options.get("concurrency"),
            dtype=options.get("dtype"),
            release=ctx.release.repo_id,
        )
    except (NoFittingPlan, PlanInputError, CatalogError) as err:
        raise StageFailed(str(err)) from err
    result = plan.to_dict()
    predicted = result["predicted"]
    speed = ""
    if predicted.get("available"):
        speed = (
            f", predicted {predicted['batch_1']['decode_tokens_per_s']:,.1f} tokens/s at batch 1"
        )
    ctx.log(
        f"{layout.accelerator}: TP{result['tp']} PP{result['pp']} EP{result['ep']} "
        f"DP{result['dp']} on {result['devices']} device(s){speed}"
    )
    return result


__all__ = [
    "NoFittingPlan",
    "Plan",
    "PlanInputError",
    "PoolLayout",
    "evaluate_split",
    "layout_from_pool",
    "plan_release",
    "run",
]
