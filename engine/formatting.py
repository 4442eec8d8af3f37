"""Figures as text, written once: the pages' number filters
(`adaptation.templatetags.day0_format` registers these functions), the known-limitation
notes, the release notes and the commands all write a figure the same way.

Plain Python (neither Django nor torch). Every formatter takes whatever a stored result holds
and writes `MISSING` ("—") for a value that is not a finite number (None, a string, a bool,
NaN): `finite` is the one reading of a number from a result.
"""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from engine.units import GIB, GIGA, TERA

MISSING = "—"


def finite(value: Any) -> float | None:
    """`value` as a float when it is a finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def count(value: Any) -> str:
    """A whole number with thousands separators: 131072 → "131,072"."""
    number = finite(value)
    return MISSING if number is None else f"{round(number):,}"


def counted(value: Any, noun: str, plural: str | None = None) -> str:
    """A count with its noun, singular for exactly one: (1, "tensor") → "1 tensor",
    (3, "tensor") → "3 tensors", (2, "MTP module") → "2 MTP modules"; `plural` where adding
    "s" is wrong ("index", "indexes"). A missing value gives "— tensors"."""
    number = finite(value)
    word = noun if number == 1 else (plural or noun + "s")
    return f"{count(value)} {word}"


def gib(value: Any) -> str:
    """Bytes as binary gibibytes: "16.0 GiB"; three decimals below 1 GiB ("0.067 GiB")."""
    number = finite(value)
    if number is None:
        return MISSING
    size = number / GIB
    return f"{size:.3f} GiB" if 0 < abs(size) < 1 else f"{size:,.1f} GiB"


def params(value: Any) -> str:
    """A parameter count: "20.9 B", "2.3 M", "512"."""
    number = finite(value)
    if number is None:
        return MISSING
    if abs(number) >= 1e9:
        return f"{number / 1e9:,.2f} B" if abs(number) < 1e10 else f"{number / 1e9:,.1f} B"
    if abs(number) >= 1e6:
        return f"{number / 1e6:,.1f} M"
    return f"{number:,.0f}"


def params_words(value: Any) -> str:
    """A parameter count with the word: "671.0 B params"."""
    text = params(value)
    return text if text == MISSING else f"{text} params"


def bytes_per_token(value: Any) -> str:
    """A per-token size in bytes: 70272 → "70,272 bytes/token"."""
    number = finite(value)
    return MISSING if number is None else f"{round(number):,} bytes/token"


def bytes_per_step(value: Any) -> str:
    """A memory slope, whole bytes per step: 123456.7 → "123,457 bytes/step"."""
    number = finite(value)
    return MISSING if number is None else f"{number:,.0f} bytes/step"


def gb_per_s(value: Any) -> str:
    """A bandwidth in bytes/s as decimal GB/s, as datasheets give it: 3.35e12 → "3,350.0 GB/s"."""
    number = finite(value)
    return MISSING if number is None else f"{number / GIGA:,.1f} GB/s"


def tflops(value: Any) -> str:
    """A compute rate in FLOP/s as TFLOP/s with two decimals: 9.89e14 → "989.00 TFLOP/s"."""
    number = finite(value)
    return MISSING if number is None else f"{number / TERA:,.2f} TFLOP/s"


def mib(value: Any) -> str:
    """Bytes as binary mebibytes with two decimals: 395403264 → "377.09 MiB"."""
    number = finite(value)
    return MISSING if number is None else f"{number / 2**20:,.2f} MiB"


def ms(seconds: Any) -> str:
    """A short time (seconds) in milliseconds below a second, else in the largest unit that
    reads at a glance, three significant digits: 0.01643 → "16.4 ms", 0.25 → "250 ms",
    17.7 → "17.7 s", 754 → "12.6 min", 17702.8 → "4.92 h" (never "17,702,796 ms")."""
    number = finite(seconds)
    if number is None:
        return MISSING
    size = abs(number)
    millis = number * 1000
    if size < 0.1:
        return f"{millis:,.3g} ms"
    if size < 1:
        return f"{millis:,.0f} ms"
    if size < 60:
        return f"{number:.3g} s"
    if size < 3600:
        return f"{number / 60:.3g} min"
    hours = number / 3600
    return f"{hours:.3g} h" if abs(hours) < 1000 else f"{hours:,.0f} h"


def rate(value: Any) -> str:
    """A rate (tokens/s) with three significant digits below 100, whole above: "122", "8.5"."""
    number = finite(value)
    if number is None:
        return MISSING
    return f"{number:,.3g}" if number < 100 else f"{number:,.0f}"


def tokens_per_s(value: Any) -> str:
    """A speed with its unit, the number as `rate` writes it: "5,776 tokens/s", "42.3 tokens/s"
    (the em dash alone when missing)."""
    text = rate(value)
    return text if text == MISSING else f"{text} tokens/s"


def sig(value: Any, digits: int = 3) -> str:
    """`digits` significant digits: 0.031234 → "0.0312"."""
    number = finite(value)
    return MISSING if number is None else f"{number:.{digits}g}"


def scientific(value: Any) -> str:
    """An error or tolerance in scientific notation, three significant digits, so values of
    very different sizes compare at a glance: 7.4506e-07 → "7.45e-07", 0.90308 → "9.03e-01"."""
    number = finite(value)
    return MISSING if number is None else f"{number:.2e}"


def percent(value: Any) -> str:
    """A fraction as a percentage with one decimal: 0.1109 → "11.1 %"."""
    number = finite(value)
    return MISSING if number is None else f"{number * 100:.1f} %"


def signed_percent(value: Any, decimals: int = 1) -> str:
    """A relative change as a signed percentage, no space: 0.0123 → "+1.2%", and with
    `decimals` 0, 0.2 → "+20%" (a drift and its limit)."""
    number = finite(value)
    return MISSING if number is None else f"{number:+.{decimals}%}"


def seconds(value: Any) -> str:
    """Seconds with one decimal: "20.0 s"."""
    number = finite(value)
    return MISSING if number is None else f"{number:,.1f} s"


def duration(value: Any) -> str:
    """A duration (a `timedelta` or seconds) in the largest units that read at a glance:
    "3.4 s", "5 m 07 s", "1 h 02 m", "2 d 03 h"."""
    total = value.total_seconds() if isinstance(value, timedelta) else finite(value)
    if total is None:
        return MISSING
    sign = "-" if total < 0 else ""
    total = abs(total)
    if total < 60:
        return f"{sign}{total:.1f} s"
    days, rest = divmod(int(total), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{sign}{days} d {hours:02d} h"
    if hours:
        return f"{sign}{hours} h {minutes:02d} m"
    return f"{sign}{minutes} m {secs:02d} s"


def hours_duration(value: Any) -> str:
    """A duration given in hours, written as `duration` writes one: 0.09 → "5 m 24 s"."""
    hours = finite(value)
    return MISSING if hours is None else duration(hours * 3600)


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


def exit_status(code: Any) -> str:
    """How a process ended, from its exit code as `subprocess` reports it (negative: killed by
    that signal), to follow a subject ("rank 1 …"): "exited with code 1", "was killed by
    SIGKILL", "ended with no exit status recorded" (None: unknown)."""
    if isinstance(code, bool) or not isinstance(code, int):
        return "ended with no exit status recorded"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _field(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, Mapping) else getattr(value, key, None)


def split(value: Any) -> str:
    """A parallel split (a mapping or an object with `tp`, `pp`, `ep`, `dp`) as the planner
    writes it: "TP1 PP1 EP8 DP8"; `MISSING` for None."""
    if value is None:
        return MISSING
    parts = []
    for key in ("tp", "pp", "ep", "dp"):
        size = _field(value, key)
        parts.append(f"{key.upper()}{MISSING if size is None else size}")
    return " ".join(parts)


def validated_split(value: Any) -> str:
    """The split a multi-device run validated (a mapping or an object with `tp`, `ep`):
    "TP=2", "TP=2 EP=2" (EP only above 1); `MISSING` for None."""
    if value is None:
        return MISSING
    tp, ep = _field(value, "tp"), _field(value, "ep")
    more = f" EP={ep}" if isinstance(ep, int) and not isinstance(ep, bool) and ep > 1 else ""
    return f"TP={MISSING if tp is None else tp}{more}"
