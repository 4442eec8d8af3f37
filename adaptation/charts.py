"""Every chart day0 draws, built as plotly figures and embedded in pages as JSON.

Pages render them with plotly.js served from the plotly package (`static/charts.js` only hands
each embedded figure to `Plotly.newPlot`); no chart is drawn by hand-written JS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from adaptation.models import LayerDrift, PrecisionResult


def _point_label(drift: LayerDrift) -> str:
    """A unique x label per measured module: its path in the twin when known."""
    return drift.name or f"L{drift.layer} {drift.module}"


def precision_layer_drift(results: Iterable[PrecisionResult]) -> dict[str, Any] | None:
    """Each decoder sub-module's own relative error (fed the reference's input) against the
    float32 reference, one line per dtype on a log axis, with the dtype's limit as a dashed
    line: a point above its line is where the port diverges.

    `results` must have their `layers` prefetched. Returns the figure as a JSON-able dict, or
    None when no module was measured. Every point is measured on the pool's device.
    """
    fig = go.Figure()
    for result in results:
        layers = [d for d in result.layers.all() if _local_error(d) is not None]
        if not layers:
            continue
        x = [_point_label(d) for d in layers]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[max(_local_error(d), 1e-12) for d in layers],
                mode="lines+markers",
                name=f"{result.dtype} ({'passed' if result.passed else 'failed'})",
                hovertemplate="%{x}<br>relative error %{y:.3g}<extra>%{fullData.name}</extra>",
            )
        )
        if result.max_local_relative_error:
            fig.add_trace(
                go.Scatter(
                    x=[x[0], x[-1]],
                    y=[result.max_local_relative_error] * 2,
                    mode="lines",
                    line={"dash": "dash", "width": 1},
                    name=f"{result.dtype} limit",
                    hoverinfo="skip",
                )
            )
        if result.first_divergent_layer is not None:
            fig.add_annotation(
                x=result.first_divergent_name
                or f"L{result.first_divergent_layer} {result.first_divergent_module}",
                y=0,
                yref="paper",
                text=f"{result.dtype} diverges",
                showarrow=True,
                arrowhead=2,
            )
    if not fig.data:
        return None
    fig.update_layout(
        title="Per-module error of the scaled twin vs float32 (measured)",
        xaxis_title="decoder layer sub-module",
        yaxis_title="relative error of the module's own output",
        yaxis_type="log",
        height=440,
        margin={"l": 60, "r": 20, "t": 50, "b": 170},
        legend={"orientation": "h", "y": -0.45, "x": 0},
        template="plotly_white",
    )
    return fig.to_plotly_json()


def _local_error(drift: LayerDrift) -> float | None:
    """The module's own error; rows stored before local errors were measured have only the
    accumulated one."""
    if drift.local_relative_error is not None:
        return drift.local_relative_error
    return drift.relative_error


# --- distributed plan: every figure below is the planner's prediction, never a measurement ---

GIB = 2**30

# (key in the plan's memory_per_device_bytes, legend label, colour), bottom of the stack first.
_PLAN_MEMORY_PARTS = (
    ("weights", "weights", "#1d5fb4"),
    ("kv_cache", "KV cache", "#4caf6a"),
    ("activations_workspace", "activations + workspace", "#d9a521"),
    ("runtime_overhead", "runtime overhead", "#8a6fd1"),
    ("free", "free", "#d5dae0"),
)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _plan_layout(fig: go.Figure, *, title: str, height: int, **layout: Any) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "margin": {"l": 70, "r": 70, "t": 50, "b": 60},
        "legend": {"orientation": "h", "y": -0.25, "x": 0},
        "template": "plotly_white",
    }
    fig.update_layout({**defaults, **layout}, title=title, height=height)
    return fig.to_plotly_json()


def plan_memory_per_device(memory: Mapping[str, Any], *, split_label: str) -> dict[str, Any] | None:
    """One device's memory under the chosen split, in GiB, as a stacked bar: weights, KV cache,
    activations + workspace, runtime overhead and the free rest up to the device's capacity,
    with the budget (gpu_memory_utilization x capacity) as a dashed line.

    `memory` is a plan result's `memory_per_device_bytes`. Returns None when it holds no
    figures. Predicted by the planner from the analysis, not measured.
    """
    parts = [
        (label, colour, max(_number(memory.get(key)) or 0.0, 0.0) / GIB)
        for key, label, colour in _PLAN_MEMORY_PARTS
        if _number(memory.get(key)) is not None
    ]
    if not parts:
        return None
    fig = go.Figure()
    for label, colour, value in parts:
        fig.add_trace(
            go.Bar(
                x=[value],
                y=[split_label],
                orientation="h",
                name=f"{label} (predicted)",
                marker={"color": colour},
                hovertemplate="%{x:,.1f} GiB<extra>%{fullData.name}</extra>",
            )
        )
    budget, capacity = _number(memory.get("budget")), _number(memory.get("capacity"))
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
    return _plan_layout(
        fig,
        title="Memory per device (predicted)",
        height=280,
        barmode="stack",
        xaxis_title="GiB per device",
        yaxis={"automargin": True},
        legend={"orientation": "h", "y": -0.25, "x": 0, "traceorder": "normal"},
    )


def plan_decode_curve(predicted: Mapping[str, Any]) -> dict[str, Any] | None:
    """Predicted decode throughput (tokens/s over all replicas) and TPOT (ms) against the
    number of concurrent sequences, from batch 1 to the largest batch that fits.

    `predicted` is a plan result's `predicted`; None when it has no decode curve."""
    curve = [p for p in predicted.get("decode_curve") or [] if isinstance(p, Mapping)]
    if not predicted.get("available") or not curve:
        return None
    x = [p.get("concurrent_sequences") for p in curve]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[p.get("decode_tokens_per_s") for p in curve],
            mode="lines+markers",
            name="decode tokens/s (predicted)",
            hovertemplate="%{x} sequences<br>%{y:,.0f} tokens/s<extra>%{fullData.name}</extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[(_number(p.get("tpot_s")) or 0.0) * 1000 for p in curve],
            mode="lines+markers",
            yaxis="y2",
            line={"dash": "dot"},
            name="TPOT ms (predicted)",
            hovertemplate="%{x} sequences<br>%{y:,.1f} ms per token<extra>%{fullData.name}</extra>",
        )
    )
    return _plan_layout(
        fig,
        title="Decode vs concurrent sequences (predicted)",
        height=360,
        xaxis={"title": "concurrent sequences", "type": "log", "tickvals": x},
        yaxis={"title": "tokens/s", "rangemode": "tozero"},
        yaxis2={
            "title": "TPOT (ms)",
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "tickformat": ".1f",
        },
    )


