"""The performance stage's result, typed: what `run.measure_performance` writes, read back from
a stored row of any version, and every judgement made of it.

The findings, the release notes, the release page's panel and its charts, the compare page,
the rows a job stores and the regression figures read a stored row through
`PerformanceResult.from_stored` and ask it: which knee stands for the run and the point it
sits on, which stops ran out of memory and which ran out of time (`SweepStop.cause`), which
errors are the twin's and which the host's (`SweepError.host_out_of_time`), which model was
measured, the plan's prediction at a batch.

Reading is tolerant: a key an older version did not write, or a value of the wrong type,
reads as None (or empty); reading never raises. Times are seconds, throughput tokens/s,
memory bytes, efficiencies ratios. Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.formatting import finite
from engine.stages.performance.budget import TIME_BUDGET
from engine.stages.performance.rows import calibration_rows, performance_rows
from engine.stages.plan.result import StoredFit
from engine.stored import (
    as_count,
    as_list,
    as_mapping,
    mapping_or_none,
    mappings,
    reasons_by_name,
    string,
    strings,
    whole_number,
)

OUT_OF_MEMORY = "out of memory"
# How an earlier run's error read when Celery's soft time limit ended the stage mid-point
# (before the sweep had a time budget): a host out of time, not the twin failing.
TIME_LIMIT_ERROR = "SoftTimeLimitExceeded"


# A point's figures (s, tokens/s, ratios): floats, or None.
_POINT_FIGURES = (
    "ttft_s",
    "ttft_p95_s",
    "tpot_s",
    "tpot_p95_s",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "calibrated_ttft_s",
    "calibrated_tpot_s",
    "calibrated_prefill_tokens_per_s",
    "calibrated_decode_tokens_per_s",
    "decode_efficiency",
    "prefill_efficiency",
)
# Its memory readings (bytes) and the tokens a decode prediction read: ints when whole.
_POINT_COUNTS = (
    "peak_memory_bytes",
    "peak_memory_increase_bytes",
    "memory_before_bytes",
    "context_tokens",
)


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: measured on the twin ("measured", model "twin", or "release" at
    full size on real weights) or predicted (model "full-size": the plan's step-time model;
    "twin": the calibration's roofline for the twin), in `dtype` at `batch_size` sequences of
    `prompt_len` tokens (None for a full-size decode prediction, which reads
    `context_tokens`). TTFT and TPOT median and p95 (s), prefill and decode tokens/s, peak
    memory and what the point added (bytes, read as `memory_kind`), the timed samples; a
    full-size prediction's `calibrated_*` figures, a calibration point's efficiencies
    (measured / predicted)."""

    kind: str | None = None
    model: str | None = None
    dtype: str | None = None
    batch_size: int | None = None
    prompt_len: int | None = None
    context_tokens: int | float | None = None
    ttft_s: float | None = None
    ttft_p95_s: float | None = None
    tpot_s: float | None = None
    tpot_p95_s: float | None = None
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    peak_memory_bytes: int | float | None = None
    peak_memory_increase_bytes: int | float | None = None
    memory_before_bytes: int | float | None = None
    memory_kind: str | None = None
    prefill_samples: int | None = None
    decode_samples: int | None = None
    calibrated_ttft_s: float | None = None
    calibrated_tpot_s: float | None = None
    calibrated_prefill_tokens_per_s: float | None = None
    calibrated_decode_tokens_per_s: float | None = None
    decode_efficiency: float | None = None
    prefill_efficiency: float | None = None

    @classmethod
    def from_stored(cls, point: Mapping[str, Any]) -> SweepPoint:
        return cls(
            kind=string(point.get("kind")),
            model=string(point.get("model")),
            dtype=string(point.get("dtype")),
            batch_size=whole_number(point.get("batch_size")),
            prompt_len=whole_number(point.get("prompt_len")),
            memory_kind=string(point.get("memory_kind")),
            prefill_samples=whole_number(point.get("prefill_samples")),
            decode_samples=whole_number(point.get("decode_samples")),
            **{key: finite(point.get(key)) for key in _POINT_FIGURES},
            **{key: as_count(point.get(key)) for key in _POINT_COUNTS},
        )

    def to_dict(self) -> dict[str, Any]:
        """The point's fields by their stored names (None where it has no figure)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @property
    def measured(self) -> bool:
        return self.kind == "measured"

    @property
    def full_size_decode(self) -> bool:
        """A full-size decode prediction with a TPOT: batch sequences at a full context."""
        return self.kind == "predicted" and self.prompt_len is None and self.tpot_s is not None


@dataclass(frozen=True)
class Knee:
    """A measured curve's recommended batch (`knee.find_knee`): the smallest batch from which
    decode tokens/s grows less than the rule asks per doubling (`found`), else the largest
    batch measured; its TPOT median and p95 (s) and decode tokens/s, the growth to twice it
    (a fraction; None when not found) and why, for `dtype` at `prompt_len`."""

    dtype: str = ""
    prompt_len: int | None = None
    batch_size: int | None = None
    tpot_s: float | None = None
    tpot_p95_s: float | None = None
    decode_tokens_per_s: float | None = None
    found: bool = False
    growth_at_knee: float | None = None
    reason: str = ""

    @classmethod
    def from_stored(cls, value: Any) -> Knee | None:
        """The knee in a stored mapping; None for anything else."""
        if not isinstance(value, Mapping):
            return None
        return cls(
            dtype=string(value.get("dtype")) or "",
            prompt_len=whole_number(value.get("prompt_len")),
            batch_size=whole_number(value.get("batch_size")),
            tpot_s=finite(value.get("tpot_s")),
            tpot_p95_s=finite(value.get("tpot_p95_s")),
            decode_tokens_per_s=finite(value.get("decode_tokens_per_s")),
            found=value.get("found") is True,
            growth_at_knee=finite(value.get("growth_at_knee")),
            reason=string(value.get("reason")) or "",
        )

    @property
    def tokens_per_s(self) -> float | None:
        """Decode tokens/s at the knee (`decode_tokens_per_s`), as the panel's table says it."""
        return self.decode_tokens_per_s


