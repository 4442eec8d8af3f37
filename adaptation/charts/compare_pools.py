"""The compare-pools page's chart: predicted decode tokens/s of every pool and kind that fits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from adaptation.charts.layout import SI_TICKS, figure_json


def throughput(
    rows: Sequence[tuple[str, int | None, float | None, float | None]],
) -> dict[str, Any] | None:
    """Predicted decode tokens/s per pool or accelerator kind, at batch 1 and at the largest
    batch that fits, as grouped horizontal bars (best first, at the top).

    `rows` are (pool or kind, devices of its split, tokens/s at batch 1, tokens/s at the
    largest batch); rows without a prediction are left out. None when no row has one."""
    shown = [r for r in rows if r[2] is not None or r[3] is not None]
    if not shown:
        return None
    labels = [
        f"{name} ({devices} device{'' if devices == 1 else 's'})" for name, devices, *_ in shown
    ]
    fig = go.Figure()
    for index, name in ((3, "at the largest batch (predicted)"), (2, "at batch 1 (predicted)")):
        fig.add_trace(
            go.Bar(
                x=[r[index] for r in shown],
                y=labels,
                orientation="h",
                name=f"decode tokens/s {name}",
                hovertemplate="%{y}<br>%{x:,.0f} tokens/s<extra>%{fullData.name}</extra>",
            )
        )
    return figure_json(
        fig,
        title="Decode tokens/s per pool (predicted)",
        height=max(260, 60 + 44 * len(shown)),
        barmode="group",
        xaxis={"title": "tokens/s", **SI_TICKS},
        yaxis={"autorange": "reversed", "automargin": True},
    )
