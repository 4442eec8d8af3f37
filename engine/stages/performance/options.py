"""The per-job options of the `performance` stage, checked (`performance_options`, the
registry's `check_options`): plain Python without torch, so the web process checks them when a
job is created.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from engine.stages.option_checks import check_names, int_option

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
    return checked