@dataclass(frozen=True)
class SweepStop:
    """Where the sweep of `dtype` at `prompt_len` stopped: at `batch_size`, and why."""

    dtype: str | None = None
    prompt_len: int | None = None
    batch_size: int | None = None
    reason: str = ""
    stored_cause: str | None = None

    @classmethod
    def from_stored(cls, stop: Mapping[str, Any]) -> SweepStop:
        return cls(
            dtype=string(stop.get("dtype")),
            prompt_len=whole_number(stop.get("prompt_len")),
            batch_size=whole_number(stop.get("batch_size")),
            reason=string(stop.get("reason")) or "",
            stored_cause=string(stop.get("cause")),
        )

    @property
    def cause(self) -> str:
        """`OUT_OF_MEMORY` or `TIME_BUDGET` (`budget.py`): the stop's own "cause", else
        (a row from before stops named it) what its reason says."""
        if self.stored_cause:
            return self.stored_cause
        return TIME_BUDGET if TIME_BUDGET in self.reason else OUT_OF_MEMORY

    @property
    def by_time_budget(self) -> bool:
        """The host ran out of the stage's time: this says nothing about the release."""
        return self.cause == TIME_BUDGET


@dataclass(frozen=True)
class SweepError:
    """What the twin raised at `batch_size` in `dtype` at `prompt_len` (`error`, one line)."""

    dtype: str | None = None
    prompt_len: int | None = None
    batch_size: int | None = None
    error: str = ""

    @classmethod
    def from_stored(cls, error: Mapping[str, Any]) -> SweepError:
        return cls(
            dtype=string(error.get("dtype")),
            prompt_len=whole_number(error.get("prompt_len")),
            batch_size=whole_number(error.get("batch_size")),
            error=string(error.get("error")) or "",
        )

    @property
    def host_out_of_time(self) -> bool:
        """Celery's soft time limit caught mid-point (a run from before the sweep's time
        budget): the host ran out of time, not the twin failing."""
        return TIME_LIMIT_ERROR in self.error


