"""`predict_workload`: a served workload predicted for the full-size model, on the CLI's and
the API's terms (`manage.py plan ... --input-len --output-len --concurrency`).

It answers what a team plans with: output and input tokens/s of all devices and per device,
the median TTFT, TPOT and end-to-end latency a user sees at that load, the batch the engine
decodes at once, and the fit that produced the figures (`fits.py`). The steady state is
`steady_state.solve`; one step's time is `step_time.Device.step`. Predictions, labelled so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.catalog import Catalog, load_catalog

from .errors import NoFittingPlan, PlanInputError
from .fits import PRIOR, Fit
from .layout import PoolLayout
from .planner import evaluate_split, plan_release
from .predictor import FullSizePredictor
from .steady_state import EngineLimits, Workload
from .validity import Split


@dataclass(frozen=True)
class WorkloadPrediction:
    """Predicted figures of one workload on one split (tokens/s, seconds, sequences)."""

    workload: Workload
    split: Split
    devices: int
    dtype: str
    kv_dtype: str
    fit: Fit
    concurrency: int
    batch: float
    output_tokens_per_s: float | None
    input_tokens_per_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    kv_capacity_sequences: int
    limits: EngineLimits
    step: dict[str, float] = field(default_factory=dict)
    bound_by: str = ""

    def to_dict(self) -> dict[str, Any]:
        w = self.workload
        per_device = (
            None if self.output_tokens_per_s is None else self.output_tokens_per_s / self.devices
        )
        in_per_device = (
            None if self.input_tokens_per_s is None else self.input_tokens_per_s / self.devices
        )
        return {
            "kind": "predicted",
            "model": "full-size",
            "input_tokens": w.input_tokens,
            "output_tokens": w.output_tokens,
            "phase": w.phase,
            "concurrency": self.concurrency,
            "concurrency_requested": "max" if w.concurrency is None else w.concurrency,
            "split": self.split.label(),
            "devices": self.devices,
            "dtype": self.dtype,
            "kv_dtype": self.kv_dtype,
            "batch": round(self.batch, 2),
            "batch_bound_by": self.bound_by,
            "kv_capacity_sequences": self.kv_capacity_sequences,
            "output_tokens_per_s": self.output_tokens_per_s,
            "input_tokens_per_s": self.input_tokens_per_s,
            "output_tokens_per_s_per_device": per_device,
            "input_tokens_per_s_per_device": in_per_device,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "e2e_s": self.e2e_s,
            "step": dict(self.step),
            "engine_limits": {
                "max_running_sequences": self.limits.max_running_sequences,
                "max_batched_tokens": self.limits.max_batched_tokens,
                "source": self.limits.source,
            },
            "fit": self.fit.to_dict(),
        }


def split_predictor(
    analysis: Mapping[str, Any],
    layout: PoolLayout,
    split: Split,
    *,
    input_tokens: int,
    output_tokens: int,
    dtype: str | None,
    kv_dtype: str | None,
    engine: str,
    catalog: Catalog | None = None,
    fit: Fit | None = None,
) -> FullSizePredictor:
    """The predictor of `split` sized for a workload of `input_tokens` + `output_tokens`
    (the planner's `evaluate_split`), for predictions under constants to fit: replace its
    fit's efficiency and call `.workload(concurrency)`. Raises `PlanInputError` for unusable
    input and `NoFittingPlan` when the split is invalid or does not fit its devices."""
    candidate = evaluate_split(
        analysis,
        layout,
        split,
        context_tokens=input_tokens + output_tokens,
        concurrency=1,
        dtype=None if dtype == "checkpoint" else dtype,
        catalog=catalog,
        kv_dtype=kv_dtype,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        engine=engine,
        fit=fit or Fit(layout.accelerator, engine, PRIOR, 0, None, "prior", "to be fitted"),
    )
    if not candidate.validity.valid:
        raise NoFittingPlan(
            f"{split.label()} is not a valid split: " + "; ".join(candidate.validity.reasons)
        )
    if candidate.predictor is None:
        memory = candidate.memory
        raise NoFittingPlan(
            f"{split.label()} on {split.devices} x {layout.accelerator} does not fit at "
            f"{dtype or 'checkpoint'}: needs {memory.used / 2**30:.0f} GiB a device of "
            f"{memory.budget / 2**30:.0f}"
        )
    return candidate.predictor


def predict_workload(
    analysis: Mapping[str, Any],
    layout: PoolLayout,
    workload: Workload,
    *,
    split: Split | None = None,
    dtype: str | None = None,
    kv_dtype: str | None = None,
    engine: str | None = None,
    catalog: Catalog | None = None,
    fit: Fit | None = None,
) -> WorkloadPrediction:
    """Predict `workload` served on `layout` (module docstring).

    `analysis` is `analyze_config(config).to_dict()`; `split` defaults to the plan's choice
    for the workload (`plan_release` at a context of input + output tokens); `dtype` as the
    planner reads it ("checkpoint" by default); `kv_dtype` None/"auto" keeps a 16-bit KV
    cache, "fp8" halves it; `engine` ("vllm" by default, "sglang", "tensorrt-llm") picks the
    engine's batching limits and its fitted constants, unless `fit` is given (a pool's own,
    `fits.pool_fit`). Raises `PlanInputError` for unusable input and `NoFittingPlan` when
    the split does not fit the devices' memory or leaves no KV room.
    """
    workload.check()
    if not isinstance(layout, PoolLayout):
        raise PlanInputError(f"layout must be a PoolLayout, got {type(layout).__name__}")
    catalog = catalog or load_catalog()
    options = {
        "context_tokens": workload.input_tokens + workload.output_tokens,
        "concurrency": 1,
        "dtype": dtype,
        "catalog": catalog,
        "kv_dtype": kv_dtype,
        "input_tokens": workload.input_tokens,
        "output_tokens": workload.output_tokens,
        "engine": engine,
        "fit": fit,
    }
    if split is None:
        predictor = plan_release(analysis, layout, **options).chosen.predictor
    else:
        if split.devices > layout.devices:
            raise PlanInputError(
                f"the split {split.label()} uses {split.devices:,} devices; the pool has "
                f"{layout.devices:,}"
            )
        predictor = evaluate_split(analysis, layout, split, **options).predictor
        if predictor is None:
            predictor = split_predictor(
                analysis,
                layout,
                split,
                input_tokens=workload.input_tokens,
                output_tokens=workload.output_tokens,
                dtype=dtype,
                kv_dtype=kv_dtype,
                engine=engine or "vllm",
                catalog=catalog,
            )  # raises NoFittingPlan saying why
    if predictor is None or not predictor.available:
        reason = predictor.unavailable_reason() if predictor else "no prediction"
        raise PlanInputError(reason)
    point = predictor.workload(workload.concurrency, workload.phase)
    return WorkloadPrediction(
        workload=workload,
        split=predictor.split,
        devices=predictor.split.devices,
        dtype=predictor.dtype,
        kv_dtype=predictor.kv_dtype,
        fit=predictor.fit,
        concurrency=point["concurrency"],
        batch=point["batch"],
        output_tokens_per_s=point["output_tokens_per_s"],
        input_tokens_per_s=point["input_tokens_per_s"],
        ttft_s=point["ttft_s"],
        tpot_s=point["tpot_s"],
        e2e_s=point["e2e_s"],
        kv_capacity_sequences=point["kv_capacity_sequences"],
        limits=predictor.limits,
        step=point["step"],
        bound_by=point["batch_bound_by"],
    )


__all__ = ["Workload", "WorkloadPrediction", "predict_workload", "split_predictor"]
