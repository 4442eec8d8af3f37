"""The `plan` stage: the TP/PP/EP/DP split a release needs on a pool, before the hardware.

Modules: `model` (the analysis as component bytes per dtype), `validity` (splits the
engines accept), `memory` (bytes per device), `communication` (bytes per token and their
time), `roofline` (predicted decode/prefill), `artifacts` (launch commands, Kubernetes),
`planner` (the choice, runners-up, scaling, `NoFittingPlan`), `calibration` (the roofline
against the scaled twin's measured speed, per pool, and the calibrated predictions).

As a stage (`run`), it plans the release analysed by the `analyze` stage on the job's pool,
with the job's plan options (`plan_options`); when nothing fits the pool it fails with the
engine's reason and keeps what would fit as the run's result (`no_fit_result`).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine.catalog import Catalog, CatalogError, cpu_accelerator, load_catalog
from engine.contract import StageContext, StageFailed

from .calibration import calibrated_predictions
from .closed_loop import pool_fit_from
from .errors import NoFittingPlan, PlanInputError
from .layout import PoolLayout
from .model import DEFAULT_CONCURRENCY, ModelShape, default_context_tokens, normalize_dtype
from .options import plan_options
from .planner import (
    plan_release,
)
from .steady_state import ENGINES


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


def pool_catalog_for_stage(
    pool: Any, *, measured_figures: Mapping[str, Any] | None = None
) -> Catalog:
    """The shipped catalog with the pool's admin entry (`PoolSpec.accelerator_entry`), and
    "cpu" as the worker's machine measured now, with the memory bandwidth and FLOP/s a
    performance run measured on the pool (`measured_figures`, the running calibration's
    "device") where given. Raises `StageFailed` for a malformed entry."""
    catalog = load_catalog()
    entry = getattr(pool, "accelerator_entry", None)
    try:
        if entry:
            catalog = catalog.with_entries([entry], label=f"admin row {entry.get('kind')}")
    except CatalogError as err:
        raise StageFailed(f"the admin's catalog row is malformed: {err}") from err
    return catalog.with_cpu(
        cpu_accelerator(
            measured_by=f"worker host {socket.gethostname()}", measured_figures=measured_figures
        )
    )


def layout_from_pool(pool: Any, catalog: Catalog | None = None) -> PoolLayout:
    """A `PoolLayout` from a `PoolSpec` with `accelerator`, `devices_per_node`, `nodes`
    (and optionally the bandwidths). A "cpu" backend pool without an accelerator kind is
    the worker's own machine, one device; a blank `devices_per_node` takes the catalog's
    figure for the kind. Raises `StageFailed` saying what to set when the pool names no
    kind, or names one the catalog does not know."""
    kind = getattr(pool, "accelerator", None)
    if not kind and getattr(pool, "backend", None) == "cpu":
        kind = "cpu"
    name = getattr(pool, "name", "?")
    if not kind:
        raise StageFailed(
            f"pool {name!r} (backend {getattr(pool, 'backend', '?')}) names no accelerator "
            "kind, so there is nothing to plan on: set the pool's accelerator in the admin "
            "to a catalog kind (h200, h100, a100-80gb, mi300x, ...; or add an accelerator kind "
            "row), and its devices_per_node and nodes where they differ from the catalog's"
        )
    default = 1 if kind == "cpu" else None
    if default is None and catalog is not None and getattr(pool, "devices_per_node", None) is None:
        try:
            default = catalog.accelerator(str(kind)).devices_per_node
        except CatalogError as err:
            raise StageFailed(f"pool {name!r}: {err}") from err
    return PoolLayout(
        accelerator=str(kind),
        devices_per_node=_pool_int(pool, "devices_per_node", default),
        nodes=_pool_int(pool, "nodes", 1),
        intra_node_bandwidth_bytes_per_s=getattr(pool, "intra_node_bandwidth_bytes_per_s", None),
        inter_node_bandwidth_bytes_per_s=getattr(pool, "inter_node_bandwidth_bytes_per_s", None),
    )


def pool_engine(pool: Any) -> str:
    """The serving engine whose fit the plan predicts with: the pool's launched engine
    ("vllm", "sglang"; one of `steady_state.ENGINES`), else vLLM's (an attached endpoint's
    engine is not known)."""
    kind = (getattr(pool, "engine", None) or {}).get("kind")
    return kind if kind in ENGINES else "vllm"


def no_fit_result(
    err: NoFittingPlan,
    analysis: Mapping[str, Any],
    layout: PoolLayout,
    catalog: Catalog,
    options: Mapping[str, Any],
    *,
    release: str,
) -> dict[str, Any]:
    """What a failed plan keeps on its run: `fits` False, the engine's `reason`, its
    `suggestions` ({"devices": 16, "context_tokens": 4096, "dtype": "fp8"}, each only where it
    would fit), the accelerator kind and name, the pool's layout, and the inputs planned for
    (defaults resolved as the planner does: context = the release's max capped at 32,768
    tokens, 4 sequences, the checkpoint's dtype)."""
    shape = ModelShape.from_analysis(analysis)
    accelerator = catalog.accelerator(layout.accelerator)
    return {
        "release": release,
        "fits": False,
        "reason": str(err),
        "suggestions": dict(err.suggestions),
        "accelerator": accelerator.kind,
        "accelerator_name": accelerator.name,
        "accelerator_memory_bytes": accelerator.memory_bytes,
        "catalog_version": catalog.version,
        "pool": {
            "devices_per_node": layout.devices_per_node,
            "nodes": layout.nodes,
            "devices": layout.devices,
        },
        "inputs": {
            "context_tokens": options.get("context_tokens") or default_context_tokens(shape),
            "concurrency": options.get("concurrency") or DEFAULT_CONCURRENCY,
            "dtype": normalize_dtype(options.get("dtype")),
        },
    }


def run(ctx: StageContext) -> dict[str, Any]:
    """Plan the release analysed by `ctx.previous["analyze"]` on `ctx.pool`.

    Options (`context_tokens`, `concurrency`, `dtype`) come from `ctx.options`, the job's
    options for this stage (checked by `plan_options`; defaults otherwise). Returns
    `Plan.to_dict()` plus `catalog_version`, with `predicted["calibrated"]`: the raw roofline
    corrected by the pool's running calibration (`ctx.calibration`,
    `calibration.calibrated_predictions`), or why there is none ("no calibration yet"). On a
    cpu pool the roofline reads the memory bandwidth and FLOP/s the pool's latest performance
    runs measured (`ctx.calibration["device"]`: quiet probes over busy ones), labelled
    measured, and "measured on a busy host" where only busy probes exist (`measured_device`
    in the result, with `host_busy`); without them it predicts nothing, as the cpu kind has no
    datasheet. Fails (`StageFailed`) with the reason for a pool without an accelerator layout,
    bad input, or a model that fits no split of the pool; in that last case the exception's
    `.result` is `no_fit_result(...)` (what would fit).
    """
    analysis = ctx.previous.get("analyze")
    if not isinstance(analysis, dict):
        raise StageFailed("the analyze stage produced no architecture analysis to plan from")
    try:
        options = plan_options(ctx.options)
    except PlanInputError as err:
        raise StageFailed(f"the job's plan options are unusable: {err}") from err
    calibration = getattr(ctx, "calibration", None)
    measured = calibration.get("device") if isinstance(calibration, Mapping) else None
    catalog = pool_catalog_for_stage(ctx.pool, measured_figures=measured)
    layout = layout_from_pool(ctx.pool, catalog)
    release = ctx.release.repo_id
    engine = pool_engine(ctx.pool)
    fit, left_out = pool_fit_from(
        (calibration or {}).get("full_size") or [],
        pool=getattr(ctx.pool, "name", "?"),
        layout=layout,
        catalog=catalog,
        engine=engine,
    )
    for reason in left_out:
        ctx.log(f"a full-size sweep left out of the pool's fit: {reason}")
    try:
        plan = plan_release(
            analysis,
            layout,
            context_tokens=options.get("context_tokens"),
            concurrency=options.get("concurrency"),
            dtype=options.get("dtype"),
            release=release,
            catalog=catalog,
            kv_dtype=options.get("kv_dtype"),
            input_tokens=options.get("input_tokens"),
            output_tokens=options.get("output_tokens"),
            engine=engine,
            fit=fit,
        )
    except NoFittingPlan as err:
        ctx.log(f"nothing fits {layout.devices} x {layout.accelerator}")
        raise StageFailed(
            str(err),
            result=no_fit_result(err, analysis, layout, catalog, options, release=release),
        ) from err
    except (PlanInputError, CatalogError) as err:
        raise StageFailed(str(err)) from err
    result = plan.to_dict()
    result["catalog_version"] = catalog.version
    predicted = result["predicted"]
    predicted["calibrated"] = calibrated_predictions(predicted, calibration)
    device = result.get("measured_device")
    if device:
        # The figures a cpu plan predicted on: measured by the pool's performance runs.
        result["notes"].append(
            f"cpu memory bandwidth {fmt.gb_per_s(device['memory_bandwidth_bytes_per_s'])} and "
            f"BF16 FLOP/s {fmt.tflops(device['dense_bf16_flops'])} are measured"
            + (" on a busy host (the pool has no quiet probe yet)" if device["host_busy"] else "")
            + f", not a datasheet's: {device['source']}"
        )
    speed = ""
    if predicted.get("available"):
        speed = (
            f", predicted {predicted['batch_1']['decode_tokens_per_s']:,.1f} tokens/s at batch 1"
        )
        if layout.accelerator == "cpu":
            speed += " (on the bandwidth and FLOP/s measured by a performance run" + (
                " on a busy host)" if device and device["host_busy"] else ")"
            )
    calibrated = predicted["calibrated"]
    if calibrated["available"]:
        speed += (
            f"; calibrated prediction {calibrated['batch_1']['decode_tokens_per_s']:,.2f} "
            f"tokens/s (decode factor {calibrated['decode_factor']:.3f}, "
            f"{fmt.counted(calibrated['runs'], 'run')})"
        )
    else:
        speed += f"; {calibrated['reason']}"
    ctx.log(
        f"{layout.accelerator}: TP{result['tp']} PP{result['pp']} EP{result['ep']} "
        f"DP{result['dp']} on {fmt.counted(result['devices'], 'device')}{speed}"
    )
    return result
