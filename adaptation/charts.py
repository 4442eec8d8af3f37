"""Every chart day0 draws, built as plotly figures and embedded in pages as JSON.

Pages render them with plotly.js served from the plotly package (`static/charts.js` only hands
each embedded figure to `Plotly.newPlot`); no chart is drawn by hand-written JS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from adaptation.models import LayerDrift, PrecisionResult
from engine.formatting import finite as _number
from engine.units import GIB


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
# (but for the scaling point the `distributed` stage measured on the twin, labelled so)

# (key in the plan's memory_per_device_bytes, legend label, colour), bottom of the stack first.
_PLAN_MEMORY_PARTS = (
    ("weights", "weights", "#1d5fb4"),
    ("kv_cache", "KV cache", "#4caf6a"),
    ("activations_workspace", "activations + workspace", "#d9a521"),
    ("runtime_overhead", "runtime overhead", "#8a6fd1"),
    ("free", "free", "#d5dae0"),
)


# Tick labels (d3 formats): counts in full with separators ("32,768", not "32.768k"),
# throughputs with an SI suffix ("15k"), milliseconds with their unit ("15 ms").
_COUNT_TICKS = {"tickformat": ",d"}
_SI_TICKS = {"tickformat": "~s"}
_MS_TICKS = {"tickformat": ",.3~r", "ticksuffix": " ms", "nticks": 6}
# A right-hand axis picks its own round ticks (plotly's default "sync" copies the left axis's
# count: 2.88, 5.76, 8.63 ms) and draws no second grid.
_SECOND_AXIS = {"tickmode": "auto", "nticks": 6, "showgrid": False}


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
        xaxis={"title": "concurrent sequences", "type": "log", "tickvals": x, **_COUNT_TICKS},
        yaxis={"title": "tokens/s", "rangemode": "tozero", **_SI_TICKS},
        yaxis2={
            "title": "TPOT",
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            **_SECOND_AXIS,
            **_MS_TICKS,
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
        xaxis={"title": "prompt tokens", "type": "log", "tickvals": x, **_COUNT_TICKS},
        # a log axis labels its 2s and 5s without the suffix: the unit goes in the title
        yaxis={"title": "TTFT (ms)", "type": "log", "tickformat": _MS_TICKS["tickformat"]},
    )


def plan_scaling_curve(
    scaling: Sequence[Mapping[str, Any]], measured: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """Predicted decode throughput and per-device efficiency as the device count grows (the
    best fitting split at each count); counts past the pool's size are drawn hollow.

    `scaling` is a plan result's `scaling`; None when no point has a predicted speed (a
    pool without a roofline prediction: the panel says why instead).

    `measured` (`plan_presenters.measured_scaling`: "devices", "efficiency", "split",
    "passed") is the scaling efficiency the `distributed` stage measured on the scaled twin,
    drawn as its own marker on the efficiency axis. It is not the same ratio as the curve's:
    the measured one is the twin's TP=N step against its TP=1 step on the worker, the predicted
    one the full model's tokens/s per device against the curve's first device count; the
    legend and the hover say so."""
    points = [p for p in scaling if isinstance(p, Mapping) and p.get("devices")]
    if not any(_number(p.get("decode_tokens_per_s")) is not None for p in points):
        return None
    x = [p["devices"] for p in points]
    ticks = list(x)
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
            name=f"efficiency per device vs {x[0]} {'device' if x[0] == 1 else 'devices'} "
            "(predicted)",
            hovertemplate="%{x} devices, %{customdata}<br>%{y:.2f} x the first count's"
            "<extra>%{fullData.name}</extra>",
        )
    )
    title = "Multi-device scaling (predicted)"
    if measured is not None and _measured_scaling_trace(fig, measured, first_devices=x[0]):
        ticks = sorted({*ticks, measured["devices"]})
        title = "Multi-device scaling (predicted; one point measured on the twin)"
    return _plan_layout(
        fig,
        title=title,
        height=360,
        xaxis={"title": "devices", "type": "log", "tickvals": ticks, **_COUNT_TICKS},
        yaxis={"title": "tokens/s", "rangemode": "tozero", **_SI_TICKS},
        yaxis2={
            "title": "efficiency per device (1 = linear)",
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            **_SECOND_AXIS,
            "tickformat": ".2~f",
        },
    )


def _measured_scaling_trace(
    fig: go.Figure, measured: Mapping[str, Any], *, first_devices: Any
) -> bool:
    """Add the scaling efficiency measured on the twin to `fig`'s efficiency axis (y2) as a
    single marker; False (nothing drawn) without a device count and an efficiency."""
    devices, efficiency = measured.get("devices"), _number(measured.get("efficiency"))
    if efficiency is None or not isinstance(devices, int) or isinstance(devices, bool):
        return False
    split = str(measured.get("split") or f"TP={devices}")
    caveat = (
        "" if measured.get("passed") is not False else "<br>its outputs did not match the reference"
    )
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
    return True


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
        xaxis={"title": "tokens/s", **_SI_TICKS},
        yaxis={"autorange": "reversed", "automargin": True},
    )


# --- performance and stability: measured on the scaled twin, or predicted, never mixed -------

# One colour per dtype, the same on every chart and page (torch names, then the planner's).
_DTYPE_COLOURS = {
    "float32": "#1d5fb4",
    "bfloat16": "#d9731a",
    "float16": "#2e9e5b",
    "int8": "#8a4fc7",
    "float8_e4m3fn": "#c23b5a",
    "checkpoint": "#5d6875",
    "fp8": "#c23b5a",
}
_SPARE_COLOURS = ("#0f8a8a", "#a68a00", "#6b4226", "#e377c2", "#17becf", "#7f7f7f")
# Line dash per compared source (job) for the primary curve, and for a calibration curve
# (the roofline's prediction for the twin itself, drawn beside the twin's measurement).
# Line dash says only measured (solid) or predicted (dotted; a calibrated prediction dashed).
_KIND_DASH = {"measured": "solid", "predicted": "dot", "calibrated": "dash"}
# Colour family per compared source (job): its dtypes take the family's shades in turn.
_SOURCE_FAMILIES = (
    ("#1f4e9c", "#4f86d6", "#8fb3e8", "#0b2c5f"),
    ("#b34d00", "#e07b1a", "#f2b36b", "#6e2f00"),
    ("#2e7d32", "#66bb6a", "#a5d6a7", "#1b4d1e"),
    ("#6a1b9a", "#ab47bc", "#ce93d8", "#3d0f5a"),
)
# Marker per value of the swept field that is not on the x axis (e.g. per prompt length).
_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "star-diamond", "hexagon")
# Which model a row's figures belong to, in the order the chart's rows of panels go.
_MODEL_PANELS = (
    ("twin", "scaled twin, this pool's device"),
    ("release", "the release at full size, this pool's device"),
    ("full-size", "full-size model, the planner's roofline"),
)
LOG_Y_SPAN = 30.0
PERFORMANCE_X_TITLES = {
    "batch_size": "batch size (sequences)",
    "prompt_len": "prompt length (tokens)",
    "dtype": "dtype",
}
_DTYPE_ORDER = tuple(_DTYPE_COLOURS)
MIB = 2**20


def dtype_colour(dtype: str, seen: list[str]) -> str:
    """The colour of `dtype`: a fixed one for the known dtypes, else the next spare one
    (`seen` remembers the order unknown dtypes came in)."""
    if dtype in _DTYPE_COLOURS:
        return _DTYPE_COLOURS[dtype]
    if dtype not in seen:
        seen.append(dtype)
    return _SPARE_COLOURS[seen.index(dtype) % len(_SPARE_COLOURS)]


def curve_label(kind: str, model: str, variant: str = "") -> str:
    """Whose figure a curve is, as every trace name says it (`variant` "calibrated": the
    full-size prediction corrected by the pool's running calibration)."""
    if variant:
        return f"{curve_label(kind, model)}, {variant}"
    if kind == "measured" and model == "twin":
        return "measured, twin"
    if kind == "predicted" and model == "twin":
        return "predicted, twin (roofline on this device)"
    if kind == "predicted" and model == "full-size":
        return "predicted, full-size model"
    if kind == "measured" and model == "release":
        return "measured, release at full size"
    return f"{kind}, {model}"


# A full-size prediction corrected by the pool's running calibration is stored as the raw
# metric's name with this prefix ("calibrated_decode_tokens_per_s"); it is drawn beside the raw
# curve, on the same panel, as its "calibrated" variant.
CALIBRATED_PREFIX = "calibrated_"


def _with_variant(row: Mapping[str, Any], names: Sequence[str]) -> Mapping[str, Any]:
    metric = str(row["metric"])
    base = metric.removeprefix(CALIBRATED_PREFIX)
    if base != metric and base in names:
        return {**row, "metric": base, "variant": "calibrated"}
    return {**row, "variant": ""}


def _dtype_key(dtype: str) -> tuple[int, str]:
    return (_DTYPE_ORDER.index(dtype) if dtype in _DTYPE_ORDER else len(_DTYPE_ORDER), dtype)


def _x_key(x: str, value: Any) -> Any:
    return _dtype_key(str(value)) if x == "dtype" else value


def _others(x: str) -> tuple[str, ...]:
    """The swept fields that are not on the x axis (a curve holds them fixed)."""
    return tuple(f for f in ("dtype", "batch_size", "prompt_len") if f != x)


def _other_text(field_name: str, value: Any) -> str:
    if field_name == "batch_size":
        return f"batch {value}" if value is not None else "batch —"
    if field_name == "prompt_len":
        return f"prompt {value}" if value is not None else "full context"
    return str(value)


# Stands for "one point each at several values" of a field off the x axis (see
# `_merge_single_points`).
MERGED = "*"


def _merge_single_points(
    curves: dict[tuple, list[Mapping[str, Any]]], others: tuple[str, ...], x: str
) -> dict[tuple, list[Mapping[str, Any]]]:
    """Curves of one point each, at the same x, that differ only in a field off the x axis
    (the full-size prefill predictions on a batch axis: batch 1, one per prompt length) become
    one trace whose points say their value, instead of a legend entry each."""
    groups: dict[tuple, list[tuple]] = {}
    for key in curves:
        fixed = tuple(v if f == "dtype" else None for f, v in zip(others, key[4:], strict=True))
        groups.setdefault(key[:4] + fixed, []).append(key)
    merged: dict[tuple, list[Mapping[str, Any]]] = {}
    for keys in groups.values():
        single = all(len(curves[k]) == 1 for k in keys)
        if len(keys) > 1 and single and len({curves[k][0][x] for k in keys}) == 1:
            varying = [i for i in range(len(others)) if len({k[4 + i] for k in keys}) > 1]
            first = keys[0]
            key = first[:4] + tuple(
                MERGED if i in varying else first[4 + i] for i in range(len(others))
            )
            merged[key] = sorted(
                (curves[k][0] for k in keys),
                key=lambda r: tuple((r[others[i]] is None, r[others[i]] or 0) for i in varying),
            )
        else:
            merged.update((k, curves[k]) for k in keys)
    return merged


def _merged_text(field_name: str, points: Sequence[Mapping[str, Any]]) -> str:
    values = sorted(p[field_name] for p in points if p.get(field_name) is not None)
    word = {"batch_size": "batches", "prompt_len": "prompts"}.get(field_name, field_name)
    if not values:
        return f"{word} —"
    return f"{word} {values[0]:,} to {values[-1]:,}, one point each"


def prompt_only_series(rows: Iterable[Mapping[str, Any]]) -> set[tuple]:
    """(model, kind, variant, metric, dtype) of the series that sweep only the prompt length:
    one batch size, several prompt lengths (the full-size prefill predictions, all at batch
    1). On a batch axis they would stack at one x; they belong on the prompt-length axis."""
    batches: dict[tuple, set[Any]] = {}
    prompts: dict[tuple, set[Any]] = {}
    for r in rows:
        key = (r["model"], r["kind"], r.get("variant", ""), r["metric"], r["dtype"])
        batches.setdefault(key, set()).add(r.get("batch_size"))
        prompts.setdefault(key, set()).add(r.get("prompt_len"))
    return {k for k, b in batches.items() if len(b) == 1 and len(prompts[k] - {None}) > 1}


def _legend_lines(names: Sequence[str], width: float = 1100.0) -> int:
    """About how many lines a horizontal legend of `names` takes at `width` px."""
    lines, used = 0, width
    for name in names:
        entry = 50 + 6.8 * len(name)
        if used + entry > width:
            lines, used = lines + 1, 0.0
        used += entry
    return lines


def _legend_below(fig: go.Figure, *, plot_height: int, top: int, bottom: int) -> None:
    """Put the legend under the panels with room for all its lines (no clipped scroll box):
    the figure grows by the legend's height, the legend sits in the bottom margin."""
    names = [t.name for t in fig.data if t.showlegend is not False and t.name]
    legend_px = 22 * _legend_lines(names) + 10
    height = plot_height + top + bottom + legend_px
    fig.update_layout(
        height=height,
        margin={"l": 90, "r": 30, "t": top, "b": bottom + legend_px},
        legend={
            "orientation": "h",
            "x": 0,
            "xanchor": "left",
            "yref": "container",
            "y": (legend_px + 4) / height,
            "yanchor": "top",
        },
    )


def _model_panels(rows: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    models = list(dict.fromkeys(str(r["model"]) for r in rows))
    known = [(m, title) for m, title in _MODEL_PANELS if m in models]
    extra = [(m, m) for m in sorted(set(models) - {m for m, _ in _MODEL_PANELS})]
    return known + extra


def performance_curves(
    sources: Sequence[Mapping[str, Any]],
    *,
    metrics: Sequence[Mapping[str, Any]],
    x: str,
    title: str,
) -> dict[str, Any] | None:
    """Curves of performance rows against one swept field, a panel per (model, metric): the
    scaled twin's figures (measured, and the roofline's calibration prediction for the twin)
    and the full-size model's predicted ones never share an axis.

    `sources` are the curves' owners (one job, or two compared): {"label" (prefixed to trace
    names; "" for one job), "rows" (PerformancePoint rows as dicts: kind, model, dtype,
    batch_size, prompt_len, metric, value, unit), "dtype_labels" ({dtype: label}, optional),
    "knees" ([{"dtype", "prompt_len", "batch_size", "decode_tokens_per_s", "tpot_s",
    "found"}], optional), "stops" ([{"dtype", "prompt_len", "batch_size"}], optional)}.
    `metrics`: {"name", "label", "unit", "scale" (value x scale is drawn), "p95" (the metric
    drawn as the upper error bar, optional)}. `x`: "batch_size" (log-2 axis), "prompt_len"
    (log axis) or "dtype" (categories). A row of `calibrated_<metric>` is drawn as that
    metric's "calibrated" variant (dotted, beside the raw prediction). A curve is one (source,
    kind, model, variant, metric, and the swept fields off the x axis); colour = dtype, marker
    = the off-axis value, dash = source (dotted: a prediction for the twin, or calibrated).
    Each trace's `meta` says what it is ({"source", "kind", "model", "variant", "metric",
    "dtype", "batch_size", "prompt_len", "role": "curve" | "knee" | "stop"}). None when no row
    has a metric.
    """
    names = [m["name"] for m in metrics]
    sources = [{**s, "rows": [_with_variant(r, names) for r in s["rows"]]} for s in sources]
    # On a batch axis, a series of one batch and several prompt lengths is left for the
    # prompt-length view (the panel's title says so).
    moved: set[tuple[str, str]] = set()
    if x == "batch_size":
        kept = []
        for s in sources:
            prompt_only = prompt_only_series(r for r in s["rows"] if r["metric"] in names)
            rows_ = []
            for r in s["rows"]:
                key = (r["model"], r["kind"], r["variant"], r["metric"], r["dtype"])
                if key in prompt_only:
                    moved.add((r["model"], r["metric"]))
                else:
                    rows_.append(r)
            kept.append({**s, "rows": rows_})
        sources = kept
    # Rows without a value of the x field (full-size decode predictions have no prompt
    # length: they read a full context) are not on this axis.
    charted = [
        r for s in sources for r in s["rows"] if r["metric"] in names and r.get(x) is not None
    ]
    shown = [m for m in metrics if any(r["metric"] == m["name"] for r in charted)]
    panels = _model_panels(charted + [{"model": m} for m, _ in moved])
    if not shown or not panels:
        return None
    p95_names = {m["p95"] for m in shown if m.get("p95")}
    filled = {(r["model"], r["metric"]) for r in charted}
    x_word = PERFORMANCE_X_TITLES[x].split(" (")[0]
    panel_px, gap_px = 330, 120  # a row of panels, and the gap for its x title and the next's
    plot_height = panel_px * len(panels) + gap_px * (len(panels) - 1)
    fig = make_subplots(
        rows=len(panels),
        cols=len(shown),
        subplot_titles=[
            f"{m['label']}: {title_}"
            + (
                ""
                if (model, m["name"]) in filled
                else " (by prompt length: see that view)"
                if (model, m["name"]) in moved
                else f" (none with a {x_word})"
            )
            for model, title_ in panels
            for m in shown
        ],
        vertical_spacing=gap_px / plot_height if len(panels) > 1 else 0.0,
        horizontal_spacing=0.11 if len(shown) > 1 else 0.02,
    )
    compared = len(sources) > 1
    others = _others(x)
    spare: list[str] = []
    legend_seen: set[str] = set()
    column_x: dict[tuple[int, int], set[Any]] = {}  # the x values drawn on each panel
    y_top: dict[tuple[int, int], float] = {}
    y_low: dict[tuple[int, int], float] = {}  # the smallest positive y of a panel
    stops: list[tuple[int, str, Mapping[str, Any]]] = []
    for s_index, source in enumerate(sources):
        prefix = f"{source['label']} · " if source.get("label") else ""
        dtype_labels = source.get("dtype_labels") or {}
        rows = list(source["rows"])
        p95 = {
            (
                r["kind"],
                r["model"],
                r["variant"],
                r["metric"],
                r["dtype"],
                r["batch_size"],
                r["prompt_len"],
            ): r["value"]
            for r in rows
            if r["metric"] in p95_names
        }
        curves: dict[tuple, list[Mapping[str, Any]]] = {}
        for r in rows:
            if r["metric"] in names and r.get(x) is not None:
                key = (r["model"], r["kind"], r["variant"], r["metric"], *(r[f] for f in others))
                curves.setdefault(key, []).append(r)
        curves = _merge_single_points(curves, others, x)
        source_dtypes = sorted(
            {dict(zip(others, k[4:], strict=True)).get("dtype") for k in curves},
            key=lambda d: _dtype_key(str(d)),
        )
        off_values = sorted(
            {k[4:] for k in curves},
            key=lambda v: tuple(
                (x_ is None, x_ == MERGED, 0 if x_ in (None, MERGED) else _x_key(f, x_))
                for f, x_ in zip(others, v, strict=True)
            ),
        )
        for key in sorted(
            curves,
            key=lambda k: (
                [m for m, _ in panels].index(k[0]),
                k[1] != "measured",
                k[2],
                names.index(k[3]),
                off_values.index(k[4:]),
            ),
        ):
            model, kind, variant, metric = key[:4]
            off = dict(zip(others, key[4:], strict=True))
            info = next(m for m in shown if m["name"] == metric)
            points = sorted(curves[key], key=lambda r: _x_key(x, r[x]))
            scale = float(info.get("scale") or 1.0)
            xs = [r[x] for r in points]
            ys = [r["value"] * scale for r in points]
            upper = [
                p95.get(
                    (
                        kind,
                        model,
                        variant,
                        info.get("p95"),
                        r["dtype"],
                        r["batch_size"],
                        r["prompt_len"],
                    )
                )
                for r in points
            ]
            dtype = off.get("dtype")
            if compared:  # colour family = job, shade = dtype
                family = _SOURCE_FAMILIES[s_index % len(_SOURCE_FAMILIES)]
                colour = family[source_dtypes.index(dtype) % len(family)]
            elif dtype is not None:
                colour = dtype_colour(str(dtype), spare)
            else:
                colour = _SPARE_COLOURS[off_values.index(key[4:]) % len(_SPARE_COLOURS)]
            dash = _KIND_DASH[
                "calibrated" if variant else kind if kind in _KIND_DASH else "predicted"
            ]
            off_text = ", ".join(
                dtype_labels.get(str(v), str(v))
                if f == "dtype"
                else _merged_text(f, points)
                if v == MERGED
                else _other_text(f, v)
                for f, v in off.items()
            )
            merged = [f for f, v in off.items() if v == MERGED]
            name = f"{prefix}{off_text}: {curve_label(kind, model, variant)}"
            row = [m for m, _ in panels].index(model) + 1
            col = [m["name"] for m in shown].index(metric) + 1
            column_x.setdefault((row, col), set()).update(xs)
            y_top[(row, col)] = max([y_top.get((row, col), 0.0), *(y for y in ys if y is not None)])
            positive = [y for y in ys if y is not None and y > 0]
            if positive:
                y_low[(row, col)] = min([y_low.get((row, col), positive[0]), *positive])
            # Compared jobs: one legend toggle per job and dtype (an entry added below).
            group = f"{prefix}{dtype_labels.get(str(dtype), str(dtype))}" if compared else name
            trace: dict[str, Any] = {
                "x": xs,
                "y": ys,
                "name": name,
                "legendgroup": group,
                "showlegend": not compared and name not in legend_seen,
                "mode": "lines+markers" if x != "dtype" else "markers",
                "line": {"color": colour, "dash": dash, "width": 2},
                "marker": {
                    "color": colour,
                    "size": 8,
                    "symbol": _SYMBOLS[off_values.index(key[4:]) % len(_SYMBOLS)]
                    + ("-open" if kind == "predicted" else ""),
                },
                "meta": {
                    "source": s_index,
                    "kind": kind,
                    "model": model,
                    "metric": metric,
                    "variant": variant,
                    "role": "curve",
                    **{f: (None if v == MERGED else v) for f, v in off.items()},
                    "merged": merged,
                },
                "text": [", ".join(_other_text(f, r[f]) for f in merged) for r in points]
                if merged
                else None,
                "hovertemplate": ("%{text}<br>" if merged else "")
                + f"%{{x}}<br>%{{y:,.4g}} {info['unit']}"
                + ("<br>p95 %{customdata:,.4g}" if any(u is not None for u in upper) else "")
                + "<extra>%{fullData.name}</extra>",
            }
            if any(u is not None for u in upper):
                tops = [None if u is None else u * scale for u in upper]
                trace["customdata"] = tops
                trace["error_y"] = {
                    "type": "data",
                    "symmetric": False,
                    "array": [
                        0.0 if t is None else max(t - y, 0.0) for t, y in zip(tops, ys, strict=True)
                    ],
                    "arrayminus": [0.0] * len(ys),
                    "color": colour,
                    "thickness": 1,
                    "width": 3,
                }
            if compared and group not in legend_seen:
                legend_seen.add(group)
                fig.add_trace(
                    go.Scatter(
                        x=[None],
                        y=[None],
                        name=group,
                        legendgroup=group,
                        mode="lines+markers",
                        line={"color": colour, "width": 3},
                        marker={"color": colour, "size": 8},
                        meta={"source": s_index, "role": "legend", "dtype": dtype},
                        hoverinfo="skip",
                    ),
                    row=row,
                    col=col,
                )
            legend_seen.add(name)
            fig.add_trace(go.Scatter(**trace), row=row, col=col)
        if x == "batch_size":
            _knee_markers(fig, source, prefix, panels, shown, spare, legend_seen, s_index)
            stops.extend((s_index, prefix, stop) for stop in source.get("stops") or ())
    # A panel whose figures span more than LOG_Y_SPAN (the roofline's prediction for the twin
    # beside a launch-bound measurement can be 100 times higher) gets a log y axis, so the
    # lower curve is not flattened against zero.
    log_y = {key for key, top in y_top.items() if key in y_low and top / y_low[key] > LOG_Y_SPAN}
    _stop_lines(fig, stops, panels, shown, y_top, y_low, log_y, legend_seen, column_x)
    if compared:  # what the line styles say, once
        for kind_, dash_, look in (
            ("measured", "solid", "solid, filled marker"),
            ("predicted", "dot", "dotted, open marker"),
        ):
            fig.add_trace(
                go.Scatter(
                    x=[None],
                    y=[None],
                    name=f"{kind_} ({look})",
                    mode="lines+markers",
                    line={"color": "#5d6875", "dash": dash_, "width": 2},
                    marker={
                        "color": "#5d6875",
                        "symbol": "circle" if dash_ == "solid" else "circle-open",
                    },
                    meta={"role": "legend"},
                    hoverinfo="skip",
                ),
                row=1,
                col=1,
            )
    for col, info in enumerate(shown, start=1):
        for row in range(1, len(panels) + 1):
            # Each panel's own x values (the twin and the full-size model sweep different
            # batches; a dtype shown only where it has figures).
            values = sorted(column_x.get((row, col), set()), key=lambda v: _x_key(x, v))
            axis: dict[str, Any] = {"title": {"text": PERFORMANCE_X_TITLES[x], "standoff": 6}}
            if x == "dtype":
                axis.update(type="category", categoryorder="array", categoryarray=values)
            else:
                axis.update(type="log", tickvals=values, ticktext=[f"{v:,}" for v in values])
            fig.update_xaxes(axis, row=row, col=col)
            logarithmic = (row, col) in log_y
            fig.update_yaxes(
                title={
                    "text": f"{info['label']} ({info['unit']}{', log' if logarithmic else ''})",
                    "standoff": 4,
                },
                type="log" if logarithmic else "linear",
                rangemode="normal" if logarithmic else "tozero",
                # a log axis: a tick per decade, 1k/10k/100k (no crowded 2 and 5 minor labels)
                **({"dtick": 1, "tickformat": "~s"} if logarithmic else {"nticks": 7}),
                automargin=True,
                row=row,
                col=col,
            )
    fig.update_layout(title=title, template="plotly_white", hovermode="closest")
    _legend_below(fig, plot_height=plot_height, top=80, bottom=70)
    return fig.to_plotly_json()


def _knee_markers(fig, source, prefix, panels, shown, spare, legend_seen, s_index) -> None:
    """A star on the measured decode tokens/s and TPOT curves at each dtype's recommended
    batch (the knee), on the panel of the measured model."""
    measured_models = [m for m, _ in panels if m in ("twin", "release")]
    if not measured_models:
        return
    row = [m for m, _ in panels].index(measured_models[0]) + 1
    by_metric = {m["name"]: (i + 1, m) for i, m in enumerate(shown)}
    for knee in source.get("knees") or ():
        for metric, value in (
            ("decode_tokens_per_s", knee.get("decode_tokens_per_s")),
            ("tpot_s", knee.get("tpot_s")),
        ):
            if metric not in by_metric or value is None:
                continue
            col, info = by_metric[metric]
            found = "" if knee.get("found") else " (no knee found: the largest batch measured)"
            name = f"{prefix}recommended batch, {knee['dtype']}{found}"
            fig.add_trace(
                go.Scatter(
                    x=[knee["batch_size"]],
                    y=[value * float(info.get("scale") or 1.0)],
                    mode="markers",
                    name=name,
                    legendgroup=name,
                    showlegend=name not in legend_seen,
                    marker={
                        "symbol": "star",
                        "size": 16,
                        "color": dtype_colour(str(knee["dtype"]), spare),
                        "line": {"color": "#1d232b", "width": 1},
                    },
                    meta={
                        "source": s_index,
                        "role": "knee",
                        "metric": metric,
                        "dtype": knee["dtype"],
                        "prompt_len": knee.get("prompt_len"),
                        "batch_size": knee["batch_size"],
                    },
                    hovertemplate=f"recommended batch %{{x}} (prompt {knee.get('prompt_len')})"
                    f"<br>%{{y:,.4g}} {info['unit']}<extra>%{{fullData.name}}</extra>",
                ),
                row=row,
                col=col,
            )
            legend_seen.add(name)


def _stop_lines(fig, stops, panels, shown, y_top, y_low, log_y, legend_seen, column_x) -> None:
    """A dotted red vertical line at each batch where a measured sweep ran out of memory, on
    the panels of the measured model (a trace, so it sits at the batch on the log axis)."""
    measured_models = [m for m, _ in panels if m in ("twin", "release")]
    if not measured_models:
        return
    row = [m for m, _ in panels].index(measured_models[0]) + 1
    for s_index, prefix, stop in stops:
        batch = stop.get("batch_size")
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            continue
        name = (
            f"{prefix}out of memory at batch {batch} ({stop.get('dtype')}, prompt "
            f"{stop.get('prompt_len')})"
        )
        for col in range(1, len(shown) + 1):
            top = y_top.get((row, col)) or 1.0
            bottom = y_low.get((row, col), top) if (row, col) in log_y else 0.0
            column_x.setdefault((row, col), set()).add(batch)
            fig.add_trace(
                go.Scatter(
                    x=[batch, batch],
                    y=[bottom, top],
                    mode="lines",
                    line={"dash": "dot", "width": 2, "color": "#8f1d1d"},
                    name=name,
                    legendgroup=name,
                    showlegend=name not in legend_seen,
                    meta={
                        "source": s_index,
                        "role": "stop",
                        "dtype": stop.get("dtype"),
                        "prompt_len": stop.get("prompt_len"),
                        "batch_size": batch,
                    },
                    hovertemplate=f"{name}<extra></extra>",
                ),
                row=row,
                col=col,
            )
            legend_seen.add(name)


def stability_memory(
    samples: Sequence[Mapping[str, Any]],
    *,
    warmup_steps: int | None,
    slope_bytes_per_step: float | None,
    threshold_bytes_per_step: float | None,
    memory_label: str,
) -> dict[str, Any] | None:
    """Memory in use after each step (MiB) over the run's time (s from its start; the step
    number where a result has no times), measured on the twin, with the warm-up left out of the
    leak fit shaded and the fitted slope (per step) drawn through the samples after it. None
    when no sample has a memory figure."""
    points = [s for s in samples if s.get("memory_bytes") is not None and s.get("step") is not None]
    if not points:
        return None
    steps = [s["step"] for s in points]
    timed = all(_number(s.get("elapsed_s")) is not None for s in points)
    # x of each sample: seconds since the start, or the step number
    at = {s["step"]: (s["elapsed_s"] if timed else s["step"]) for s in points}
    mib = [s["memory_bytes"] / MIB for s in points]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[at[s] for s in steps],
            y=mib,
            customdata=steps,
            mode="lines+markers",
            marker={"size": 4},
            name=f"{memory_label} (measured, twin)",
            meta={"role": "memory", "metric": "memory_bytes"},
            hovertemplate="step %{customdata}, %{x:,.1f}"
            + (" s" if timed else "")
            + "<br>%{y:,.2f} MiB<extra>%{fullData.name}</extra>",
        )
    )
    warm = warmup_steps or 0
    fitted = [(s, m) for s, m in zip(steps, mib, strict=True) if s > warm]
    if slope_bytes_per_step is not None and len(fitted) >= 2:
        mean_s = sum(s for s, _ in fitted) / len(fitted)
        mean_m = sum(m for _, m in fitted) / len(fitted)
        slope_mib = slope_bytes_per_step / MIB
        ends = [fitted[0][0], fitted[-1][0]]
        limit = (
            f" (threshold {threshold_bytes_per_step:,.0f})"
            if threshold_bytes_per_step is not None
            else ""
        )
        fig.add_trace(
            go.Scatter(
                x=[at[s] for s in ends],
                y=[mean_m + slope_mib * (s - mean_s) for s in ends],
                mode="lines",
                line={"dash": "dash", "color": "#8f1d1d", "width": 1.5},
                name=f"fitted slope {slope_bytes_per_step:,.0f} bytes/step{limit}",
                meta={"role": "slope"},
                hoverinfo="skip",
            )
        )
    warm_ends = [at[s] for s in steps if s <= warm]
    if warm and warm_ends:
        fig.add_vrect(
            x0=at[min(steps)],
            x1=max(warm_ends) if timed else warm + 0.5,
            fillcolor="#d5dae0",
            opacity=0.45,
            line_width=0,
            annotation_text="warm-up (left out of the fit)",
            annotation_position="top left",
            annotation_font={"size": 10},
        )
    fig.update_layout(
        title="Memory over the stability run (measured, twin)",
        height=340,
        xaxis_title="time since the start (s)" if timed else "step",
        yaxis={"title": "memory in use (MiB)", "tickformat": ",.1f"},
        margin={"l": 70, "r": 20, "t": 50, "b": 60},
        legend={"orientation": "h", "y": -0.25, "x": 0},
        template="plotly_white",
    )
    return fig.to_plotly_json()


