"""The performance sweep's time budget: plan the sweep to fit, stop when it is spent.

The budget is the stage's soft time limit (`StageContext.soft_time_limit_s`, which the job's
`time_budget_s` option sets through the registry's `limits_for_options`; the option itself
where the engine is called directly). The sweep may use the budget less a safety margin
(`SAFETY_MARGIN`, 20%: the runner's set-up before the stage, one forward step that runs past
a check, the judging after) and less what the device probe after the sweep needs
(`probe_reserve_s`).

Planned to fit: each curve (one dtype and prompt length) gets an equal share of the time
left when it begins (what an earlier curve left unused passes on to the later ones), and a
point is not started when its predicted cost would run past the curve's share. A point's
cost is predicted from the cost of the points measured before it: the previous point of the
curve times the growth per doubling of batch seen on its last two points (between 1 and 2;
2, linear in the batch, after the curve's first point), or, for a curve's first point, the
costliest first point of an earlier curve scaled by the prompt length. Inside a point the
clock is read after every timed forward, and a point still running at the sweep's deadline
is dropped (`TimeBudgetReached`). Either way the sweep stops there and keeps the points
measured, as it does for out of memory; the result says `stopped: "time budget"` and where.

A Celery `SoftTimeLimitExceeded` raised inside a point (the budget was too short for even
the planned points: a host much slower than the first points said) is read the same way: a
time-budget stop, not the twin's failure (`is_time_limit`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SAFETY_MARGIN = 0.20
# What the device probe after the sweep is kept (s), at most this and at most
# PROBE_RESERVE_FRACTION of the budget: on a CPU it takes one to a few seconds.
PROBE_RESERVE_S = 15.0
PROBE_RESERVE_FRACTION = 0.10
TIME_BUDGET = "time budget"
# Growth of a point's cost per doubling of the batch, as predicted (bounds on what the last
# two points say; the first guess after one point).
MIN_GROWTH_PER_DOUBLING = 1.0
MAX_GROWTH_PER_DOUBLING = 2.0


class TimeBudgetReached(Exception):
    """A point was still running at the sweep's deadline; it is dropped."""


def is_time_limit(exc: BaseException) -> bool:
    """Whether `exc` is a task queue's soft time limit (Celery's `SoftTimeLimitExceeded`;
    the engine does not import Celery, so the class is known by name) or our own deadline."""
    return isinstance(exc, TimeBudgetReached) or any(
        cls.__name__ == "SoftTimeLimitExceeded" for cls in type(exc).__mro__
    )


@dataclass
class SweepBudget:
    """The sweep's clock (module docstring). `budget_s` None: no budget (never stops).
    `started` is the stage's start on `clock` (time.perf_counter)."""

    budget_s: float | None
    started: float
    source: str = ""
    clock: Callable[[], float] = time.perf_counter
    costs: dict[tuple[str, int], list[tuple[int, float]]] = field(default_factory=dict)
    stopped_at: dict[str, Any] | None = None

    @property
    def probe_reserve_s(self) -> float:
        if self.budget_s is None:
            return 0.0
        return min(PROBE_RESERVE_S, PROBE_RESERVE_FRACTION * self.budget_s)

    @property
    def end(self) -> float:
        """When the stage's own work must be over (clock time): the budget less the margin."""
        if self.budget_s is None:
            return math.inf
        return self.started + self.budget_s * (1 - SAFETY_MARGIN)

    @property
    def deadline(self) -> float:
        """When the sweep must be over (clock time): `end` less the probe's reserve."""
        return self.end - self.probe_reserve_s

    def spent(self) -> bool:
        return self.clock() >= self.deadline

    def curve_end(self, curves_left: int) -> float:
        """The clock time by which a curve beginning now must end: an equal share of the
        time left among the `curves_left` curves not yet begun (this one included)."""
        if self.budget_s is None:
            return math.inf
        now = self.clock()
        return now + max(0.0, self.deadline - now) / max(1, curves_left)

    def record(self, dtype: str, prompt_len: int, batch_size: int, seconds: float) -> None:
        self.costs.setdefault((dtype, prompt_len), []).append((batch_size, seconds))

    def predict_s(self, dtype: str, prompt_len: int, batch_size: int) -> float | None:
        """The predicted cost (s) of the point (module docstring); None with nothing to go on."""
        curve = self.costs.get((dtype, prompt_len)) or []
        if curve:
            last_b, last_s = curve[-1]
            growth = MAX_GROWTH_PER_DOUBLING
            if len(curve) >= 2:
                (b0, s0), (b1, s1) = curve[-2], curve[-1]
                if s0 > 0 and b1 > b0:
                    growth = (s1 / s0) ** (1 / math.log2(b1 / b0))
                    growth = min(MAX_GROWTH_PER_DOUBLING, max(MIN_GROWTH_PER_DOUBLING, growth))
            return last_s * growth ** math.log2(max(1, batch_size / last_b))
        firsts = [
            seconds * max(1.0, prompt_len / length)
            for (_dtype, length), points in self.costs.items()
            if points
            for seconds in (points[0][1],)
        ]
        return max(firsts) if firsts else None

    def stop(self, dtype: str, prompt_len: int, batch_size: int, why: str) -> dict[str, Any]:
        """The `stopped` entry of a time-budget stop (the first is kept as `stopped_at`)."""
        entry = {
            "dtype": dtype,
            "prompt_len": prompt_len,
            "batch_size": batch_size,
            "cause": TIME_BUDGET,
            "reason": f"stopped at batch {batch_size}: {TIME_BUDGET} ({why})",
        }
        if self.stopped_at is None:
            self.stopped_at = {k: entry[k] for k in ("dtype", "prompt_len", "batch_size")}
        return entry

    def summary(self, now: float | None = None) -> dict[str, Any]:
        """The result's `time_budget`: {"budget_s", "source", "safety_margin",
        "sweep_budget_s" (seconds from the stage's start to the sweep's deadline),
        "probe_reserve_s", "stopped" ("time budget" or None), "stopped_at" ({"dtype",
        "prompt_len", "batch_size"} of the first stop, or None), "points_timed", "sweep_s"
        (the measured points' cost, s)}."""
        return {
            "budget_s": self.budget_s,
            "source": self.source,
            "safety_margin": SAFETY_MARGIN,
            "sweep_budget_s": (self.deadline - self.started if self.budget_s is not None else None),
            "probe_reserve_s": self.probe_reserve_s,
            "stopped": TIME_BUDGET if self.stopped_at is not None else None,
            "stopped_at": self.stopped_at,
            "points_timed": sum(len(c) for c in self.costs.values()),
            "sweep_s": sum(s for c in self.costs.values() for _, s in c),
        }