def plan_prefill_curve(predicted: Mapping[str, Any]) -> dict[str, Any] | None:
    """Predicted time to first token (ms) of one prompt against its length in tokens.

    `predicted` is a plan result's `predicted`; None when it has no prefill points."""
    points = [p for p in predicted.get("prefill") or [] if isinstance(p, Mapping)]
    if not predicted.get("available") or not points:
        return None
    x = [p.get("prompt_tokens") for p in points]
    fig = go.Figure(
        go.Scatter(
            x=x,
            y=[(_number(p.get("ttft_s")) or 0.0) * 1000 for p in points],
            mode="lines+markers",
            name="TTFT ms (predicted)",
            hovertemplate="%{x:,} prompt tokens<br>%{y:,.1f} ms<extra>%{fullData.name}</extra>",
        )
    )
    return _plan_layout(
        fig,
        title="Time to first token vs prompt length (predicted)",
        height=360,
        showlegend=True,
        xaxis={"title": "prompt tokens", "type": "log", "tickvals": x},
        yaxis={"title": "TTFT (ms)", "type": "log"},
    )


def plan_scaling_curve(scaling: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Predicted decode throughput and per-device efficiency as the device count grows (the
    best fitting split at each count); counts past the pool's size are drawn hollow.

    `scaling` is a plan result's `scaling`; None when it has fewer than one point."""
    points = [p for p in scaling if isinstance(p, Mapping) and p.get("devices")]
    if not points:
        return None
    x = [p["devices"] for p in points]
    splits = [
        f"TP{p.get('tp')} PP{p.get('pp')} EP{p.get('ep')} DP{p.get('dp')}"
        + ("" if p.get("within_pool", True) else ", past the pool's size")
        for p in points
    ]
    symbols = ["circle" if p.get("within_pool", True) else "circle-open" for p in points]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[p.get("decode_tokens_per_s") for p in points],
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
            y=[p.get("efficiency_per_device") for p in points],
            customdata=splits,
            mode="lines+markers",
            marker={"symbol": symbols, "size": 9},
            line={"dash": "dot"},
            yaxis="y2",
            name="efficiency per device (predicted)",
            hovertemplate="%{x} devices, %{customdata}<br>%{y:.2f} x the first count's"
            "<extra>%{fullData.name}</extra>",
        )
    )
    return _plan_layout(
        fig,
        title="Multi-device scaling (predicted)",
        height=360,
        xaxis={"title": "devices", "type": "log", "tickvals": x},
        yaxis={"title": "tokens/s", "rangemode": "tozero"},
        yaxis2={
            "title": "efficiency per device (1 = linear)",
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "tickformat": ".2f",
        },
    )


def compare_pools_throughput(
    rows: Sequence[tuple[str, float | None, float | None]],
) -> dict[str, Any] | None:
    """Predicted decode tokens/s per pool or accelerator kind, at batch 1 and at the largest
    batch that fits, as grouped horizontal bars (best first, at the top).

    `rows` are (label, tokens/s at batch 1, tokens/s at the largest batch); rows without a
    prediction are left out. None when no row has one."""
    shown = [r for r in rows if r[1] is not None or r[2] is not None]
    if not shown:
        return None
    labels = [r[0] for r in shown]
    fig = go.Figure()
    for index, name in ((2, "at the largest batch (predicted)"), (1, "at batch 1 (predicted)")):
        fig.add_trace(
            go.Bar(
                x=[r[index] for r in shown],
                y=labels,
                orientation="h",
                name=f"decode tokens/s {name}",
                hovertemplate="%{y}<br>%{x:,.0f} tokens/s<extra>%{fullData.name}</extra>",
            )
        )
    return _plan_layout(
        fig,
        title="Decode tokens/s per pool (predicted)",
        height=max(260, 60 + 44 * len(shown)),
        barmode="group",
        xaxis_title="tokens/s",
        yaxis={"autorange": "reversed", "automargin": True},
    )