def stability_step_time(
    samples: Sequence[Mapping[str, Any]],
    *,
    warmup_steps: int | None,
    first_quarter_s: float | None,
    last_quarter_s: float | None,
    basis: str,
) -> dict[str, Any] | None:
    """Each step's wall time and process CPU time (ms) against the step number, measured on
    the twin, with the medians of the first and last quarters the drift verdict compares
    (`basis` says which time they are of). None without samples."""
    points = [s for s in samples if s.get("step") is not None and s.get("step_time_s") is not None]
    if not points:
        return None
    steps = [s["step"] for s in points]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=steps,
            y=[s["step_time_s"] * 1000 for s in points],
            mode="lines+markers",
            marker={"size": 4},
            name="step wall time (measured, twin)",
            meta={"role": "step_time", "metric": "step_time_s"},
            hovertemplate="step %{x}<br>%{y:,.2f} ms<extra>%{fullData.name}</extra>",
        )
    )
    if any(s.get("cpu_time_s") is not None for s in points):
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=[None if s.get("cpu_time_s") is None else s["cpu_time_s"] * 1000 for s in points],
                mode="lines",
                line={"width": 1.2},
                name="step process CPU time (measured, twin)",
                meta={"role": "cpu_time", "metric": "cpu_time_s"},
                hovertemplate="step %{x}<br>%{y:,.2f} ms CPU<extra>%{fullData.name}</extra>",
            )
        )
    for label, value, dash in (
        ("first quarter median", first_quarter_s, "dot"),
        ("last quarter median", last_quarter_s, "dash"),
    ):
        if value is not None:
            fig.add_trace(
                go.Scatter(
                    x=[min(steps), max(steps)],
                    y=[value * 1000] * 2,
                    mode="lines",
                    line={"dash": dash, "width": 1, "color": "#5d6875"},
                    name=f"{label}, {basis}: {value * 1000:,.2f} ms",
                    meta={"role": "quarter_median"},
                    hoverinfo="skip",
                )
            )
    if warmup_steps:
        fig.add_vrect(
            x0=min(steps),
            x1=warmup_steps + 0.5,
            fillcolor="#d5dae0",
            opacity=0.45,
            line_width=0,
        )
    fig.update_layout(
        title="Step time over the stability run (measured, twin)",
        height=340,
        xaxis_title="step",
        yaxis={"title": "time per step (ms)", "rangemode": "tozero"},
        margin={"l": 70, "r": 20, "t": 50, "b": 60},
        legend={"orientation": "h", "y": -0.25, "x": 0},
        template="plotly_white",
    )
    return fig.to_plotly_json()


def report_time_to_day0(
    points: Sequence[Mapping[str, Any]], *, within_h: float = 24.0
) -> dict[str, Any] | None:
    """Each ready release's time to Day-0 (hours) over when its clock started (publication,
    or discovery where the hub gave no publication time: marked differently), with the
    `within_h` target as a dashed line: the managers' report chart.

    `points` are `adaptation.reports.chart_points` ({"at", "hours", "repo_id", "basis"}),
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
            "legend": {"orientation": "h", "y": -0.25, "x": 0},
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
    figure["layout"]["template"] = _plotly_white()
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


def _plotly_white() -> dict[str, Any]:
    """plotly's "plotly_white" template as JSON (what `template="plotly_white"` embeds)."""
    import plotly.io as pio

    return pio.templates["plotly_white"].to_plotly_json()
