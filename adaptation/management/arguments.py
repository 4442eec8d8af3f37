"""argparse types the management commands share: numbers with a unit and a lower bound, so a
bad value is refused by the parser (exit code 2, the reason on stderr) before anything runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def number_of(
    unit: str, *, minimum: float, inclusive: bool = True, whole: bool = True
) -> Callable[[str], float]:
    """An argparse `type=` for a number of `unit` (e.g. "days") at or above `minimum`
    (strictly above when `inclusive` is False); an int when `whole`, else a float."""
    kind = "a whole number" if whole else "a number"

    def parse(text: str) -> float:
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind} of {unit}") from None
        if value < minimum or (not inclusive and not value > minimum):
            # "1 day", "0 seconds": the unit is singular after exactly one
            named = unit[:-1] if minimum == 1 and unit.endswith("s") else unit
            bound = f"{minimum:g} {named} or more" if inclusive else f"above {minimum:g} {named}"
            raise argparse.ArgumentTypeError(f"must be {bound}")
        return value

    return parse
