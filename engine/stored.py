"""Reading a stored stage result (JSON), whatever shape an older or failed run left.

A field that is not the shape a reader expects reads as empty, so a page or a note never
crashes on a result written by another version of a stage. Every stage's typed result
(`engine/stages/<name>/result.py`) reads its fields with these, and every stage's failure
(`failure`: the phase, the reason and whom it blames) with `StageFailure`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from engine.formatting import finite


def as_mapping(value: Any) -> Mapping[str, Any]:
    """`value` when it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    """`value` as a list when it is a list or tuple, else an empty list."""
    return list(value) if isinstance(value, list | tuple) else []


def mapping_or_none(value: Any) -> dict[str, Any] | None:
    """A copy of `value` when it is a mapping, else None (a part the result does not hold)."""
    return dict(value) if isinstance(value, Mapping) else None


def as_mappings(value: Any) -> list[Mapping[str, Any]]:
    """Each item of a stored list as a mapping: an item of another type reads as empty, so
    it still counts as an entry."""
    return [as_mapping(item) for item in as_list(value)]


def mappings(value: Any) -> list[Mapping[str, Any]]:
    """The mappings of a stored list (anything else in it left out)."""
    return [item for item in as_list(value) if isinstance(item, Mapping)]


def numbers(value: Any, *keys: str) -> dict[str, float | None]:
    """The finite numbers a stored mapping holds under `keys` (`formatting.finite`: None for
    a missing key or a value that is not a finite number), by key."""
    mapping = as_mapping(value)
    return {key: finite(mapping.get(key)) for key in keys}


def text(value: Any) -> str:
    """`value` as text, "" for None."""
    return "" if value is None else str(value)


def string(value: Any) -> str | None:
    """`value` when it is a string, else None (a stored field of another type is ignored,
    where `text` would write it out)."""
    return value if isinstance(value, str) else None


def strings(value: Any) -> tuple[str, ...]:
    """The strings of a stored list (anything else in it left out)."""
    return tuple(item for item in as_list(value) if isinstance(item, str))


def texts(value: Any) -> list[str]:
    """Every item of a stored list as text (`str`), as lines and notes are written; anything
    but a list reads as none."""
    return [str(item) for item in as_list(value)]


def reasons_by_name(value: Any) -> dict[str, str]:
    """A stored {name: reason} mapping (a skipped dtype and why), its text reasons only."""
    return {str(key): why for key, why in as_mapping(value).items() if isinstance(why, str)}


def whole_number(value: Any) -> int | None:
    """`value` as an int when it is a finite whole number (JSON may hold 2.0), else None."""
    number = finite(value)
    return int(number) if number is not None and number.is_integer() else None


def as_count(value: Any) -> int | float | None:
    """A count a result stores as a number: an int when whole (JSON may hold 2.0), else the
    number, or None when it is not a finite number."""
    number = finite(value)
    if number is None:
        return None
    return int(number) if number.is_integer() else number


def flag(value: Any) -> bool | None:
    """`value` when it is a bool (a verdict: True, False), else None (not judged)."""
    return value if isinstance(value, bool) else None


def over(value: float | None, limit: float | None) -> bool | None:
    """Whether `value` is above `limit`; None (not judged) when either is unknown."""
    if value is None or limit is None:
        return None
    return value > limit


def within(value: float | None, limit: float | None) -> bool | None:
    """Whether `value` is at most `limit`; None (not judged) when either is unknown."""
    above = over(value, limit)
    return None if above is None else not above


# Whom a stage's failure blames (`StageFailure.culprit`): the release (it cannot pass), or the
# infrastructure (the host, the engine's environment, a time budget: the release not judged).
RELEASE = "release"
INFRASTRUCTURE = "infrastructure"


@dataclass(frozen=True)
class StageFailure:
    """Why a stage failed, where its result says (`failure`, any stage: the serve stage's
    launch and load failures, the stability run cut by its time budget, the sandbox that
    could not start): the `phase` it failed in ("" when not said), its `reason`, the serving
    engine's own error lines where one ran, and whom it blames (`culprit`: `RELEASE`,
    `INFRASTRUCTURE`; "" when not said). The worker's failure classes read the culprit
    through it (`workers/failures.py`)."""

    phase: str
    reason: str
    engine_lines: list[str] = field(default_factory=list)
    culprit: str = ""

    @classmethod
    def from_stored(cls, value: Any) -> Self | None:
        """The failure a stored `failure` holds; None where it holds none (not a mapping, or
        an empty one). Never raises."""
        failure = as_mapping(value)
        if not failure:
            return None
        return cls(
            phase=text(failure.get("phase")),
            reason=text(failure.get("reason")),
            engine_lines=texts(failure.get("engine_lines")),
            culprit=text(failure.get("culprit")),
        )

    @classmethod
    def of(cls, result: Any) -> Self | None:
        """The failure of a stored result (its `failure`), None where it holds none."""
        return cls.from_stored(as_mapping(result).get("failure"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "reason": self.reason,
            "engine_lines": list(self.engine_lines),
            "culprit": self.culprit,
        }

    @property
    def release_blamed(self) -> bool:
        return self.culprit == RELEASE

    @property
    def infrastructure_blamed(self) -> bool:
        return self.culprit == INFRASTRUCTURE
