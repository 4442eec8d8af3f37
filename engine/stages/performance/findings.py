"""The performance stage's known limitations: the twin out of memory before the end of its
sweep, or raising mid-sweep, per dtype. Registered as the stage's `findings` in
`engine.registry`.

A sweep stopped by its time budget (a stop whose "cause" is "time budget",
engine/stages/performance/budget.py) raises none: the host ran out of time, which says
nothing about the release."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import markdown as md
from engine.findings import MAJOR, MINOR, Finding, cut_key, cut_title
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
        first = min(s.batch_size or 0 for s in stops)
        lines = [
            f"The performance sweep of the scaled twin in {md.code(dtype)} on pool "
            f"{md.code(pool)} ran out of memory before the end of the sweep"
            + (f" (batch {largest_batch})" if largest_batch else "")
            + ":",
            "",
        ]
        lines += [f"- prompt {s.prompt_len}: {md.text(s.reason)}" for s in stops]
        best = max((p.batch_size or 0 for p in ran), default=0)
        lines += [
            "",
            f"Largest batch measured in {md.code(dtype)}: {best}."
            if ran
            else f"No point was measured in {md.code(dtype)}.",
            "These are the twin's figures on the pool's device, not the full model's.",
        ]
        found.append(
            Finding(
                key=cut_key(f"performance:oom:{dtype}"),
                title=cut_title(
                    f"Out of memory at batch {first} in {dtype} on pool {pool} (performance sweep)"
                ),
                body="\n".join(lines),
                severity=MINOR if ran else MAJOR,
            )
        )
    for dtype, (first, *_) in run.twin_errors_by_dtype().items():
        found.append(
            Finding(
                key=cut_key(f"performance:error:{dtype}"),
                title=cut_title(
                    f"The twin fails mid-sweep in {dtype} on pool {pool} at batch "
                    f"{first.batch_size}"
                ),
                body=(
                    f"At prompt {first.prompt_len}, batch {first.batch_size} the "
                    f"scaled twin in {md.code(dtype)} on pool {md.code(pool)} raised: "
                    f"{md.text(first.error)}"
                ),
                severity=MAJOR,
            )
        )
    return found
