"""Checks shared by the stages' option checkers: each raises `ValueError` naming the option.

Plain Python: the web process runs the checkers when a job is created.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def int_option(options: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be a whole number from {low:,} to {high:,}, got {value!r}")
    return value


def check_names(stage: str, options: Any, known: tuple[str, ...]) -> None:
    """Raise `ValueError` unless `options` is a mapping whose keys are all in `known`."""
    if not isinstance(options, Mapping):
        raise ValueError(f"{stage} options must be an object, got {type(options).__name__}")
    unknown = sorted(str(key) for key in options if key not in known)
    if unknown:
        raise ValueError(
            f"unknown {stage} {'option' if len(unknown) == 1 else 'options'} {', '.join(unknown)}; "
            f"known: {', '.join(known)}"
        )


def number_option(options: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
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
