"""Reading a stored stage result (JSON), whatever shape an older or failed run left.

A field that is not the shape a reader expects reads as empty, so a page or a note never
crashes on a result written by another version of a stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.formatting import finite


def as_mapping(value: Any) -> Mapping[str, Any]:
    """`value` when it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    """`value` as a list when it is a list or tuple, else an empty list."""
    return list(value) if isinstance(value, list | tuple) else []


def numbers(value: Any, *keys: str) -> dict[str, float | None]:
    """The finite numbers a stored mapping holds under `keys` (`formatting.finite`: None for
    a missing key or a value that is not a finite number), by key."""
    mapping = as_mapping(value)
    return {key: finite(mapping.get(key)) for key in keys}


def text(value: Any) -> str:
    """`value` as text, "" for None."""
    return "" if value is None else str(value)


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
