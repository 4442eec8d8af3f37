"""The plan result's full-size prediction read back: the fit it names and its predicted served
workload (`predicted.fit`, `predicted.workload`; docs/stages/plan.md, "Full-size
predictions"), for every page, note and report that shows them.

A stored result is read tolerantly (`engine.stored`): a field of the wrong shape reads as
empty. Times are seconds, throughput tokens/s. Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.formatting import finite
from engine.stored import as_count, as_list, as_mapping, text, whole_number

# The scopes `refit.py` writes for fits of published serving results (one accelerator and
# engine, the engine over every accelerator, or every row); `fits.pool_fit` writes "pool",
# `fits.fit_for` "prior".
PUBLISHED_SCOPES = ("accelerator+engine", "engine", "all")


@dataclass(frozen=True)
class StoredFit:
    """The fit a full-size prediction names (`fits.Fit.to_dict`): the accelerator and engine
    it was fitted for ("*": every one), its `scope` as stored, the points it was fitted on,
    its residual (the geometric-mean error factor on them, 1.0 exact; None for a prior) and
    its source."""

    accelerator: str
    engine: str
    scope: str
    points: int | None
    residual: float | None
    source: str

    @property
    def basis(self) -> str:
        """What the fit rests on: "pool" (the pool's own full-size sweeps), "published"
        (published serving results) or "prior" (no data: the literature's prior)."""
        if self.scope == "pool":
            return "pool"
        return "published" if self.scope in PUBLISHED_SCOPES else "prior"

    def to_dict(self) -> dict[str, Any]:
        """{"accelerator", "engine", "scope", "basis", "points", "residual", "source"}."""
        return {
            "accelerator": self.accelerator,
            "engine": self.engine,
            "scope": self.scope,
            "basis": self.basis,
            "points": self.points,
            "residual": self.residual,
            "source": self.source,
        }


def stored_fit(value: Any) -> StoredFit | None:
    """A stored fit (`predicted.fit`, `full_size.predicted_before.fit`), None without one."""
    fit = as_mapping(value)
    if not fit:
        return None
    return StoredFit(
        accelerator=text(fit.get("accelerator")),
        engine=text(fit.get("engine")),
        scope=text(fit.get("scope")),
        points=whole_number(fit.get("points")),
        residual=finite(fit.get("residual")),
        source=text(fit.get("source")),
    )


@dataclass(frozen=True)
class PredictedPoint:
    """One predicted load of a served workload (`predictor.py` `workload`): requests in
    flight, sequences decoded at once, output tokens/s over every device (and per device,
    where the plan gives it), TTFT, TPOT and end-to-end (s)."""

    concurrency: int | float | None
    batch: float | None
    output_tokens_per_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    output_tokens_per_s_per_device: float | None = None


def predicted_point(value: Any) -> PredictedPoint:
    """A stored predicted point ({"concurrency", "batch", "output_tokens_per_s", "ttft_s",
    "tpot_s", "e2e_s", "output_tokens_per_s_per_device"}); a missing figure reads None."""
    point = as_mapping(value)
    return PredictedPoint(
        concurrency=as_count(point.get("concurrency")),
        batch=finite(point.get("batch")),
        output_tokens_per_s=finite(point.get("output_tokens_per_s")),
        ttft_s=finite(point.get("ttft_s")),
        tpot_s=finite(point.get("tpot_s")),
        e2e_s=finite(point.get("e2e_s")),
        output_tokens_per_s_per_device=finite(point.get("output_tokens_per_s_per_device")),
    )


def predicted_points(value: Any) -> list[PredictedPoint]:
    """A stored curve's points, those without a concurrency left out."""
    points = [predicted_point(p) for p in as_list(value)]
    return [p for p in points if p.concurrency is not None]


@dataclass(frozen=True)
class PlanPool:
    """One pool of a disaggregated deployment as the plan predicts it: requests in flight,
    tokens/s of its phase (input for prefill, output for decode) and its latency (TTFT for
    prefill, TPOT for decode; s)."""

    concurrency: int | float | None
    tokens_per_s: float | None
    latency_s: float | None


@dataclass(frozen=True)
class PlanWorkload:
    """The plan's predicted served workload (`predicted.workload`): the lengths, KV dtype and
    engine it was predicted for, the throughput-optimal load (`max_load`, with what bounds
    its batch: "kv_cache", "engine" (its running cap) or "concurrency", and the KV cache's
    sequences), the curve from concurrency 1 to it, the prefill and decode pools, and the
    fit it names."""

    input_tokens: int | None
    output_tokens: int | None
    kv_dtype: str
    engine: str
    max_load: PredictedPoint | None
    bound_by: str
    kv_capacity_sequences: int | None
    curve: list[PredictedPoint]
    prefill_pool: PlanPool | None
    decode_pool: PlanPool | None
    fit: StoredFit | None


def _pool(value: Mapping[str, Any], tokens_key: str, latency_key: str) -> PlanPool | None:
    if not value:
        return None
    return PlanPool(
        concurrency=as_count(value.get("concurrency")),
        tokens_per_s=finite(value.get(tokens_key)),
        latency_s=finite(value.get(latency_key)),
    )


def plan_workload(plan_result: Mapping[str, Any] | None) -> PlanWorkload | None:
    """The plan's predicted workload, None when the plan predicted none (an older plan, or
    one without a prediction: its `predicted.reason` says why)."""
    predicted = as_mapping(as_mapping(plan_result).get("predicted"))
    workload = as_mapping(predicted.get("workload"))
    if not predicted.get("available") or not workload:
        return None
    best = as_mapping(workload.get("max_load"))
    return PlanWorkload(
        input_tokens=whole_number(workload.get("input_tokens")),
        output_tokens=whole_number(workload.get("output_tokens")),
        kv_dtype=text(workload.get("kv_dtype")),
        engine=text(workload.get("engine")),
        max_load=predicted_point(best) if best else None,
        bound_by=text(best.get("batch_bound_by")),
        kv_capacity_sequences=whole_number(best.get("kv_capacity_sequences")),
        curve=predicted_points(workload.get("curve")),
        prefill_pool=_pool(
            as_mapping(workload.get("prefill_pool")), "input_tokens_per_s", "ttft_s"
        ),
        decode_pool=_pool(as_mapping(workload.get("decode_pool")), "output_tokens_per_s", "tpot_s"),
        fit=stored_fit(predicted.get("fit")),
    )
