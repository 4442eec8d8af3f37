"""What the performance panel shows beside the twin's measurements: the planner's prediction
for the full-size model, the run's calibration (the twin measured against the roofline's
prediction for it on the same device) and the full-size prediction that calibration corrects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.stages.performance.result import PerformanceResult
from engine.stages.plan.result import Split, StoredFit


@dataclass(frozen=True)
class FullSizePrediction:
    """What the planner predicted for the full-size model beside the twin's measurements: on
    which accelerator, split and dtype, decode at what context (tokens), with the fit its
    step-time model used, or why it made none (`available` False)."""

    available: bool
    reason: str = ""
    accelerator: Any = None
    split: Split | None = None
    devices: Any = None
    dtype: str = ""
    context_tokens: float | None = None
    fit: StoredFit | None = None


def full_size_prediction(result: PerformanceResult) -> FullSizePrediction | None:
    info = result.predicted
    if info is None:
        return None
    if not info.available:
        return FullSizePrediction(available=False, reason=info.reason)
    return FullSizePrediction(
        available=True,
        accelerator=info.accelerator,
        split=Split.from_stored(info.split),
        devices=info.split.get("devices"),
        dtype=info.dtype_label or info.dtype or "",
        context_tokens=info.context_tokens,
        fit=info.fit,
    )


@dataclass(frozen=True)
class TwinCalibration:
    """The run's calibration: the twin measured against the roofline's prediction for it on
    the same device (medians as fractions, per dtype (dtype, median, points)), the roofline
    figures used (kind, name, source), the basis, and the points left out as probe errors
    (above the roofline: their count and why); `available` False with its reason."""

    available: bool
    reason: str = ""
    decode_median: float | None = None
    prefill_median: float | None = None
    by_dtype: list[tuple[str, float | None, Any]] = field(default_factory=list)
    figures: Mapping[str, Any] = field(default_factory=dict)
    basis: str = ""
    # Points whose efficiency was above the roofline: a probe error, left out of the medians.
    probe_errors: int = 0
    probe_error: str = ""


@dataclass(frozen=True)
class CalibratedFullSize:
    """The full-size prediction corrected by the pool's running calibration: its factors
    ((what, factor) pairs), the runs it rests on and its basis, caveat and warning, or why
    there is none (`available` False)."""

    available: bool
    reason: str = ""
    factors: list[tuple[str, float]] = field(default_factory=list)
    runs: Any = None
    notes: list[str] = field(default_factory=list)


def twin_calibration(result: PerformanceResult) -> TwinCalibration | None:
    cal = result.calibration
    if cal is None:
        return None
    if not cal.available:
        return TwinCalibration(available=False, reason=cal.reason)
    return TwinCalibration(
        available=True,
        decode_median=cal.decode_efficiency_median,
        prefill_median=cal.prefill_efficiency_median,
        by_dtype=[(d.dtype, d.decode_efficiency_median, d.points) for d in cal.by_dtype],
        figures=cal.figures,
        basis=cal.basis,
        probe_errors=cal.probe_errors,
        probe_error=cal.probe_error,
    )


def calibrated_full_size(result: PerformanceResult) -> CalibratedFullSize | None:
    calibrated = result.predicted.calibrated if result.predicted is not None else None
    if calibrated is None:
        return None
    if not calibrated.available:
        return CalibratedFullSize(available=False, reason=calibrated.reason)
    return CalibratedFullSize(
        available=True, factors=calibrated.factors, runs=calibrated.runs, notes=calibrated.notes
    )
