"""Where a page embeds a chart: the figure and the element ids `static/charts.js` pairs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChartSlot:
    """A plotly figure (`adaptation.charts`) and where it goes: its JSON in
    `<script id="{stem}-figure">` is drawn into `<div id="{stem}-chart">`. `name` says which
    chart of its panel it is (the template labels it); `title` is the chart's own title where
    the label quotes it."""

    stem: str
    figure: dict[str, Any]
    name: str = ""
    title: str = ""

    @property
    def chart_id(self) -> str:
        return f"{self.stem}-chart"

    @property
    def figure_id(self) -> str:
        return f"{self.stem}-figure"
