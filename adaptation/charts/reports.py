"""The reports page's chart: each ready release's time to Day-0."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import plotly.graph_objects as go

from adaptation.charts.layout import LEGEND_BELOW, plotly_white


def time_to_day0(
    points: Sequence[Mapping[str, Any]], *, within_h: float = 24.0
) -> dict[str, Any] | None:
    """Each ready release's time to Day-0 (hours) over when its clock started (publication,
    or discovery where the hub gave no publication time: marked differently), with the
    `within_h` target as a dashed line: the managers' report chart.

    `points` are `adaptation.presenters.reports.chart_points` ({"at", "hours", "repo_id", "basis"}),
    oldest first. Returns the figure as a JSON-able dict, or None without a ready release.
    The figure is validated without its template, which is attached as plotly's own JSON
    afterwards: validating the template again costs more than the rest (the report page
    must render in 300 ms over 1,000 releases).
    """
    if not points:
        return None
    traces = []
    for basis, symbol, name in (
        ("publication", "circle", "from publication"),
        ("discovery", "diamond-open", "from discovery (no publication time)"),
    ):
        chosen = [p for p in points if p["basis"] == basis]
        if chosen:
            traces.append(
                go.Scatter(
                    x=[p["at"].isoformat() for p in chosen],
                    y=[p["hours"] for p in chosen],
                    text=[p["repo_id"] for p in chosen],
                    mode="markers",
                    marker={"symbol": symbol, "size": 8},
                    name=f"time to Day-0, {name}",
                    hovertemplate="%{text}<br>%{x|%Y-%m-%d %H:%M} UTC<br>%{y:.2f} h<extra></extra>",
                )
            )
    fig = go.Figure(
        data=traces,
        layout={
            "title": {"text": "Time to Day-0 of each ready release"},
            "height": 360,
            "xaxis": _clock_axis([p["at"] for p in points]),
            "yaxis": {"title": {"text": "time to Day-0 (h)"}, "rangemode": "tozero"},
            "margin": {"l": 70, "r": 20, "t": 50, "b": 60},
            "legend": LEGEND_BELOW,
            "shapes": [
                {
                    "type": "line",
                    "xref": "paper",
                    "x0": 0,
                    "x1": 1,
                    "y0": within_h,
                    "y1": within_h,
                    "line": {"dash": "dash", "width": 1, "color": "#5d6875"},
                }
            ],
            "annotations": [
                {
                    "xref": "paper",
                    "x": 0,
                    "y": within_h,
                    "text": f"{within_h:g} h",
                    "showarrow": False,
                    "xanchor": "left",
                    "yanchor": "bottom",
                }
            ],
        },
    )
    figure = fig.to_plotly_json()
    figure["layout"]["template"] = plotly_white()
    return figure


# A report's time axis spans at least this much: releases found within seconds of each other
# (a demo, a burst of webhooks) would otherwise get sub-second ticks.
_MIN_CLOCK_SPAN = timedelta(hours=2)


def _clock_axis(times: Sequence[datetime]) -> dict[str, Any]:
    """A date axis over `times` (UTC), ticks to the minute, padded to `_MIN_CLOCK_SPAN`."""
    axis: dict[str, Any] = {
        "title": {"text": "published (or discovered) at, UTC"},
        "type": "date",
        "tickformat": "%b %d, %H:%M",
    }
    low, high = min(times), max(times)
    if high - low < _MIN_CLOCK_SPAN:
        pad = (_MIN_CLOCK_SPAN - (high - low)) / 2
        axis["range"] = [(low - pad).isoformat(), (high + pad).isoformat()]
    return axis
