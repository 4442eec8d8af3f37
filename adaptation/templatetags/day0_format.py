"""Filters that write day0's numbers with their units, the same way on every page.

Each filter takes a number (or a `timedelta` for durations) and returns plain text; a missing
or non-numeric value becomes an em dash, so a template never shows "None" or crashes on a key
the analysis engine did not fill.
"""

from __future__ import annotations

import json
from datetime import timedelta
from numbers import Real
from typing import Any

from django import template

from engine import formatting
from engine.units import GIB

register = template.Library()

MISSING = "—"


def number_value(value: Any) -> float | None:
    """`value` as a float when it is an int or float (not a bool, not a string), else None:
    how presenters and charts read a figure from a stored result."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _number(value: Any) -> float | None:
    """`value` as a float, or None when it is missing, a bool or not a number."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, Real):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.replace(",", ""))
        except ValueError:
            return None
    return None


def _params_number(count: float) -> str:
    """A parameter count as billions (or millions below a billion), without the word."""
    if abs(count) >= 1e9:
        billions = count / 1e9
        return f"{billions:,.2f} B" if abs(billions) < 10 else f"{billions:,.1f} B"
    if abs(count) >= 1e6:
        return f"{count / 1e6:,.1f} M"
    return f"{count:,.0f}"


@register.filter
def params(value: Any) -> str:
    """A parameter count: 671026404352 → "671.0 B params", 3606752256 → "3.61 B params"."""
    count = _number(value)
    if count is None:
        return MISSING
    return f"{_params_number(count)} params"


@register.filter
def params_short(value: Any) -> str:
    """A parameter count without the word: 3606752256 → "3.61 B"."""
    count = _number(value)
    if count is None:
        return MISSING
    return _params_number(count)


@register.filter
def gib(value: Any) -> str:
    """Bytes as binary gibibytes (2**30): 1342497964032 → "1,250.3 GiB"."""
    size = _number(value)
    if size is None:
        return MISSING
    gibibytes = size / GIB
    if gibibytes != 0 and abs(gibibytes) < 1:
        return f"{gibibytes:.3f} GiB"
    return f"{gibibytes:,.1f} GiB"


@register.filter
def bytes_per_token(value: Any) -> str:
    """A per-token size in bytes: 70272 → "70,272 bytes/token"."""
    size = _number(value)
    if size is None:
        return MISSING
    return f"{round(size):,} bytes/token"


@register.filter
def count(value: Any) -> str:
    """A whole number with thousands separators: 129280 → "129,280"."""
    number = _number(value)
    if number is None:
        return MISSING
    return f"{round(number):,}"


@register.filter
def duration(value: Any) -> str:
    """A duration (timedelta or seconds): "3.4 s", "5 m 07 s", "1 h 02 m", "2 d 03 h"."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    else:
        number = _number(value)
        if number is None:
            return MISSING
        seconds = number
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 60:
        return f"{sign}{seconds:.1f} s"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{sign}{days} d {hours:02d} h"
    if hours:
        return f"{sign}{hours} h {minutes:02d} m"
    return f"{sign}{minutes} m {secs:02d} s"


@register.filter
def dash(value: Any) -> Any:
    """The value itself, or an em dash when it is None or an empty string."""
    if value is None or value == "":
        return MISSING
    return value


@register.filter
def short_revision(value: Any) -> str:
    """The first 12 characters of a revision (a commit hash is unambiguous at that length)."""
    if not value:
        return MISSING
    return str(value)[:12]


@register.filter
def sig(value: Any) -> str:
    """A measured error to 3 significant digits: 0.000123456 → "0.000123", 2.5e-09 → "2.5e-09"."""
    number = _number(value)
    if number is None:
        return MISSING
    return f"{number:.3g}"


@register.filter
def scientific(value: Any) -> str:
    """An error or tolerance in scientific notation (`engine.formatting.scientific`,
    as the notes write it): 7.4505e-07 → "7.45e-07"."""
    return formatting.scientific(value)


@register.filter
def percent(value: Any) -> str:
    """A fraction as a percentage with one decimal: 0.9734 → "97.3 %"."""
    number = _number(value)
    if number is None:
        return MISSING
    return f"{number * 100:.1f} %"


@register.filter
def plain(value: Any) -> str:
    """A config value as a reader writes it: 7168 → "7,168", True → "yes", lists and objects
    as compact JSON ({"type": "yarn", "factor": 40}), None → "—"."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)
