"""The stability stage's result, typed: what `run.measure_stability` writes, read back from a
stored row of any version, and every judgement made of it.

The run builds its result through `StabilityResult` (`to_dict` is what it stores); the
findings, the release notes, the release page's panel and its charts read a stored row through
`StabilityResult.from_stored` and ask it: whether the memory leaked (`leaked`), whether the
NaN/Inf outputs, the exceptions or the step-time drift crossed their thresholds. The rules
live on `StabilityThresholds`, which the run judges with too, so a rule is written once.

Reading is tolerant: a key an older version did not write, or a value of the wrong type,
reads as None (or empty) and a judgement that needs it as None ("not judged"); reading never
raises. Memory is in bytes, times in seconds, drifts are fractions (0.5: 50% slower).
Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.formatting import finite
from engine.stored import (
    StageFailure,
    as_count,
    as_list,
    as_mapping,
    flag,
    over,
    reasons_by_name,
    string,
    strings,
    whole_number,
)

# The head of each reason the run gives for a crossed threshold ("memory leak: ..."): the
# findings quote the stage's own sentence by it.
LEAK = "memory leak"
NONFINITE = "NaN/Inf outputs"
EXCEPTIONS = "exceptions"
DRIFT = "step-time drift"
TOO_FEW_STEPS = "too few steps to judge"


@dataclass(frozen=True)
class StabilityThresholds:
    """The thresholds a run was judged by, and the rules that judge against them.

    A leak needs both a memory slope above `leak_bytes_per_step` (bytes/step) and a fitted
    growth above `leak_min_growth_bytes` (bytes); `leak_effective_bytes_per_step` is both as
    one slope over the run's fitted steps (None when too few samples). A drift above
    `max_step_time_drift` (a fraction) and more NaN/Inf logit rows than
    `max_nonfinite_outputs` fail the run; `max_errors` exceptions stop it."""

    leak_bytes_per_step: float | None = None
    leak_min_growth_bytes: int | float | None = None
    leak_effective_bytes_per_step: float | None = None
    max_step_time_drift: float | None = None
    max_errors: int | None = None
    max_nonfinite_outputs: int | None = None

    @classmethod
    def from_stored(cls, value: Any) -> StabilityThresholds | None:
        """The thresholds of a stored result's "thresholds"; None when it holds no mapping."""
        if not isinstance(value, Mapping):
            return None
        return cls(
            leak_bytes_per_step=finite(value.get("leak_bytes_per_step")),
            leak_min_growth_bytes=as_count(value.get("leak_min_growth_bytes")),
            leak_effective_bytes_per_step=finite(value.get("leak_effective_bytes_per_step")),
            max_step_time_drift=finite(value.get("max_step_time_drift")),
            max_errors=whole_number(value.get("max_errors")),
            max_nonfinite_outputs=whole_number(value.get("max_nonfinite_outputs")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "leak_bytes_per_step": self.leak_bytes_per_step,
            "leak_min_growth_bytes": self.leak_min_growth_bytes,
            "leak_effective_bytes_per_step": self.leak_effective_bytes_per_step,
            "max_step_time_drift": self.max_step_time_drift,
            "max_errors": self.max_errors,
            "max_nonfinite_outputs": self.max_nonfinite_outputs,
        }

    def leaks(self, slope: float | None, growth: float | None) -> bool | None:
        """The leak rule: a memory slope (bytes/step) above `leak_bytes_per_step` AND a fitted
        growth (bytes) above `leak_min_growth_bytes`. None (not judged) when the slope or its
        threshold is unknown, or when the slope is over its threshold but the growth or its
        floor is unknown; False as soon as the slope is within its threshold."""
        over_slope = over(slope, self.leak_bytes_per_step)
        if not over_slope:
            return over_slope
        return over(growth, self.leak_min_growth_bytes)

    def nonfinite_over(self, rows: int | float | None) -> bool | None:
        """Whether more next-token logit rows held NaN/Inf than `max_nonfinite_outputs`."""
        return over(rows, self.max_nonfinite_outputs)

    def drifts(self, drift: float | None) -> bool | None:
        """Whether the step-time drift (a fraction) is above `max_step_time_drift`."""
        return over(drift, self.max_step_time_drift)


@dataclass(frozen=True)
class StabilitySample:
    """One step of the run as charted: its number (failed steps counted), seconds since the
    loop's start, memory in use after it (bytes), its wall time and process CPU time (s)."""

    step: int | None = None
    elapsed_s: float | None = None
    memory_bytes: int | float | None = None
    step_time_s: float | None = None
    cpu_time_s: float | None = None

    @classmethod
    def from_stored(cls, value: Any) -> StabilitySample:
        sample = as_mapping(value)
        return cls(
            step=whole_number(sample.get("step")),
            elapsed_s=finite(sample.get("elapsed_s")),
            memory_bytes=as_count(sample.get("memory_bytes")),
            step_time_s=finite(sample.get("step_time_s")),
            cpu_time_s=finite(sample.get("cpu_time_s")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "elapsed_s": self.elapsed_s,
            "memory_bytes": self.memory_bytes,
            "step_time_s": self.step_time_s,
            "cpu_time_s": self.cpu_time_s,
        }


@dataclass(frozen=True)
class StabilityWorkload:
    """What each step served: `batch_size` prompts of `prompt_len` tokens and `decode_steps`
    greedy decode steps (`tokens_per_step` in all), in `dtype` on `device`, with the twin's
    weights taking `weight_bytes`."""

    dtype: str | None = None
    device: str | None = None
    batch_size: int | None = None
    prompt_len: int | None = None
    decode_steps: int | None = None
    tokens_per_step: int | None = None
    weight_bytes: int | None = None

    @classmethod
    def from_stored(cls, value: Any) -> StabilityWorkload:
        workload = as_mapping(value)
        return cls(
            dtype=string(workload.get("dtype")),
            device=string(workload.get("device")),
            **{
                key: whole_number(workload.get(key))
                for key in (
                    "batch_size",
                    "prompt_len",
                    "decode_steps",
                    "tokens_per_step",
                    "weight_bytes",
                )
            },
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "device": self.device,
            "batch_size": self.batch_size,
            "prompt_len": self.prompt_len,
            "decode_steps": self.decode_steps,
            "tokens_per_step": self.tokens_per_step,
            "weight_bytes": self.weight_bytes,
        }


# The result's plain figures: read with `finite` (a float, or None).
_FIGURES = (
    "duration_s",
    "duration_asked_s",
    "memory_slope_bytes_per_step",
    "step_time_drift",
    "wall_time_drift",
    "memory_growth_bytes",
    "leak_effective_bytes_per_step",
    "step_time_median_s",
    "step_time_p95_s",
    "step_time_first_quarter_s",
    "step_time_last_quarter_s",
    "cpu_time_median_s",
)
# Its counts: whole numbers, or None.
_COUNTS = ("steps_past_duration", "steps", "nonfinite_outputs", "errors", "warmup_steps", "threads")
# Its memory readings (bytes): an int when whole.
_MEMORY = ("memory_start_bytes", "memory_end_bytes", "memory_max_bytes")
# Its words: a string, or None.
_WORDS = (
    "ran_longer_reason",
    "step_time_drift_basis",
    "stopped_early",
    "stopped",
    "memory_kind",
    "memory_method",
    "timer",
)


@dataclass(frozen=True)
class StabilityResult:
    """A stability run's result (`run.measure_stability` documents each key): how long it ran
    and why longer than asked, its steps, memory slope and growth, NaN/Inf rows, exceptions
    and step-time drift with their thresholds, the verdict (`passed`, `reason`, `reasons`),
    the charted samples, what each step served (`workload`) and how it was measured.

    `failure` (`engine.stored.StageFailure`) blames the infrastructure where the host was to
    blame (its time budget ended the run before a verdict), else None. `passed` None: the
    row holds no verdict."""

    failure: StageFailure | None = None
    duration_s: float | None = None
    duration_asked_s: float | None = None
    ran_longer_reason: str | None = None
    steps_past_duration: int | None = None
    steps: int | None = None
    memory_slope_bytes_per_step: float | None = None
    nonfinite_outputs: int | None = None
    errors: int | None = None
    step_time_drift: float | None = None
    step_time_drift_basis: str | None = None
    wall_time_drift: float | None = None
    passed: bool | None = None
    reason: str = ""
    reasons: tuple[str, ...] = ()
    memory_growth_bytes: float | None = None
    leak_effective_bytes_per_step: float | None = None
    memory_start_bytes: int | float | None = None
    memory_end_bytes: int | float | None = None
    memory_max_bytes: int | float | None = None
    step_time_median_s: float | None = None
    step_time_p95_s: float | None = None
    step_time_first_quarter_s: float | None = None
    step_time_last_quarter_s: float | None = None
    cpu_time_median_s: float | None = None
    warmup_steps: int | None = None
    error_messages: tuple[str, ...] = ()
    stopped_early: str | None = None
    stopped: str | None = None
    thresholds: StabilityThresholds | None = None
    samples: tuple[StabilitySample, ...] = ()
    workload: StabilityWorkload = field(default_factory=StabilityWorkload)
    skipped_dtypes: Mapping[str, str] = field(default_factory=dict)
    memory_kind: str | None = None
    memory_method: str | None = None
    timer: str | None = None
    threads: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    twin: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @classmethod
    def from_stored(cls, value: Any) -> StabilityResult:
        """The result in a stored row (`StageRun.result`), whatever version wrote it; an
        empty result for anything but a mapping. Never raises."""
        result = as_mapping(value)
        return cls(
            failure=StageFailure.of(result),
            passed=flag(result.get("passed")),
            reason=string(result.get("reason")) or "",
            reasons=strings(result.get("reasons")),
            error_messages=strings(result.get("error_messages")),
            thresholds=StabilityThresholds.from_stored(result.get("thresholds")),
            samples=tuple(StabilitySample.from_stored(s) for s in as_list(result.get("samples"))),
            workload=StabilityWorkload.from_stored(result.get("workload")),
            skipped_dtypes=reasons_by_name(result.get("skipped_dtypes")),
            options=dict(as_mapping(result.get("options"))),
            twin=dict(as_mapping(result.get("twin"))),
            notes=strings(result.get("notes")),
            **{key: finite(result.get(key)) for key in _FIGURES},
            **{key: whole_number(result.get(key)) for key in _COUNTS},
            **{key: as_count(result.get(key)) for key in _MEMORY},
            **{key: string(result.get(key)) for key in _WORDS},
        )

    def to_dict(self) -> dict[str, Any]:
        """The result as the stage stores it (JSON-ready; `from_stored` reads it back)."""
        return {
            "failure": None if self.failure is None else self.failure.to_dict(),
            "duration_s": self.duration_s,
            "duration_asked_s": self.duration_asked_s,
            "ran_longer_reason": self.ran_longer_reason,
            "steps_past_duration": self.steps_past_duration,
            "steps": self.steps,
            "memory_slope_bytes_per_step": self.memory_slope_bytes_per_step,
            "nonfinite_outputs": self.nonfinite_outputs,
            "errors": self.errors,
            "step_time_drift": self.step_time_drift,
            "step_time_drift_basis": self.step_time_drift_basis,
            "wall_time_drift": self.wall_time_drift,
            "passed": self.passed,
            "reason": self.reason,
            "reasons": list(self.reasons),
            "memory_growth_bytes": self.memory_growth_bytes,
            "leak_effective_bytes_per_step": self.leak_effective_bytes_per_step,
            "memory_start_bytes": self.memory_start_bytes,
            "memory_end_bytes": self.memory_end_bytes,
            "memory_max_bytes": self.memory_max_bytes,
            "step_time_median_s": self.step_time_median_s,
            "step_time_p95_s": self.step_time_p95_s,
            "step_time_first_quarter_s": self.step_time_first_quarter_s,
            "step_time_last_quarter_s": self.step_time_last_quarter_s,
            "cpu_time_median_s": self.cpu_time_median_s,
            "warmup_steps": self.warmup_steps,
            "error_messages": list(self.error_messages),
            "stopped_early": self.stopped_early,
            "stopped": self.stopped,
            "thresholds": None if self.thresholds is None else self.thresholds.to_dict(),
            "samples": [sample.to_dict() for sample in self.samples],
            "workload": self.workload.to_dict(),
            "skipped_dtypes": dict(self.skipped_dtypes),
            "memory_kind": self.memory_kind,
            "memory_method": self.memory_method,
            "timer": self.timer,
            "threads": self.threads,
            "options": dict(self.options),
            "twin": dict(self.twin),
            "notes": list(self.notes),
        }

    # --- the verdict and what it rests on ------------------------------------------------

    @property
    def has_verdict(self) -> bool:
        """Whether the row holds a judged run: a verdict and the thresholds it was judged by
        (a stage that crashed before judging has neither)."""
        return self.passed is not None and self.thresholds is not None

    @property
    def verdict(self) -> str | None:
        """ "passed" or "failed"; None without a verdict."""
        return None if self.passed is None else "passed" if self.passed else "failed"

    @property
    def _limits(self) -> StabilityThresholds:
        return self.thresholds or StabilityThresholds()

    @property
    def leak_judged(self) -> bool:
        """Whether the leak could be judged: the slope and its threshold are known (too few
        samples after the warm-up fit no slope)."""
        return (
            self.memory_slope_bytes_per_step is not None
            and self._limits.leak_bytes_per_step is not None
        )

    def leaked(self) -> bool | None:
        """Whether the memory leaked (`StabilityThresholds.leaks`); None when not judged."""
        return self._limits.leaks(self.memory_slope_bytes_per_step, self.memory_growth_bytes)

    @property
    def leak_above(self) -> float | None:
        """The slope (bytes/step) a leak had to exceed on this run: the larger of the slope
        threshold and the growth floor over the steps fitted; None when neither is known."""
        limits = self._limits
        known = [
            limit
            for limit in (limits.leak_bytes_per_step, limits.leak_effective_bytes_per_step)
            if limit is not None
        ]
        return max(known) if known else None

    @property
    def floor_raised(self) -> bool:
        """Whether the growth floor over this run's fitted steps asked for a steeper slope
        than the slope threshold (a short run)."""
        floor, effective = (
            self._limits.leak_bytes_per_step,
            self._limits.leak_effective_bytes_per_step,
        )
        return floor is not None and effective is not None and effective > floor

    def nonfinite_over(self) -> bool | None:
        """Whether more NaN/Inf logit rows came out than the threshold allows."""
        return self._limits.nonfinite_over(self.nonfinite_outputs)

    def raised(self) -> bool | None:
        """Whether any step raised (None: the count is unknown)."""
        return None if self.errors is None else self.errors > 0

    def drifted(self) -> bool | None:
        """Whether the step time drifted above its threshold."""
        return self._limits.drifts(self.step_time_drift)

    def said(self, head: str) -> str:
        """The run's own reason for the threshold named by `head` (`LEAK`, `NONFINITE`,
        `EXCEPTIONS`, `DRIFT`), "" when it gave none."""
        return next((r for r in self.reasons if r.startswith(head)), "")

    @property
    def first_error(self) -> str:
        """The first exception a step raised, in one line ("" when none was kept)."""
        return self.error_messages[0] if self.error_messages else ""