@dataclass(frozen=True)
class SweepOptions:
    """The sweep as the run read its options: batches 1 to `max_batch_size` (powers of two),
    the prompt lengths, the timed decode steps and prefill runs after their warm-ups, the
    dtypes asked for (empty: the pool's) and the knee's growth per doubling (a fraction)."""

    max_batch_size: int | None = None
    prompt_lens: tuple[int, ...] = ()
    repeats: int | None = None
    warmup: int | None = None
    prefill_repeats: int | None = None
    prefill_warmup: int | None = None
    dtypes: tuple[str, ...] = ()
    knee_growth: float | None = None

    @classmethod
    def from_stored(cls, value: Any) -> SweepOptions | None:
        """The options in a stored mapping; None when there are none."""
        options = as_mapping(value)
        if not options:
            return None
        lens = (whole_number(n) for n in as_list(options.get("prompt_lens")))
        return cls(
            prompt_lens=tuple(n for n in lens if n is not None),
            dtypes=strings(options.get("dtypes")),
            knee_growth=finite(options.get("knee_growth")),
            **{
                key: whole_number(options.get(key))
                for key in (
                    "max_batch_size",
                    "repeats",
                    "warmup",
                    "prefill_repeats",
                    "prefill_warmup",
                )
            },
        )


@dataclass(frozen=True)
class CalibratedPrediction:
    """What the pool's running calibration says beside the plan's full-size prediction
    (`plan.calibration.calibrated_predictions`): the twin's decode and prefill factors, the
    runs they rest on, their basis, caveat and warning; or why there is none (`available`
    False, `reason`)."""

    available: bool = False
    reason: str = ""
    label: str = ""
    decode_factor: float | None = None
    prefill_factor: float | None = None
    runs: int | None = None
    basis: str = ""
    caveat: str = ""
    warning: str = ""

    @classmethod
    def from_stored(cls, value: Any) -> CalibratedPrediction | None:
        calibrated = as_mapping(value)
        if not calibrated:
            return None
        return cls(
            available=calibrated.get("available") is True,
            decode_factor=finite(calibrated.get("decode_factor")),
            prefill_factor=finite(calibrated.get("prefill_factor")),
            runs=whole_number(calibrated.get("runs")),
            **{
                key: string(calibrated.get(key)) or ""
                for key in ("reason", "label", "basis", "caveat", "warning")
            },
        )

    @property
    def factors(self) -> list[tuple[str, float]]:
        """("decode", factor) and ("prefill", factor), where each is known."""
        return [
            (what, value)
            for what, value in (("decode", self.decode_factor), ("prefill", self.prefill_factor))
            if value is not None
        ]

    @property
    def notes(self) -> list[str]:
        """Its basis, caveat and warning, those it has, in that order."""
        return [note for note in (self.basis, self.caveat, self.warning) if note]


@dataclass(frozen=True)
class FullSizePredicted:
    """The plan's full-size prediction the run drew beside the twin
    (`predictions.predicted_points`' info): on which accelerator, split ({"tp", "pp", "ep",
    "dp", "devices"}) and dtype, decode at what context (tokens), with the fit its step-time
    model used and the calibration's word on it; or why there is none (`available` False)."""

    available: bool = False
    reason: str = ""
    source: str = ""
    accelerator: str | None = None
    split: Mapping[str, Any] = field(default_factory=dict)
    dtype: str | None = None
    dtype_label: str | None = None
    context_tokens: int | float | None = None
    fit: StoredFit | None = None
    calibrated: CalibratedPrediction | None = None

    @classmethod
    def from_stored(cls, value: Any) -> FullSizePredicted | None:
        info = as_mapping(value)
        if not info:
            return None
        return cls(
            available=info.get("available") is True,
            reason=string(info.get("reason")) or "",
            source=string(info.get("source")) or "",
            accelerator=string(info.get("accelerator")),
            split=dict(as_mapping(info.get("split"))),
            dtype=string(info.get("dtype")),
            dtype_label=string(info.get("dtype_label")),
            context_tokens=as_count(info.get("context_tokens")),
            fit=StoredFit.from_stored(info.get("fit")),
            calibrated=CalibratedPrediction.from_stored(info.get("calibrated")),
        )

    @property
    def dtype_labels(self) -> dict[str, str]:
        """{dtype: its label} where the plan named its dtype by another name ("fp8 (e4m3)")."""
        return {self.dtype: self.dtype_label} if self.dtype and self.dtype_label else {}


@dataclass(frozen=True)
class DtypeEfficiency:
    """One dtype's calibration: its median decode and prefill efficiencies (measured /
    predicted), over how many points, how many of them probe errors."""

    dtype: str
    decode_efficiency_median: float | None = None
    prefill_efficiency_median: float | None = None
    points: int | None = None
    probe_errors: int | None = None


