"""The ordered list of stages every adaptation job runs. Later stages append themselves here
(see docs/extending.md, "Adding a stage")."""

from __future__ import annotations

from workers.stages import analyze, fetch, operators, precision
from workers.stages.base import StageDefinition

STAGES: tuple[StageDefinition, ...] = (
    fetch.DEFINITION,
    analyze.DEFINITION,
    operators.DEFINITION,
    precision.DEFINITION,
)

_BY_NAME = {stage.name: stage for stage in STAGES}


def stage_names() -> list[str]:
    """Names of the registered stages, in the order a job runs them."""
    return [stage.name for stage in STAGES]


def get_stage(name: str) -> StageDefinition:
    """The stage called `name`. Raises `LookupError` naming the known stages."""
    try:
        return _BY_NAME[name]
    except KeyError:
        known = ", ".join(_BY_NAME)
        raise LookupError(f"Unknown stage {name!r}; known stages: {known}.") from None
