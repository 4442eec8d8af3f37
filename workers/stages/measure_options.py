"""The per-job options of the `performance` and `stability` stages, checked, the stability
stage's time limits, and the rows a performance result is stored as (`performance_rows`,
`calibration_rows`): plain Python without torch, so the web process (job creation, `adapt`,
the message that sends a stage to its pool, storing a result) checks options, computes limits
and flattens results without loading the engine. `workers.stages.performance` and
`workers.stages.stability` re-export what they use from here.

The registry names `performance_options` and `stability_options` as the stages'
`check_options`, and `stability_time_limits` as the stability stage's `limits_for_options`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from workers.stages.plan.calibration import EFFICIENCY_METRICS, EFFICIENCY_UNIT

# --- performance -----------------------------------------------------------------------------

# Sanity limits of the options (a value past them is a typo, not a plan).
MAX_BATCH_SIZE_LIMIT = 1 << 16
MAX_PROMPT_LEN = 1 << 20
MAX_REPEATS = 10_000


PERFORMANCE_OPTION_NAMES = (
    "max_batch_size",
    "prompt_lens",
    "warmup",
    "repeats",
    "prefill_warmup",
    "prefill_repeats",
    "dtypes",
    "knee_growth",
    "memory_limit_bytes",
    "seed",
)


def _int_option(options: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be a whole number from {low:,} to {high:,}, got {value!r}")
    return value


def _check_names(stage: str, options: Any, known: tuple[str, ...]) -> None:
    """Raise `ValueError` unless `options` is a mapping whose keys are all in `known`."""
    if not isinstance(options, Mapping):
        raise ValueError(f"{stage} options must be an object, got {type(options).__name__}")
    unknown = sorted(str(key) for key in options if key not in known)
    if unknown:
        raise ValueError(
            f"unknown {stage} option(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )


def performance_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The performance options of a job (`AdaptationJob.options["performance"]`), checked.

    `max_batch_size` (1 to 65,536; batches are the powers of two up to it; default 64 on the
    CPU, 512 on an accelerator), `prompt_lens`
    (a list of distinct token counts, 1 to 1,048,576), `warmup`/`repeats` (untimed and timed
    decode steps per point), `prefill_warmup`/`prefill_repeats` (untimed and timed prefills),
    `dtypes` (torch names, replacing the pool's serving dtypes), `knee_growth` (a fraction
    in (0, 10]), `memory_limit_bytes` (a ceiling on a point's peak memory, bytes), `seed`.
    Unset or None values are left out (the defaults apply). Raises `ValueError` naming the
    option for an unknown key or a bad value.
    """
    if options is None:
        return {}
    _check_names("performance", options, PERFORMANCE_OPTION_NAMES)
    checked: dict[str, Any] = {}
    for name, low, high in (
        ("max_batch_size", 1, MAX_BATCH_SIZE_LIMIT),
        ("warmup", 0, MAX_REPEATS),
        ("repeats", 1, MAX_REPEATS),
        ("prefill_warmup", 0, MAX_REPEATS),
        ("prefill_repeats", 1, MAX_REPEATS),
        ("memory_limit_bytes", 1, 1 << 60),
        ("seed", 0, 2**31 - 1),
    ):
        value = _int_option(options, name, low, high)
        if value is not None:
            checked[name] = value
    lens = options.get("prompt_lens")
    if lens is not None:
        if (
            not isinstance(lens, (list, tuple))
            or not lens
            or any(
                isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PROMPT_LEN
                for n in lens
            )
            or len(set(lens)) != len(lens)
        ):
            raise ValueError(
                "prompt_lens must be a non-empty list of distinct token counts from 1 to "
                f"{MAX_PROMPT_LEN:,}, got {lens!r}"
            )
        checked["prompt_lens"] = list(lens)
    dtypes = options.get("dtypes")
    if dtypes is not None:
        # The precision package loads torch: only a job that names dtypes pays for it.
        from workers.stages.precision.thresholds import SUPPORTED_DTYPES

        if (
            not isinstance(dtypes, (list, tuple))
            or not dtypes
            or any(d not in SUPPORTED_DTYPES for d in dtypes)
            or len(set(dtypes)) != len(dtypes)
        ):
            raise ValueError(
                f"dtypes must be a non-empty list of distinct dtypes among "
                f"{', '.join(SUPPORTED_DTYPES)}, got {dtypes!r}"
            )
        checked["dtypes"] = list(dtypes)
    growth = options.get("knee_growth")
    if growth is not None:
        if (
            isinstance(growth, bool)
            or not isinstance(growth, (int, float))
            or not math.isfinite(growth)
            or not 0 < growth <= 10
        ):
            raise ValueError(f"knee_growth must be a fraction in (0, 10], got {growth!r}")
        checked["knee_growth"] = float(growth)
    return checked


