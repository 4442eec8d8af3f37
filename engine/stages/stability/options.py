"""The per-job options of the `stability` stage, checked (`stability_options`, the
registry's `check_options`), and its time limits (`stability_time_limits`, the registry's
`limits_for_options`): plain Python without torch, so the web process checks options and
computes the limits of the message that sends the stage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from engine.stages.option_checks import check_names, number_option

DEFAULT_DURATION_S = 20.0
MAX_DURATION_S = 7 * 24 * 3600.0
# The stability stage's Celery limits (`stability_time_limits`): the run's duration, plus
# STABILITY_LIMIT_MARGIN of it (the loop finishes the step under way and runs to `min_steps`, or
# the verdict's 10 steps, even past the duration), plus STABILITY_SETUP_S for the twin build,
# the dtype copy and the judging; the hard limit STABILITY_HARD_GRACE_S after the soft one, as
# the other stages. The loop itself ends at 80% of the soft limit whatever its step count (the
# stage's time budget, `stopped: "time budget"`), so the soft limit never ends the stage.
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


def stability_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The stability options of a job (`AdaptationJob.options["stability"]`), checked.

    `duration_s` (seconds, > 0, up to a week), `batch_size`, `prompt_len`, `decode_steps`
    (the size of one step), `dtype` (a torch dtype name; default the pool's first the device
    runs), `min_steps` (steps run even past the duration, at least MIN_JUDGED_STEPS = 10: the
    verdict needs that many; unset, the run stops at `duration_s` once it has those 10, and a
    run that took longer says why in `ran_longer_reason`), `warmup_fraction` (of the
    steps, left out of the fits, 0 to 0.5), `leak_bytes_per_step` (bytes/step),
    `leak_min_growth_bytes` (bytes), `max_step_time_drift` (a fraction), `max_errors`
    (exceptions before the loop stops), `max_nonfinite_outputs`, `seed`. Unset or None values
    are left out (defaults apply). Raises `ValueError` naming the option.
    """
    if options is None:
        return {}
    check_names("stability", options, STABILITY_OPTION_NAMES)
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
        value = number_option(options, name, low, high)
        if value is not None:
            checked[name] = value
    dtype = options.get("dtype")
    if dtype is not None:
        from engine.stages.precision.thresholds import SUPPORTED_DTYPES

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
    duration = number_option(options or {}, "duration_s", 1e-3, MAX_DURATION_S)
    if duration is None:
        duration = DEFAULT_DURATION_S
    soft = math.ceil(round(duration * (1 + STABILITY_LIMIT_MARGIN), 6)) + STABILITY_SETUP_S
    return soft, soft + STABILITY_HARD_GRACE_S