@dataclass(frozen=True)
class TwinCalibration:
    """The twin measured against the roofline's prediction for it on the same device
    (`plan.calibration.twin_calibration`): the device figures probed (`device`, None when
    none was), the predicted twin points with their efficiencies, the medians (overall and
    per dtype), the roofline figures used and the twin's shape, the basis, and the points
    left out as probe errors; or why there is none (`available` False, `reason`)."""

    available: bool = False
    reason: str = ""
    device: Mapping[str, Any] | None = None
    points: tuple[SweepPoint, ...] = ()
    decode_efficiency_median: float | None = None
    prefill_efficiency_median: float | None = None
    by_dtype: tuple[DtypeEfficiency, ...] = ()
    figures: Mapping[str, Any] = field(default_factory=dict)
    basis: str = ""
    twin_shape: Mapping[str, Any] = field(default_factory=dict)
    probe_errors: int = 0
    probe_error: str = ""
    skipped_dtypes: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_stored(cls, value: Any) -> TwinCalibration | None:
        cal = as_mapping(value)
        if not cal:
            return None
        return cls(
            available=cal.get("available") is True,
            reason=string(cal.get("reason")) or "",
            device=mapping_or_none(cal.get("device")),
            points=tuple(SweepPoint.from_stored(p) for p in mappings(cal.get("points"))),
            decode_efficiency_median=finite(cal.get("decode_efficiency_median")),
            prefill_efficiency_median=finite(cal.get("prefill_efficiency_median")),
            by_dtype=tuple(
                DtypeEfficiency(
                    dtype=str(dtype),
                    decode_efficiency_median=finite(d.get("decode_efficiency_median")),
                    prefill_efficiency_median=finite(d.get("prefill_efficiency_median")),
                    points=whole_number(d.get("points")),
                    probe_errors=whole_number(d.get("probe_errors")),
                )
                for dtype, d in as_mapping(cal.get("by_dtype")).items()
                if isinstance(d, Mapping)
            ),
            figures=dict(as_mapping(cal.get("figures"))),
            basis=string(cal.get("basis")) or "",
            twin_shape=dict(as_mapping(cal.get("twin_shape"))),
            probe_errors=whole_number(cal.get("probe_errors")) or 0,
            probe_error=string(cal.get("probe_error")) or "",
            skipped_dtypes=reasons_by_name(cal.get("skipped_dtypes")),
        )

    @property
    def twin_params(self) -> int | None:
        """The twin's parameters as the roofline read its shape."""
        return whole_number(self.twin_shape.get("total_params"))


