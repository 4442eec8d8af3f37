"""What the planner says would fit instead, as values for the release page's plan panel and
the compare-pools page (`partials/would_fit.html` words them). The plan's own figures (split,
predictions, calibration) are read by `engine.stages.plan.result.PlanResult`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.stages.plan.result import Suggestions


def whole(value: Any) -> int | None:
    """`value` when it is an int (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Suggestion:
    """One thing the planner said would fit instead (`kind`): "devices" (that many devices of
    `accelerator`, on `nodes` nodes of `per_node` when the pool's node size is known),
    "context" (this pool with a context of `context_tokens`) or "dtype" (this pool at
    `dtype`)."""

    kind: str
    devices: int | None = None
    accelerator: str = ""
    nodes: int | None = None
    per_node: int | None = None
    context_tokens: float | None = None
    dtype: str = ""


def would_fit(suggestions: Suggestions, *, kind: str, per_node: Any) -> list[Suggestion]:
    """What the planner said would fit (its `suggestions`): more devices (on how many whole
    nodes of `per_node`), a smaller context, a lower dtype."""
    shown = []
    if suggestions.devices:
        size = whole(per_node)
        shown.append(
            Suggestion(
                "devices",
                devices=suggestions.devices,
                accelerator=kind,
                nodes=-(-suggestions.devices // size) if size else None,
                per_node=size,
            )
        )
    if suggestions.context_tokens:
        shown.append(Suggestion("context", context_tokens=suggestions.context_tokens))
    if suggestions.dtype:
        shown.append(Suggestion("dtype", dtype=suggestions.dtype))
    return shown
