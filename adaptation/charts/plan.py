"""The release page's plan charts: memory per device, the decode and prefill curves and the
multi-device scaling of a plan. Every figure is the planner's prediction, never a measurement,
but the scaling point the `distributed` stage measured on the twin, labelled so."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from adaptation.charts.cache import cached_figure
from adaptation.charts.layout import (
    COUNT_TICKS,
    MS_TICKS,
    SECOND_AXIS,
    SI_TICKS,
    TWO_AXES_MARGIN,
    figure_json,
)
from engine import formatting
from engine.stages.distributed.result import MeasuredScaling
from engine.stages.plan.result import DecodePoint, PrefillPoint, ScalingPoint, Split
from engine.units import GIB

# (key in the plan's memory_per_device_bytes, legend label, colour), bottom of the stack first.
_PLAN_MEMORY_PARTS = (
    ("weights", "weights", "#1d5fb4"),
    ("kv_cache", "KV cache", "#4caf6a"),
    ("activations_workspace", "activations + workspace", "#d9a521"),
    ("runtime_overhead", "runtime overhead", "#8a6fd1"),
    ("free", "free", "#d5dae0"),
)


@cached_figure
def memory_per_device(memory: Mapping[str, float], *, split: Split) -> dict[str, Any] | None:
    """One device's memory under the chosen split, in GiB, as a stacked bar: weights, KV cache,
    activations + workspace, runtime overhead and the free rest up to the device's capacity,
    with the budget (gpu_memory_utilization x capacity) as a dashed line.

    `memory` is a plan result's `memory_per_device_bytes` (`PlanResult`), `split` its split.
    Returns None when it holds no figures. Predicted by the planner from the analysis, not
    measured.
    """
    parts = [
        (label, colour, max(memory[key], 0.0) / GIB)
        for key, label, colour in _PLAN_MEMORY_PARTS
        if key in memory
    ]
    if not parts:
        return None
    fig = go.Figure()
    for label, colour, value in parts:
        fig.add_trace(
            go.Bar(
                x=[value],
                y=[formatting.split(split)],
                orientation="h",
                name=f"{label} (predicted)",
                marker={"color": colour},
                hovertemplate="%{x:,.1f} GiB<extra>%{fullData.name}</extra>",
            )
        )
    budget, capacity = memory.get("budget"), memory.get("capacity")
    if budget:
        share = budget / capacity if capacity else None
        fig.add_vline(
            x=budget / GIB,
            line={"dash": "dash", "width": 2, "color": "#8f1d1d"},
            annotation_text=f"budget {budget / GIB:,.1f} GiB"
            + (f" ({share:.0%} of capacity)" if share else ""),
            annotation_position="top left",
        )
    if capacity:
        fig.add_vline(
            x=capacity / GIB,
            line={"width": 1, "color": "#1d232b"},
            annotation_text=f"capacity {capacity / GIB:,.1f} GiB",
            annotation_position="bottom right",
        )
    return figure_json(
        fig,
        title="Memory per device (predicted)",
        # drawn in half the panel's width: room under the axis title for a legend of 2-3 rows
        height=340,
        barmode="stack",
        xaxis_title="GiB per device",
        yaxis={"automargin": True},
        margin={**TWO_AXES_MARGIN, "b": 120},
        legend={"orientation": "h", "y": -0.3, "yanchor": "top", "x": 0, "traceorder": "normal"},
    )


def _tokens_per_s_and_right_axis(
    fig: go.Figure,
    *,
    title: str,
    x_title: str,
    ticks: Sequence[Any],
    right: dict[str, Any],
) -> dict[str, Any]:
    """A curve chart's layout: counts on a log x axis ticked at `ticks`, tokens/s on the left
    axis from zero, and the `right` axis (its title and tick format) from zero."""
    return figure_json(
        fig,
        title=title,
        height=360,
        xaxis={"title": x_title, "type": "log", "tickvals": ticks, **COUNT_TICKS},
        yaxis={"title": "tokens/s", "rangemode": "tozero", **SI_TICKS},
        yaxis2={
            "title": right["title"],
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            **SECOND_AXIS,
            **{key: value for key, value in right.items() if key != "title"},
        },
    )


def time_axis_unit(seconds: Sequence[float]) -> tuple[float, str]:
    """The scale from seconds and the unit a time axis draws its largest value in, so no
    tick reads "17,702,796 ms": ms below a second, then s, min, h."""
    top = max((abs(value) for value in seconds), default=0.0)
    if top < 1:
        return 1000.0, "ms"
    if top < 600:
        return 1.0, "s"
    if top < 36000:
        return 1 / 60, "min"
    return 1 / 3600, "h"


@cached_figure
def decode_curve(curve: Sequence[DecodePoint]) -> dict[str, Any] | None:
    """Predicted decode throughput (tokens/s over all replicas) and TPOT (ms) against the
    number of concurrent sequences, from batch 1 to the largest batch that fits.

    `curve` is a plan's predicted decode curve (`SpeedPrediction.decode_curve`); None when it
    is empty (no prediction)."""
    if not curve:
        return None
    x = [p.sequences for p in curve]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[p.tokens_per_s for p in curve],
            mode="lines+markers",
            name="decode tokens/s (predicted)",
            hovertemplate="%{x} sequences<br>%{y:,.0f} tokens/s<extra>%{fullData.name}</extra>",
        )
    )
    tpots = [p.tpot_s or 0.0 for p in curve]
    scale, unit = time_axis_unit(tpots)
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[tpot * scale for tpot in tpots],
            customdata=[formatting.ms(tpot) for tpot in tpots],
            mode="lines+markers",
            yaxis="y2",
            line={"dash": "dot"},
            name="TPOT (predicted)",
            hovertemplate="%{x} sequences<br>%{customdata} per token"
            "<extra>%{fullData.name}</extra>",
        )
    )
    return _tokens_per_s_and_right_axis(
        fig,
        title="Decode vs sequences (predicted)",
        x_title="concurrent sequences",
        ticks=x,
        right={"title": "TPOT", **MS_TICKS, "ticksuffix": f" {unit}"},
    )


@cached_figure
def prefill_curve(points: Sequence[PrefillPoint]) -> dict[str, Any] | None:
    """Predicted time to first token (ms) of one prompt against its length in tokens.

    `points` are a plan's predicted prefill points (`SpeedPrediction.prefill`); None when
    there are none (no prediction)."""
    if not points:
        return None
    x = [p.prompt_tokens for p in points]
    ttfts = [p.ttft_s or 0.0 for p in points]
    scale, unit = time_axis_unit(ttfts)
    fig = go.Figure(
        go.Scatter(
            x=x,
            y=[ttft * scale for ttft in ttfts],
            customdata=[formatting.ms(ttft) for ttft in ttfts],
            mode="lines+markers",
            name="TTFT (predicted)",
            hovertemplate="%{x:,} prompt tokens<br>%{customdata}<extra>%{fullData.name}</extra>",
        )
    )
    return figure_json(
        fig,
        title="TTFT vs prompt length (predicted)",
        height=360,
        showlegend=True,
        xaxis={"title": "prompt tokens", "type": "log", "tickvals": x, **COUNT_TICKS},
        # a log axis labels its 2s and 5s without the suffix: the unit goes in the title
        yaxis={"title": f"TTFT ({unit})", "type": "log", "tickformat": MS_TICKS["tickformat"]},
    )


@cached_figure
def scaling_curve(
    scaling: Sequence[ScalingPoint], measured: MeasuredScaling | None = None
) -> dict[str, Any] | None:
    """Predicted decode throughput and per-device efficiency as the device count grows (the
    best fitting split at each count); counts past the pool's size are drawn hollow.

    `scaling` is a plan's scaling curve (`PlanResult.scaling`); None when no point has a
    predicted speed (a pool without a full-size prediction: the panel says why instead).

    `measured` (`DistributedResult.measured_scaling`: processes, efficiency, the split, whether
    it passed) is the scaling efficiency the `distributed` stage measured on the scaled twin,
    drawn as its own marker on
    the efficiency axis. It is not the same ratio as the curve's: the measured one is the
    twin's TP=N step against its TP=1 step on the worker, the predicted one the full model's
    tokens/s per device against the curve's first device count; the legend and the hover say
    so."""
    points = list(scaling)
    if not any(p.tokens_per_s is not None for p in points):
        return None
    x = [p.devices for p in points]
    ticks = list(x)
    splits = [
        formatting.split(p.split) + ("" if p.within_pool else ", past the pool's size")
        for p in points
    ]
    symbols = ["circle" if p.within_pool else "circle-open" for p in points]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[p.tokens_per_s for p in points],
            customdata=splits,
            mode="lines+markers",
            marker={"symbol": symbols, "size": 9},
            name="decode tokens/s (predicted)",
            hovertemplate="%{x} devices, %{customdata}<br>%{y:,.0f} tokens/s"
            "<extra>%{fullData.name}</extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[p.efficiency for p in points],
            customdata=splits,
            mode="lines+markers",
            marker={"symbol": symbols, "size": 9},
            line={"dash": "dot"},
            yaxis="y2",
            name=f"efficiency per device vs {x[0]} {'device' if x[0] == 1 else 'devices'} "
            "(predicted)",
            hovertemplate="%{x} devices, %{customdata}<br>%{y:.2f} x the first count's"
            "<extra>%{fullData.name}</extra>",
        )
    )
    title = "Multi-device scaling (predicted)"
    if measured is not None:
        _measured_scaling_trace(fig, measured, first_devices=x[0])
        ticks = sorted({*ticks, measured.devices})
        title = "Multi-device scaling (predicted; one point measured on the twin)"
    return _tokens_per_s_and_right_axis(
        fig,
        title=title,
        x_title="devices",
        ticks=ticks,
        right={"title": "efficiency per device (1 = linear)", "tickformat": ".2~f"},
    )


def _measured_scaling_trace(
    fig: go.Figure, measured: MeasuredScaling, *, first_devices: Any
) -> None:
    """Add the scaling efficiency measured on the twin to `fig`'s efficiency axis (y2) as a
    single marker."""
    devices, efficiency = measured.devices, measured.efficiency
    split = formatting.validated_split(measured)
    caveat = "" if measured.passed else "<br>its outputs did not match the reference"
    fig.add_trace(
        go.Scatter(
            x=[devices],
            y=[efficiency],
            mode="markers",
            marker={
                "symbol": "diamond",
                "size": 14,
                "color": "#c23b5a",
                "line": {"width": 1, "color": "#5e1212"},
            },
            yaxis="y2",
            name=f"scaling efficiency measured on the twin ({split} vs TP=1)",
            hovertemplate=(
                f"{devices} processes, {split}, on the scaled twin<br>"
                "%{y:.2f} x linear: its TP=1 step time / "
                f"({devices} x its {split.split()[0]} step time) (measured)<br>"
                "the predicted efficiencies are the full model's per device against "
                f"{first_devices} devices, the curve's first count{caveat}"
                "<extra>measured on the twin</extra>"
            ),
        )
    )
