"""A stage as every reader names it: its registry title (`engine.registry`)."""

from __future__ import annotations

from engine.registry import get_stage


def stage_title(name: str) -> str:
    """The registry title of a stage, or its name for a stage no longer registered."""
    try:
        return get_stage(name).title
    except LookupError:
        return name
