"""What the performance panel shows beside the twin's measurements: the planner's prediction
for the full-size model, the run's calibration (the twin measured against the roofline's
prediction for it on the same device) and the full-size prediction that calibration corrects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adaptation.presenters.plan_figures import Split
from engine.formatting import finite
from engine.stages.plan.predicted import StoredFit, stored_fit
from engine.stored import as_mapping


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


def full_size_prediction(result: Mapping[str, Any]) -> FullSizePrediction | None:
    info = as_mapping(result.get("predicted"))
    if not info:
        return None
    if not info.get("available"):
        return FullSizePrediction(available=False, reason=str(info.get("reason") or ""))
    split = as_mapping(info.get("split"))
    return FullSizePrediction(
        available=True,
        accelerator=info.get("accelerator"),
        split=Split.of(split),
        devices=split.get("devices"),
        dtype=str(info.get("dtype_label") or info.get("dtype") or ""),
        context_tokens=finite(info.get("context_tokens")),
        fit=stored_fit(info.get("fit")),
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


def twin_calibration(result: Mapping[str, Any]) -> TwinCalibration | None:
    cal = as_mapping(result.get("calibration"))
    if not cal:
        return None
    if not cal.get("available"):
        return TwinCalibration(available=False, reason=str(cal.get("reason") or ""))
    return TwinCalibration(
        available=True,
        decode_median=finite(cal.get("decode_efficiency_median")),
        prefill_median=finite(cal.get("prefill_efficiency_median")),
        by_dtype=[
            (
                str(dtype),
                finite(as_mapping(d).get("decode_efficiency_median")),
                as_mapping(d).get("points"),
            )
            for dtype, d in as_mapping(cal.get("by_dtype")).items()
        ],
        figures=as_mapping(cal.get("figures")),
        basis=str(cal.get("basis") or ""),
        probe_errors=int(finite(cal.get("probe_errors")) or 0),
        probe_error=str(cal.get("probe_error") or ""),
    )


def calibrated_full_size(result: Mapping[str, Any]) -> CalibratedFullSize | None:
    calibrated = as_mapping(as_mapping(result.get("predicted")).get("calibrated"))
    if not calibrated:
        return None
    if not calibrated.get("available"):
        return CalibratedFullSize(available=False, reason=str(calibrated.get("reason") or ""))
    factors = [
        (what, value)
        for what, value in (
            ("decode", finite(calibrated.get("decode_factor"))),
            ("prefill", finite(calibrated.get("prefill_factor"))),
        )
        if value is not None
    ]
    return CalibratedFullSize(
        available=True,
        factors=factors,  # type: ignore[arg-type]
        runs=calibrated.get("runs"),
        notes=[str(calibrated[k]) for k in ("basis", "caveat", "warning") if calibrated.get(k)],
    )
