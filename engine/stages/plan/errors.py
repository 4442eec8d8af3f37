"""Errors of the planner. Both are `ValueError`s: the input cannot be planned as given."""

from __future__ import annotations


class PlanInputError(ValueError):
    """The analysis, the pool layout or an option is unusable (zero or negative sizes, an
    implausible layer count, heads that do not divide the hidden size, a pool with no
    devices). The message names the field."""


class NoFittingPlan(ValueError):
    """No valid split fits the pool. The message says what would fit: more devices (how
    many), a smaller context (which), a lower-precision dtype (which)."""

    def __init__(self, message: str, *, suggestions: dict | None = None) -> None:
        super().__init__(message)
        self.suggestions = dict(suggestions or {})
