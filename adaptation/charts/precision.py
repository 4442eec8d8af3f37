"""The release page's precision chart: each module's own error in the scaled twin against
the float32 reference (measured on the pool's device)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from adaptation.charts.cache import cached_figure
from adaptation.charts.layout import figure_json
from adaptation.models import LayerDrift, PrecisionResult


def _point_label(drift: LayerDrift) -> str:
    """A unique x label per measured module: its path in the twin when known."""
    return drift.name or f"L{drift.layer} {drift.module}"


def drift_series(results: Iterable[PrecisionResult]) -> list[dict[str, Any]]:
    """What `layer_drift` draws of each result (`layers` prefetched), as data: its dtype,
    whether it passed, its limit, where it first diverged, and each measured module's label
    and own relative error."""
    series = []
    for result in results:
        points = [
            (_point_label(d), error)
            for d in result.layers.all()
            if (error := _local_error(d)) is not None
        ]
        series.append(
            {
                "dtype": result.dtype,
                "passed": result.passed,
                "limit": result.max_local_relative_error,
                "diverged_at": (
                    result.first_divergent_name
                    or f"L{result.first_divergent_layer} {result.first_divergent_module}"
                )
                if result.first_divergent_layer is not None
                else None,
                "labels": [label for label, _ in points],
                "errors": [error for _, error in points],
            }
        )
    return series


def layer_drift(results: Iterable[PrecisionResult]) -> dict[str, Any] | None:
    """Each decoder sub-module's own relative error (fed the reference's input) against the
    float32 reference, one line per dtype on a log axis, with the dtype's limit as a dashed
    line: a point above its line is where the port diverges.

    `results` must have their `layers` prefetched. Returns the figure as a JSON-able dict, or
    None when no module was measured. Every point is measured on the pool's device.
    """
    return drift_figure(drift_series(results))


@cached_figure
def drift_figure(series: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """`layer_drift`'s figure of `drift_series`; None when no module was measured."""
    fig = go.Figure()
    for result in series:
        x = result["labels"]
        if not x:
            continue
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[max(error, 1e-12) for error in result["errors"]],
                mode="lines+markers",
                name=f"{result['dtype']} ({'passed' if result['passed'] else 'failed'})",
                hovertemplate="%{x}<br>relative error %{y:.3g}<extra>%{fullData.name}</extra>",
            )
        )
        if result["limit"]:
            fig.add_trace(
                go.Scatter(
                    x=[x[0], x[-1]],
                    y=[result["limit"]] * 2,
                    mode="lines",
                    line={"dash": "dash", "width": 1},
                    name=f"{result['dtype']} limit",
                    hoverinfo="skip",
                )
            )
        if result["diverged_at"] is not None:
            # Each dtype's arrow a line higher than the last, so two at one module stay apart.
            fig.add_annotation(
                x=result["diverged_at"],
                y=0,
                yref="paper",
                text=f"{result['dtype']} diverges",
                showarrow=True,
                arrowhead=2,
                ay=-30 - 16 * len(fig.layout.annotations),
            )
    if not fig.data:
        return None
    return figure_json(
        fig,
        title="Per-module error of the scaled twin vs float32 (measured)",
        height=440,
        xaxis_title="decoder layer sub-module",
        yaxis_title="relative error of the module's own output",
        yaxis_type="log",
        margin={"l": 60, "r": 20, "t": 50, "b": 170},
        legend={"orientation": "h", "y": -0.45, "x": 0},
    )


def _local_error(drift: LayerDrift) -> float | None:
    """The module's own error; rows stored before local errors were measured have only the
    accumulated one."""
    if drift.local_relative_error is not None:
        return drift.local_relative_error
    return drift.relative_error
