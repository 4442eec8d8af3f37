"""The per-job options of the `performance` stage, checked (`performance_options`, the
registry's `check_options`): plain Python without torch, so the web process checks them when a
job is created.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from engine.stages.option_checks import check_names, int_option, number_option

# Sanity limits of the options (a value past them is a typo, not a plan).
MAX_BATCH_SIZE_LIMIT = 1 << 16
MAX_PROMPT_LEN = 1 << 20
MAX_REPEATS = 10_000
# The stage's time budget (s): its Celery soft limit, which `time_budget_s` raises or lowers
# (`performance_time_limits`). The sweep plans itself to fit in it and stops, keeping its
# points, when it is spent (engine/stages/performance/budget.py); the hard limit comes
# PERFORMANCE_HARD_GRACE_S after, as the other stages'. The default run measures in under
# 60 s on 2 idle CPU cores (benchmarks/performance.py): 180 s leaves a busy host room.
DEFAULT_TIME_BUDGET_S = 180.0
MIN_TIME_BUDGET_S = 1.0
MAX_TIME_BUDGET_S = 7 * 24 * 3600.0
PERFORMANCE_HARD_GRACE_S = 60


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
    "time_budget_s",
    "seed",
)


def performance_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The performance options of a job (`AdaptationJob.options["performance"]`), checked.

    `max_batch_size` (1 to 65,536; batches are the powers of two up to it; default 64 on the
    CPU, 512 on an accelerator), `prompt_lens`
    (a list of distinct token counts, 1 to 1,048,576), `warmup`/`repeats` (untimed and timed
    decode steps per point), `prefill_warmup`/`prefill_repeats` (untimed and timed prefills),
    `dtypes` (torch names, replacing the pool's serving dtypes), `knee_growth` (a fraction
    in (0, 10]), `memory_limit_bytes` (a ceiling on a point's peak memory, bytes),
    `time_budget_s` (the stage's soft time limit, s, 1 to a week; default 180: the sweep is
    planned to fit in it and stops, keeping its points, when it is spent), `seed`.
    Unset or None values are left out (the defaults apply). Raises `ValueError` naming the
    option for an unknown key or a bad value.
    """
    if options is None:
        return {}
    check_names("performance", options, PERFORMANCE_OPTION_NAMES)
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
        value = int_option(options, name, low, high)
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
        from engine.stages.precision.thresholds import SUPPORTED_DTYPES

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
    budget = number_option(options, "time_budget_s", MIN_TIME_BUDGET_S, MAX_TIME_BUDGET_S)
    if budget is not None:
        checked["time_budget_s"] = budget
    return checked


def performance_time_limits(options: Mapping[str, Any] | None) -> tuple[int, int]:
    """(soft, hard) Celery time limits in seconds of a performance run with the job's
    `options` (`AdaptationJob.options["performance"]`, the registry's `limits_for_options`):
    soft = ceil(time_budget_s) (default 180), hard = soft + PERFORMANCE_HARD_GRACE_S. The
    stage reads the soft one as its budget (`StageContext.soft_time_limit_s`). Raises
    `ValueError` for a bad `time_budget_s` (the caller falls back to the stage's fixed
    limits, and the stage refuses the options by name)."""
    budget = number_option(options or {}, "time_budget_s", MIN_TIME_BUDGET_S, MAX_TIME_BUDGET_S)
    soft = math.ceil(budget if budget is not None else DEFAULT_TIME_BUDGET_S)
    return soft, soft + PERFORMANCE_HARD_GRACE_S
