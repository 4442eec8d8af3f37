"""The look the charts share: tick formats, the legend under the plot, plotly's white
template, and the layout most figures finish with."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

# Tick labels (d3 formats): counts in full with separators ("32,768", not "32.768k"),
# throughputs with an SI suffix ("15k"), milliseconds with their unit ("15 ms").
COUNT_TICKS = {"tickformat": ",d"}
SI_TICKS = {"tickformat": "~s"}
MS_TICKS = {"tickformat": ",.3~r", "ticksuffix": " ms", "nticks": 6}
# A right-hand axis picks its own round ticks (plotly's default "sync" copies the left axis's
# count: 2.88, 5.76, 8.63 ms) and draws no second grid.
SECOND_AXIS = {"tickmode": "auto", "nticks": 6, "showgrid": False}
# A horizontal legend under the plot.
LEGEND_BELOW = {"orientation": "h", "y": -0.25, "x": 0}
# Margins (px) of a figure with a right-hand axis, and of one without.
TWO_AXES_MARGIN = {"l": 70, "r": 70, "t": 50, "b": 60}
ONE_AXIS_MARGIN = {"l": 70, "r": 20, "t": 50, "b": 60}


def figure_json(fig: go.Figure, *, title: str, height: int, **layout: Any) -> dict[str, Any]:
    """`fig` with its title, height (px) and `layout` on the shared defaults (room for a
    right-hand axis, the legend below, the white template), as a JSON-able dict."""
    defaults: dict[str, Any] = {
        "margin": TWO_AXES_MARGIN,
        "legend": LEGEND_BELOW,
        "template": "plotly_white",
    }
    fig.update_layout({**defaults, **layout}, title=title, height=height)
    return fig.to_plotly_json()


def plotly_white() -> dict[str, Any]:
    """plotly's "plotly_white" template as JSON (what `template="plotly_white"` embeds)."""
    import plotly.io as pio

    return pio.templates["plotly_white"].to_plotly_json()
