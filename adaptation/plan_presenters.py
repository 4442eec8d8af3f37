"""What the performance presenters still take from the former plan presenters (a labelled
fact, a chart slot, the tokens/s writer) until they return values too (the next commit removes
this module)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.formatting import MISSING
from engine.formatting import finite as _number


def tokens_per_s_text(value: Any) -> str:
    """A predicted speed: 5775.99 → "5,776 tokens/s", 42.26 → "42.3 tokens/s"."""
    number = _number(value)
    if number is None:
        return MISSING
    return f"{number:,.0f} tokens/s" if abs(number) >= 100 else f"{number:,.1f} tokens/s"


@dataclass(frozen=True)
class ChartSlot:
    """A plotly figure and the element ids `static/charts.js` pairs: the figure's JSON in
    `<script id="{stem}-figure">` is drawn into `<div id="{stem}-chart">`."""

    stem: str
    figure: dict[str, Any]
    label: str
    css: str = ""

    @property
    def chart_id(self) -> str:
        return f"{self.stem}-chart"

    @property
    def figure_id(self) -> str:
        return f"{self.stem}-figure"


@dataclass(frozen=True)
class Fact:
    """A labelled value, ready to show."""

    label: str
    value: str
    note: str = ""
