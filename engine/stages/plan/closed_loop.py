"""The closed loop: a pool's full-size sweeps measured on its engine refit the pool's constants.

The serve stage measures the full-size model with dummy weights on the pool's engine
(`engine/stages/serve/full_size.py`) and keeps, beside each measured level, what the plan
predicted for it before the measurement (`predicted_sweep`). The pool's newest such
measurements (`MeasuredSweep`, gathered by `adaptation.selectors.full_size`) become
observations of the step-time model: output tokens/s and median TPOT at each concurrency,
with the release's own shape, split, dtype and input/output lengths. `pool_fit_from` fits
the pool's constants on them (`fits.pool_fit`, starting from the published fit), and the
next plan on the pool predicts with that fit, which names the pool, the points and the
residual.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine.catalog import Catalog

from .errors import NoFittingPlan, PlanInputError
from .fits import Fit, Observation, pool_fit
from .layout import PoolLayout
from .predictor import FullSizePredictor
from .split_notation import parse_split
from .step_time import Efficiency
from .workload import split_predictor

# A level whose requests did not all finish (cut by the time budget, errors) says little of
# the steady state: left out.
MIN_COMPLETED_SHARE = 1.0
MAX_SWEEPS = 10  # the newest measured sweeps a pool's fit reads


@dataclass(frozen=True)
class MeasuredSweep:
    """One full-size sweep as the selector hands it over: the release's `analysis`, the
    `split` it ran at ("TP1 PP1 EP1 DP1"), its `dtype`, KV dtype and `engine`, and its
    `workloads` ([{"input_tokens", "output_tokens", "sweep": [points of the serve stage's
    sweep: "concurrency", "completed", "requests", "output_tokens_per_s", "tpot_s_p50"]}])."""

    analysis: Mapping[str, Any]
    split: str
    dtype: str
    kv_dtype: str
    engine: str
    workloads: Sequence[Mapping[str, Any]]
    stage_run: int | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeasuredSweep:
        """Read one record of `adaptation.selectors.full_size` (KeyError/TypeError on a
        malformed one)."""
        return cls(
            analysis=data["analysis"],
            split=str(data["split"]),
            dtype=str(data.get("dtype") or "checkpoint"),
            kv_dtype=str(data.get("kv_dtype") or "bfloat16"),
            engine=str(data.get("engine") or "vllm"),
            workloads=list(data["workloads"]),
            stage_run=data.get("stage_run"),
        )


def _finished(point: Mapping[str, Any]) -> bool:
    requests = point.get("requests") or 0
    completed = point.get("completed") or 0
    return requests > 0 and completed >= MIN_COMPLETED_SHARE * requests


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value > 0 else None


def observations(sweep: MeasuredSweep, layout: PoolLayout, catalog: Catalog) -> list[Observation]:
    """Output tokens/s and median TPOT of every finished level of `sweep`, as observations
    of the step-time model on the pool. Raises `PlanInputError`/`NoFittingPlan` when the
    sweep's split cannot be planned on the layout."""
    split = parse_split(sweep.split)
    if split.devices > layout.devices:
        raise PlanInputError(
            f"{split.label()} ran on more devices than the pool's layout has ({layout.devices})"
        )
    found: list[Observation] = []
    for workload in sweep.workloads:
        isl, osl = workload.get("input_tokens"), workload.get("output_tokens")
        if not (isinstance(isl, int) and isinstance(osl, int) and isl > 0 and osl > 0):
            continue
        base = split_predictor(
            sweep.analysis,
            layout,
            split,
            input_tokens=isl,
            output_tokens=osl,
            dtype=sweep.dtype,
            kv_dtype=sweep.kv_dtype,
            engine=sweep.engine,
            catalog=catalog,
        )
        for point in workload.get("sweep") or []:
            concurrency = point.get("concurrency")
            if not (isinstance(concurrency, int) and concurrency > 0 and _finished(point)):
                continue
            for metric, key, latency in (
                ("output_tokens_per_s", "output_tokens_per_s", False),
                ("tpot_s", "tpot_s_p50", True),
            ):
                measured = _positive(point.get(key))
                if measured is None:
                    continue
                found.append(
                    Observation(_predict(base, concurrency, metric), measured, latency=latency)
                )
    return found


def _predict(base: FullSizePredictor, concurrency: int, metric: str):
    def predict(efficiency: Efficiency) -> float:
        predictor = replace(base, fit=replace(base.fit, efficiency=efficiency))
        return predictor.workload(concurrency)[metric]

    return predict


def pool_fit_from(
    records: Sequence[Mapping[str, Any]],
    *,
    pool: str,
    layout: PoolLayout,
    catalog: Catalog,
    engine: str,
) -> tuple[Fit | None, list[str]]:
    """The pool's own fit from its measured full-size sweeps (None without a usable point),
    and why any record was left out."""
    found: list[Observation] = []
    left_out: list[str] = []
    for data in list(records)[:MAX_SWEEPS]:
        try:
            sweep = MeasuredSweep.from_dict(data)
            if sweep.engine != engine:
                continue
            found.extend(observations(sweep, layout, catalog))
        except (KeyError, TypeError, ValueError, PlanInputError, NoFittingPlan) as err:
            left_out.append(f"stage run {data.get('stage_run', '?')}: {err}")
    if not found:
        return None, left_out
    return pool_fit(pool, layout.accelerator, engine, found), left_out


def fit_from_dict(data: Mapping[str, Any]) -> Fit:
    """A `Fit` back from `Fit.to_dict()` (a stored plan's "predicted"["fit"])."""
    constants = data["constants"]
    return Fit(
        accelerator=str(data["accelerator"]),
        engine=str(data["engine"]),
        efficiency=Efficiency(
            bandwidth=float(constants["bandwidth_efficiency"]),
            flops=float(constants["flops_efficiency"]),
            step_s=float(constants["step_overhead_s"]),
            layer_s=float(constants["layer_overhead_s"]),
            moe=float(constants.get("moe_efficiency", 1.0)),
        ),
        points=int(data.get("points") or 0),
        residual=data.get("residual"),
        scope=str(data.get("scope") or "prior"),
        source=str(data.get("source") or ""),
    )


def predicted_sweep(
    analysis: Mapping[str, Any],
    layout: PoolLayout,
    *,
    split: str,
    dtype: str,
    kv_dtype: str,
    engine: str,
    fit: Fit,
    input_tokens: int,
    output_tokens: int,
    concurrencies: Sequence[int],
    catalog: Catalog,
) -> list[dict[str, Any]]:
    """What the plan's fit predicts, before the measurement, for each level of a full-size
    sweep: [{"kind": "predicted", "concurrency", "output_tokens_per_s", "ttft_s", "tpot_s",
    "e2e_s", "batch"}]. Raises `PlanInputError`/`NoFittingPlan` as `split_predictor`."""
    predictor = split_predictor(
        analysis,
        layout,
        parse_split(split),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        dtype=dtype,
        kv_dtype=kv_dtype,
        engine=engine,
        catalog=catalog,
        fit=fit,
    )
    points = []
    for concurrency in concurrencies:
        point = predictor.workload(concurrency)
        points.append(
            {
                "kind": "predicted",
                "concurrency": concurrency,
                "batch": point["batch"],
                "output_tokens_per_s": point["output_tokens_per_s"],
                "ttft_s": point["ttft_s"],
                "tpot_s": point["tpot_s"],
                "e2e_s": point["e2e_s"],
            }
        )
    return points
