"""The performance stage's known limitations: the twin out of memory before the end of its
sweep, or raising mid-sweep, per dtype. Registered as the stage's `findings` in
`engine.registry`; their words are `templates/limitations/performance/`.

A sweep stopped by its time budget (a stop whose "cause" is "time budget",
engine/stages/performance/budget.py) raises none: the host ran out of time, which says
nothing about the release."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.findings import MAJOR, MINOR, Finding, cut_key
from engine.stages.performance.result import PerformanceResult


def findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """Per dtype, out of memory before the end of the sweep (minor; major when no point of
    the dtype was measured) and the twin raising mid-sweep (major), as the run's result
    judges its stops and errors (`PerformanceResult`). None without a sweep. Time-budget
    stops are not judged (module docstring)."""
    run = PerformanceResult.from_stored(result)
    if not run.sweep_recorded:
        return None
    largest_batch = run.options.max_batch_size if run.options else None
    found = []
    for dtype, stops in run.out_of_memory_by_dtype().items():
        ran = [p for p in run.measured_points if p.dtype == dtype]
        found.append(
            Finding(
                key=cut_key(f"performance:oom:{dtype}"),
                template="performance/out-of-memory",
                data={
                    "dtype": dtype,
                    "pool": pool,
                    "largest_batch": largest_batch,
                    "first_batch": min(s.batch_size or 0 for s in stops),
                    "stops": [{"prompt_len": s.prompt_len, "reason": s.reason} for s in stops],
                    # The largest batch measured in the dtype; None when none was.
                    "best_batch": max((p.batch_size or 0 for p in ran), default=0) if ran else None,
                },
                severity=MINOR if ran else MAJOR,
            )
        )
    for dtype, (first, *_) in run.twin_errors_by_dtype().items():
        found.append(
            Finding(
                key=cut_key(f"performance:error:{dtype}"),
                template="performance/twin-error",
                data={
                    "dtype": dtype,
                    "pool": pool,
                    "prompt_len": first.prompt_len,
                    "batch_size": first.batch_size,
                    "error": first.error,
                },
                severity=MAJOR,
            )
        )
    return found
