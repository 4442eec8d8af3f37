"""What the distributed and performance presenter modules still take from the former plan
presenters (a labelled fact, a chart slot, the tokens/s, split and validated-split writers), until
they are converted to return values too (the next commits remove this module)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.formatting import MISSING
from engine.formatting import finite as _number

DISTRIBUTED_STAGE = "distributed"


def tokens_per_s_text(value: Any) -> str:
    """A predicted speed: 5775.99 → "5,776 tokens/s", 42.26 → "42.3 tokens/s"."""
    number = _number(value)
    if number is None:
        return MISSING
    return f"{number:,.0f} tokens/s" if abs(number) >= 100 else f"{number:,.1f} tokens/s"


def split_text(item: Mapping[str, Any]) -> str:
    """A split as the planner writes it: "TP1 PP1 EP8 DP8"."""
    return " ".join(f"{k.upper()}{item.get(k, MISSING)}" for k in ("tp", "pp", "ep", "dp"))


def validated_split_label(result: Mapping[str, Any]) -> str:
    """The split a `distributed` run validated, as its reason writes it: "TP=2 EP=2" (EP only
    when above 1)."""
    ep = result.get("ep")
    return f"TP={result.get('tp', MISSING)}" + (
        f" EP={ep}" if isinstance(ep, int) and ep > 1 else ""
    )


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