# The metrics of a performance point and their units (`performance_rows`).
UNITS: Mapping[str, str] = {
    "ttft_s": "s",
    "ttft_p95_s": "s",
    "tpot_s": "s",
    "tpot_p95_s": "s",
    "prefill_tokens_per_s": "tokens/s",
    "decode_tokens_per_s": "tokens/s",
    "peak_memory_bytes": "bytes",
    "peak_memory_increase_bytes": "bytes",
}
CALIBRATED_UNITS: Mapping[str, str] = {
    "calibrated_ttft_s": "s",
    "calibrated_tpot_s": "s",
    "calibrated_prefill_tokens_per_s": "tokens/s",
    "calibrated_decode_tokens_per_s": "tokens/s",
}
# Peak-memory metrics are stored under a name that says which memory (the point's kind).
_MEMORY_METRIC_NAMES = {
    "peak_memory_bytes": "peak_{kind}_bytes",
    "peak_memory_increase_bytes": "peak_{kind}_increase_bytes",
}


def performance_rows(points: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per point and metric, for storage (the job and pool are the caller's):
    {"kind", "model", "dtype", "batch_size", "prompt_len", "metric", "value", "unit"}.

    Metrics: ttft_s, ttft_p95_s, tpot_s, tpot_p95_s (s), prefill_tokens_per_s,
    decode_tokens_per_s (tokens/s), the peak memory named by its kind:
    peak_device_allocated_bytes or peak_process_rss_bytes (bytes, the issue's peak), and what
    the point itself added: peak_device_allocated_increase_bytes or
    peak_process_rss_increase_bytes (bytes, the peak minus the memory in use as the point
    began; on the CPU the resident set carries earlier points' memory, so points compare by
    this one), and a full-size predicted point's calibrated_ttft_s, calibrated_tpot_s (s),
    calibrated_prefill_tokens_per_s, calibrated_decode_tokens_per_s (tokens/s). None values
    are left out.
    """
    rows = []
    for point in points:
        key = {k: point.get(k) for k in ("kind", "model", "dtype", "batch_size", "prompt_len")}
        for metric, unit in (UNITS | CALIBRATED_UNITS).items():
            value = point.get(metric)
            if value is None:
                continue
            name = metric
            if metric in _MEMORY_METRIC_NAMES:
                kind = point.get("memory_kind") or "memory"
                name = _MEMORY_METRIC_NAMES[metric].format(kind=kind)
            rows.append(key | {"metric": name, "value": value, "unit": unit})
    return rows


def calibration_rows(calibration: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The rows of a run's calibration (same keys as `performance_rows`): the twin's predicted
    figures (kind "predicted", model "twin": ttft_s, tpot_s, prefill_tokens_per_s,
    decode_tokens_per_s) and its efficiencies (metrics "decode_efficiency" and
    "prefill_efficiency", unit "ratio"). An efficiency is measured / predicted: a ratio
    derived from the measured point, stored with kind "measured" and the measured point's
    model ("twin"; "twin" where the point names none), never "full-size"."""
    if not isinstance(calibration, Mapping):
        return []
    points = calibration.get("points") or []
    rows = performance_rows(points)
    for point in points:
        key = {k: point.get(k) for k in ("dtype", "batch_size", "prompt_len")}
        for metric in EFFICIENCY_METRICS:
            if point.get(metric) is not None:
                rows.append(
                    {"kind": "measured", "model": point.get("model") or "twin"}
                    | key
                    | {"metric": metric, "value": point[metric], "unit": EFFICIENCY_UNIT}
                )
    return rows


# --- stability -------------------------------------------------------------------------------

DEFAULT_DURATION_S = 20.0
MAX_DURATION_S = 7 * 24 * 3600.0
# The stability stage's Celery limits (`stability_time_limits`): the run's duration, plus
# STABILITY_LIMIT_MARGIN of it (the loop finishes the step under way and runs `min_steps` even
# past the duration), plus STABILITY_SETUP_S for the twin build, the dtype copy and the
# judging; the hard limit STABILITY_HARD_GRACE_S after the soft one, as the other stages.
STABILITY_SETUP_S = 120
STABILITY_LIMIT_MARGIN = 0.10
STABILITY_HARD_GRACE_S = 60

# The stability verdict leaves at least MIN_WARMUP_STEPS steps out of its fits as warm-up and
# judges nothing with fewer than MIN_JUDGED_STEPS completed: `min_steps` may not ask for less.
MIN_WARMUP_STEPS = 5
MIN_JUDGED_STEPS = 2 * MIN_WARMUP_STEPS

STABILITY_OPTION_NAMES = (
    "duration_s",
    "batch_size",
    "prompt_len",
    "decode_steps",
    "dtype",
    "min_steps",
    "warmup_fraction",
    "leak_bytes_per_step",
    "leak_min_growth_bytes",
    "max_step_time_drift",
    "max_errors",
    "max_nonfinite_outputs",
    "seed",
)


def _number(options: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    value = options.get(name)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise ValueError(f"{name} must be a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def stability_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The stability options of a job (`AdaptationJob.options["stability"]`), checked.

    `duration_s` (seconds, > 0, up to a week), `batch_size`, `prompt_len`, `decode_steps`
    (the size of one step), `dtype` (a torch dtype name; default the pool's first the device
    runs), `min_steps` (steps run even past the duration, at least MIN_JUDGED_STEPS = 10: the
    verdict needs that many), `warmup_fraction` (of the
    steps, left out of the fits, 0 to 0.5), `leak_bytes_per_step` (bytes/step),
    `leak_min_growth_bytes` (bytes), `max_step_time_drift` (a fraction), `max_errors`
    (exceptions before the loop stops), `max_nonfinite_outputs`, `seed`. Unset or None values
    are left out (defaults apply). Raises `ValueError` naming the option.
    """
    if options is None:
        return {}
    _check_names("stability", options, STABILITY_OPTION_NAMES)
    checked: dict[str, Any] = {}
    for name, low, high in (
        ("batch_size", 1, 1 << 16),
        ("prompt_len", 1, 1 << 20),
        ("decode_steps", 1, 1 << 16),
        ("min_steps", MIN_JUDGED_STEPS, 10_000_000),
        ("leak_min_growth_bytes", 0, 1 << 60),
        ("max_errors", 1, 1_000_000),
        ("max_nonfinite_outputs", 0, 1 << 60),
        ("seed", 0, 2**31 - 1),
    ):
        value = options.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(
                f"{name} must be a whole number from {low:,} to {high:,}, got {value!r}"
            )
        checked[name] = value
    for name, low, high in (
        ("duration_s", 1e-3, MAX_DURATION_S),
        ("warmup_fraction", 0.0, 0.5),
        ("leak_bytes_per_step", 0.0, 1e18),
        ("max_step_time_drift", 0.0, 1e6),
    ):
        value = _number(options, name, low, high)
        if value is not None:
            checked[name] = value
    dtype = options.get("dtype")
    if dtype is not None:
        from workers.stages.precision.thresholds import SUPPORTED_DTYPES

        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(SUPPORTED_DTYPES)}, got {dtype!r}")
        checked["dtype"] = dtype
    return checked


def stability_time_limits(options: Mapping[str, Any] | None) -> tuple[int, int]:
    """(soft, hard) Celery time limits in seconds of a stability run with the job's
    `options` (`AdaptationJob.options["stability"]`): soft = ceil(duration_s x (1 +
    STABILITY_LIMIT_MARGIN)) + STABILITY_SETUP_S, hard = soft + STABILITY_HARD_GRACE_S. The
    default 20 s run gets 142 s and 202 s; a 4-hour run 15,960 s and 16,020 s. Raises
    `ValueError` for a bad `duration_s` (the caller falls back to the stage's fixed limits,
    and the stage refuses the options by name)."""
    duration = _number(options or {}, "duration_s", 1e-3, MAX_DURATION_S)
    if duration is None:
        duration = DEFAULT_DURATION_S
    soft = math.ceil(round(duration * (1 + STABILITY_LIMIT_MARGIN), 6)) + STABILITY_SETUP_S
    return soft, soft + STABILITY_HARD_GRACE_S