@dataclass(frozen=True)
class PerformanceResult:
    """A performance run's result (`run.measure_performance` documents each key): its points
    (measured, then predicted), the knee of each measured curve (`knees`), each dtype's
    (`knee_by_dtype`, in the order measured) and the run's (`knee`: the first dtype's), the
    rule, where sweeps stopped and what the twin raised, what was not measured, the plan's
    prediction and the calibration, how it measured (device, backend, memory reading,
    timer, CPU threads, options, twin) and how long it took (s).

    `sweep_recorded`: the row records its sweep's stops and errors (a stage that crashed
    before sweeping has neither)."""

    points: tuple[SweepPoint, ...] = ()
    knee: Knee | None = None
    knees: tuple[Knee, ...] = ()
    knee_by_dtype: Mapping[str, Knee] = field(default_factory=dict)
    knee_rule: str = ""
    stopped: tuple[SweepStop, ...] = ()
    errors: tuple[SweepError, ...] = ()
    skipped_dtypes: Mapping[str, str] = field(default_factory=dict)
    skipped_prompt_lens: tuple[tuple[int | None, str], ...] = ()
    predicted: FullSizePredicted | None = None
    calibration: TwinCalibration | None = None
    device: str | None = None
    backend: str | None = None
    memory_kind: str | None = None
    memory_method: str | None = None
    timer: str | None = None
    threads: int | None = None
    options: SweepOptions | None = None
    twin: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    duration_s: float | None = None
    reason: str = ""
    sweep_recorded: bool = False

    @classmethod
    def from_stored(cls, value: Any) -> PerformanceResult:
        """The result in a stored row (`StageRun.result`), whatever version wrote it; an
        empty result for anything but a mapping. Never raises."""
        result = as_mapping(value)
        by_dtype = {
            str(dtype): knee
            for dtype, stored in as_mapping(result.get("knee_by_dtype")).items()
            if (knee := Knee.from_stored(stored)) is not None
        }
        return cls(
            points=tuple(SweepPoint.from_stored(p) for p in mappings(result.get("points"))),
            knee=Knee.from_stored(result.get("knee")),
            knees=tuple(
                knee
                for stored in as_list(result.get("knees"))
                if (knee := Knee.from_stored(stored)) is not None
            ),
            knee_by_dtype=by_dtype,
            knee_rule=string(result.get("knee_rule")) or "",
            stopped=tuple(SweepStop.from_stored(s) for s in mappings(result.get("stopped"))),
            errors=tuple(SweepError.from_stored(e) for e in mappings(result.get("errors"))),
            skipped_dtypes=reasons_by_name(result.get("skipped_dtypes")),
            skipped_prompt_lens=tuple(
                (whole_number(s.get("prompt_len")), string(s.get("reason")) or "")
                for s in mappings(result.get("skipped_prompt_lens"))
            ),
            predicted=FullSizePredicted.from_stored(result.get("predicted")),
            calibration=TwinCalibration.from_stored(result.get("calibration")),
            device=string(result.get("device")),
            backend=string(result.get("backend")),
            memory_kind=string(result.get("memory_kind")),
            memory_method=string(result.get("memory_method")),
            timer=string(result.get("timer")),
            threads=whole_number(result.get("threads")),
            options=SweepOptions.from_stored(result.get("options")),
            twin=dict(as_mapping(result.get("twin"))),
            notes=strings(result.get("notes")),
            duration_s=finite(result.get("duration_s")),
            reason=string(result.get("reason")) or "",
            sweep_recorded=isinstance(result.get("stopped"), list)
            or isinstance(result.get("errors"), list),
        )

    # --- what was measured --------------------------------------------------------------

    @property
    def measured_points(self) -> list[SweepPoint]:
        return [point for point in self.points if point.measured]

    def knee_point(self) -> SweepPoint | None:
        """The measured point the run's knee sits on (its dtype, prompt length and batch)."""
        knee = self.knee
        if knee is None:
            return None
        return next(
            (
                p
                for p in self.measured_points
                if (p.dtype, p.prompt_len, p.batch_size)
                == (knee.dtype, knee.prompt_len, knee.batch_size)
            ),
            None,
        )

    @property
    def measured_model(self) -> str:
        """What was measured: "twin" (the scaled twin, seeded weights) or "release" (the
        release at full size with its real weights), as the knee's point (else the first
        measured point) says; "twin" when no point says."""
        point = self.knee_point() or next(iter(self.measured_points), None)
        return (point.model if point is not None else None) or "twin"

    @property
    def twin_parameters(self) -> float | None:
        return finite(self.twin.get("parameters"))

    def stored_rows(self) -> list[dict[str, Any]]:
        """The rows a job stores of this run, one metric each (`rows.performance_rows` of its
        points, then `rows.calibration_rows` of its calibration)."""
        calibration = self.calibration
        points = calibration.points if calibration is not None else ()
        return performance_rows([p.to_dict() for p in self.points]) + calibration_rows(
            {"points": [p.to_dict() for p in points]}
        )

    # --- what stopped it ---------------------------------------------------------------

    def out_of_memory_by_dtype(self) -> dict[str, list[SweepStop]]:
        """The stops that ran out of memory, by dtype (as text), in the order stored; stops by
        the time budget are left out (the host ran out of time, not the release)."""
        found: dict[str, list[SweepStop]] = {}
        for stop in self.stopped:
            if not stop.by_time_budget:
                found.setdefault(str(stop.dtype), []).append(stop)
        return found

    def twin_errors_by_dtype(self) -> dict[str, list[SweepError]]:
        """What the twin raised, by dtype (as text); a host out of time is left out."""
        found: dict[str, list[SweepError]] = {}
        for error in self.errors:
            if not error.host_out_of_time:
                found.setdefault(str(error.dtype), []).append(error)
        return found

    # --- the plan's prediction beside it ----------------------------------------------

    def predicted_decode_at(self, batch: int) -> SweepPoint | None:
        """The plan's full-size decode prediction at `batch` sequences: the largest predicted
        batch at or below it, None when there is none."""
        below = [
            p
            for p in self.points
            if p.full_size_decode and p.batch_size is not None and p.batch_size <= batch
        ]
        return max(below, key=lambda p: p.batch_size or 0) if below else None

    @property
    def dtype_labels(self) -> dict[str, str]:
        """{dtype: label} the plan named its serving dtype by, for the charts."""
        return self.predicted.dtype_labels if self.predicted is not None else {}
