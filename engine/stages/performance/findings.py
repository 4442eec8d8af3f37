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
from engine.stages.performance.budget import TIME_BUDGET

# How an earlier run's error read when Celery's soft time limit ended the stage mid-point
# (before the sweep had a time budget): a host out of time, not the twin failing.
TIME_LIMIT_ERROR = "SoftTimeLimitExceeded"


def findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """Per dtype, out of memory before the end of the sweep (minor; major when no point of
    the dtype was measured) and the twin raising mid-sweep (major). None without a sweep.
    Time-budget stops are not judged (module docstring)."""
    if not isinstance(result.get("stopped"), list) and not isinstance(result.get("errors"), list):
        return None
    points = [p for p in result.get("points") or [] if isinstance(p, Mapping)]
    measured = [p for p in points if p.get("kind") == "measured"]
    largest_batch = (result.get("options") or {}).get("max_batch_size")
    by_dtype: dict[str, list[Mapping[str, Any]]] = {}
    for stop in result.get("stopped") or []:
        if isinstance(stop, Mapping) and stop.get("cause") != TIME_BUDGET:
            by_dtype.setdefault(str(stop.get("dtype")), []).append(stop)
    found = []
    for dtype, stops in by_dtype.items():
        ran = [p for p in measured if p.get("dtype") == dtype]
        first = min(int(s.get("batch_size") or 0) for s in stops)
        lines = [
            f"The performance sweep of the scaled twin in {md.code(dtype)} on pool "
            f"{md.code(pool)} ran out of memory before the end of the sweep"
            + (f" (batch {largest_batch})" if largest_batch else "")
            + ":",
            "",
        ]
        lines += [
            f"- prompt {s.get('prompt_len')}: {md.text(s.get('reason') or '')}" for s in stops
        ]
        best = max((int(p.get("batch_size") or 0) for p in ran), default=0)
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
    errors: dict[str, list[Mapping[str, Any]]] = {}
    for error in result.get("errors") or []:
        if isinstance(error, Mapping) and TIME_LIMIT_ERROR not in str(error.get("error")):
            errors.setdefault(str(error.get("dtype")), []).append(error)
    for dtype, items in errors.items():
        first = items[0]
        found.append(
            Finding(
                key=cut_key(f"performance:error:{dtype}"),
                title=cut_title(
                    f"The twin fails mid-sweep in {dtype} on pool {pool} at batch "
                    f"{first.get('batch_size')}"
                ),
                body=(
                    f"At prompt {first.get('prompt_len')}, batch {first.get('batch_size')} the "
                    f"scaled twin in {md.code(dtype)} on pool {md.code(pool)} raised: "
                    f"{md.text(first.get('error') or '')}"
                ),
                severity=MAJOR,
            )
        )
    return found
