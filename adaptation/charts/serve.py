"""The release page's serving-engine charts: the `serve` stage's load sweep through the engine
beside the plan's prediction, and the engine's own metrics over the sweep.

Every measured figure is the engine's serving the scaled twin (or, for a small release, its
real weights: `checkpoint_kind` "real"); the predicted ones are the planner's step-time model
for the full-size model on the plan's split. The two never share a curve or an axis: the sweep chart
draws them in separate rows of panels, and every trace name says which it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from adaptation.charts.cache import cached_figure
from adaptation.charts.layout import (
    COUNT_TICKS,
    LEGEND_BELOW,
    ONE_AXIS_MARGIN,
    SECOND_AXIS,
    SI_TICKS,
    TWO_AXES_MARGIN,
    figure_json,
)
from engine.formatting import finite
from engine.stages.plan.result import DecodePoint
from engine.stages.serve.full_size_result import Level, MetricsSample
from engine.stages.serve.result import Knee

# What a checkpoint kind is called in a measured trace's name.
CHECKPOINT_WORDS = {
    "twin": "twin",
    "real": "real weights",
    "full-size": "full size, dummy weights",
}
MEASURED_COLOUR = "#1d5fb4"
TPOT_COLOUR = "#b4541d"
PREDICTED_COLOUR = "#5d6875"


def measured_label(checkpoint_kind: str) -> str:
    """How a measured trace says what it is: "measured, engine, twin"."""
    return f"measured, engine, {CHECKPOINT_WORDS.get(checkpoint_kind, 'twin')}"


def predicted_label(split: str) -> str:
    """How a predicted trace says what it is: "predicted, full-size, TP2 PP1 EP1 DP1"."""
    return "predicted, full-size" + (f", {split}" if split else "")


def _ms(seconds: Any) -> float | None:
    value = finite(seconds)
    return None if value is None else value * 1000


@cached_figure
def sweep(
    levels: Sequence[Level],
    *,
    knee: Knee | None,
    predicted: Sequence[DecodePoint],
    checkpoint_kind: str,
    predicted_split: str = "",
) -> dict[str, Any] | None:
    """Output tokens/s and TPOT p50 (ms) against concurrency, as measured through the engine
    (`levels`: the serve result's sweep, `ServeResult.sweep`), with the sweep's `knee` marked;
    below them, in
    their own panels, the plan's predicted decode tokens/s and TPOT at its batch sizes
    (`predicted`: the plan's `SpeedPrediction.decode_curve`, empty when it made none) for its
    split (`predicted_split`, as the planner writes it). None without a measured level.

    Each trace's `meta` says what it is ({"kind": "measured" | "predicted", "metric",
    "role": "curve" | "knee"})."""
    points = [
        p
        for p in levels
        if p.concurrency is not None
        and (p.output_tokens_per_s is not None or p.tpot_s_p50 is not None)
    ]
    if not points:
        return None
    curve = [p for p in predicted if p.sequences is not None and p.tokens_per_s is not None]
    measured = measured_label(checkpoint_kind)
    forecast = predicted_label(predicted_split)
    rows = 2 if curve else 1
    fig = make_subplots(
        rows=rows,
        cols=2,
        subplot_titles=[
            # short enough for two side by side at 1024 px: the x axes name what they sweep
            f"Output tokens/s ({measured})",
            f"TPOT p50 ({measured})",
            *(
                [
                    f"Decode tokens/s ({forecast})",
                    f"TPOT ({forecast})",
                ]
                if curve
                else []
            ),
        ],
        vertical_spacing=0.24 if curve else 0.0,
        horizontal_spacing=0.12,
    )
    x = [p.concurrency for p in points]
    errors = [p.errors for p in points]
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[p.output_tokens_per_s for p in points],
            customdata=errors,
            mode="lines+markers",
            line={"color": MEASURED_COLOUR},
            name=f"output tokens/s ({measured})",
            meta={"kind": "measured", "metric": "output_tokens_per_s", "role": "curve"},
            hovertemplate="concurrency %{x}<br>%{y:,.1f} tokens/s<br>%{customdata} errors"
            "<extra>%{fullData.name}</extra>",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[_ms(p.tpot_s_p50) for p in points],
            customdata=[_ms(p.tpot_s_p95) for p in points],
            mode="lines+markers",
            line={"color": TPOT_COLOUR},
            name=f"TPOT p50 ({measured})",
            meta={"kind": "measured", "metric": "tpot_s_p50", "role": "curve"},
            hovertemplate="concurrency %{x}<br>p50 %{y:,.2f} ms per token"
            "<br>p95 %{customdata:,.2f} ms<extra>%{fullData.name}</extra>",
        ),
        row=1,
        col=2,
    )
    if knee is not None:
        knee_at = knee.concurrency
        for col, key, value in (
            (1, "output_tokens_per_s", knee.output_tokens_per_s),
            (2, "tpot_s_p50", _ms(knee.tpot_s_p50)),
        ):
            if value is None:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[knee_at],
                    y=[value],
                    mode="markers",
                    marker={"symbol": "star", "size": 14, "color": "#8f1d1d"},
                    name=f"knee at concurrency {knee_at:g} ({measured})",
                    legendgroup="knee",
                    showlegend=col == 1,
                    meta={"kind": "measured", "metric": key, "role": "knee"},
                    hovertemplate="knee: concurrency %{x}<extra>%{fullData.name}</extra>",
                ),
                row=1,
                col=col,
            )
    if curve:
        px = [p.sequences for p in curve]
        fig.add_trace(
            go.Scatter(
                x=px,
                y=[p.tokens_per_s for p in curve],
                mode="lines+markers",
                line={"color": PREDICTED_COLOUR, "dash": "dot"},
                name=f"decode tokens/s ({forecast})",
                meta={"kind": "predicted", "metric": "decode_tokens_per_s", "role": "curve"},
                hovertemplate="%{x} sequences<br>%{y:,.0f} tokens/s<extra>%{fullData.name}</extra>",
            ),
            row=2,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=px,
                y=[_ms(p.tpot_s) for p in curve],
                mode="lines+markers",
                line={"color": PREDICTED_COLOUR, "dash": "dash"},
                name=f"TPOT ({forecast})",
                meta={"kind": "predicted", "metric": "tpot_s", "role": "curve"},
                hovertemplate="%{x} sequences<br>%{y:,.2f} ms per token"
                "<extra>%{fullData.name}</extra>",
            ),
            row=2,
            col=2,
        )
    axes = [(1, x, "concurrency (requests in flight)")]
    if curve:
        axes.append((2, [p.sequences for p in curve], "concurrent sequences"))
    for row, ticks, x_title in axes:
        for col in (1, 2):
            fig.update_xaxes(
                type="log", tickvals=ticks, title_text=x_title, row=row, col=col, **COUNT_TICKS
            )
        fig.update_yaxes(title_text="tokens/s", rangemode="tozero", row=row, col=1, **SI_TICKS)
        fig.update_yaxes(title_text="ms per token", rangemode="tozero", row=row, col=2)
    return figure_json(
        fig,
        title="Load sweep through the serving engine",
        height=440 if rows == 1 else 660,
        # room between the chart's title and the panels' own
        margin={**ONE_AXIS_MARGIN, "t": 90},
        legend={**LEGEND_BELOW, "y": -0.18 if rows == 1 else -0.1},
    )


@cached_figure
def engine_metrics(
    series: Sequence[MetricsSample], *, checkpoint_kind: str
) -> dict[str, Any] | None:
    """The engine's Prometheus metrics over the sweep (`series`: the serve result's
    `EngineMetrics.samples`, or the full-size run's, seconds since the first sample):
    KV-cache usage (a fraction, drawn as %) on the left axis, running and waiting requests on
    the right. None without a sample that has one of them."""
    samples = [
        s
        for s in series
        if s.t_s is not None
        and any(value is not None for value in (s.kv_cache_usage, s.running, s.waiting))
    ]
    if not samples:
        return None
    measured = measured_label(checkpoint_kind)
    t = [s.t_s for s in samples]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=t,
            y=[None if s.kv_cache_usage is None else s.kv_cache_usage * 100 for s in samples],
            mode="lines",
            line={"color": MEASURED_COLOUR, "width": 2},
            fill="tozeroy",
            fillcolor="rgba(29, 95, 180, 0.2)",
            name=f"KV-cache usage ({measured})",
            meta={"kind": "measured", "metric": "kv_cache_usage", "role": "curve"},
            hovertemplate="%{x:,.1f} s<br>%{y:,.1f} %<extra>%{fullData.name}</extra>",
        )
    )
    for key, word, colour, dash in (
        ("running", "running requests", "#2e7d4f", "solid"),
        ("waiting", "waiting requests", "#d9a521", "dot"),
    ):
        fig.add_trace(
            go.Scatter(
                x=t,
                y=[getattr(s, key) for s in samples],
                mode="lines",
                line={"color": colour, "dash": dash, "shape": "hv"},
                yaxis="y2",
                name=f"{word} ({measured})",
                meta={"kind": "measured", "metric": key, "role": "curve"},
                hovertemplate="%{x:,.1f} s<br>%{y} requests<extra>%{fullData.name}</extra>",
            )
        )
    return figure_json(
        fig,
        title=f"Engine metrics over the sweep ({measured})",
        height=360,
        margin=TWO_AXES_MARGIN,
        xaxis={"title": "time since the first sample (s)"},
        # Auto-ranged from 0: a twin's KV use is a fraction of a percent of the cache.
        yaxis={"title": "KV-cache usage (%)", "rangemode": "tozero", "ticksuffix": " %"},
        yaxis2={
            "title": "requests",
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            **SECOND_AXIS,
            **COUNT_TICKS,
        },
    )
