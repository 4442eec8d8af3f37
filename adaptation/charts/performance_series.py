"""What the performance charts (`adaptation.charts.performance`) know of a stored point: its
curve's name and colour, the dtype order, the swept fields off the x axis, points merged into
one trace, and the legend's room. Measured figures are the scaled twin's; predicted ones the
planner's step-time model; never mixed on one axis."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

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
SPARE_COLOURS = ("#0f8a8a", "#a68a00", "#6b4226", "#e377c2", "#17becf", "#7f7f7f")
# Line dash per compared source (job) for the primary curve, and for a calibration curve
# (the roofline's prediction for the twin itself, drawn beside the twin's measurement).
# Line dash says only measured (solid) or predicted (dotted; a calibrated prediction dashed).
KIND_DASH = {"measured": "solid", "predicted": "dot", "calibrated": "dash"}
# Colour family per compared source (job): its dtypes take the family's shades in turn.
SOURCE_FAMILIES = (
    ("#1f4e9c", "#4f86d6", "#8fb3e8", "#0b2c5f"),
    ("#b34d00", "#e07b1a", "#f2b36b", "#6e2f00"),
    ("#2e7d32", "#66bb6a", "#a5d6a7", "#1b4d1e"),
    ("#6a1b9a", "#ab47bc", "#ce93d8", "#3d0f5a"),
)
# Marker per value of the swept field that is not on the x axis (e.g. per prompt length).
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "star-diamond", "hexagon")
# Which model a row's figures belong to, in the order the chart's rows of panels go.
_MODEL_PANELS = (
    ("twin", "scaled twin, this pool's device"),
    ("release", "the release at full size, this pool's device"),
    ("full-size", "full-size model, the planner's step-time model"),
)
LOG_Y_SPAN = 30.0
X_TITLES = {
    "batch_size": "batch size (sequences)",
    "prompt_len": "prompt length (tokens)",
    "dtype": "dtype",
}
_DTYPE_ORDER = tuple(_DTYPE_COLOURS)


def x_word(x: str) -> str:
    """A swept field in words, without its unit: "batch size"."""
    return X_TITLES[x].split(" (")[0]


def dtype_colour(dtype: str, seen: list[str]) -> str:
    """The colour of `dtype`: a fixed one for the known dtypes, else the next spare one
    (`seen` remembers the order unknown dtypes came in)."""
    if dtype in _DTYPE_COLOURS:
        return _DTYPE_COLOURS[dtype]
    if dtype not in seen:
        seen.append(dtype)
    return SPARE_COLOURS[seen.index(dtype) % len(SPARE_COLOURS)]


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


def with_variant(row: Mapping[str, Any], names: Sequence[str]) -> Mapping[str, Any]:
    metric = str(row["metric"])
    base = metric.removeprefix(CALIBRATED_PREFIX)
    if base != metric and base in names:
        return {**row, "metric": base, "variant": "calibrated"}
    return {**row, "variant": ""}


def dtype_key(dtype: str) -> tuple[int, str]:
    return (_DTYPE_ORDER.index(dtype) if dtype in _DTYPE_ORDER else len(_DTYPE_ORDER), dtype)


def x_key(x: str, value: Any) -> Any:
    return dtype_key(str(value)) if x == "dtype" else value


def fields_off_axis(x: str) -> tuple[str, ...]:
    """The swept fields that are not on the x axis (a curve holds them fixed)."""
    return tuple(f for f in ("dtype", "batch_size", "prompt_len") if f != x)


def off_axis_text(field_name: str, value: Any) -> str:
    if field_name == "batch_size":
        return f"batch {value}" if value is not None else "batch —"
    if field_name == "prompt_len":
        return f"prompt {value}" if value is not None else "full context"
    return str(value)


# Stands for "one point each at several values" of a field off the x axis (see
# `merge_single_points`).
MERGED = "*"


def merge_single_points(
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


def merged_text(field_name: str, points: Sequence[Mapping[str, Any]]) -> str:
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


def _legend_lines(names: Sequence[str], width: float = 840.0) -> int:
    """About how many lines a horizontal legend of `names` takes at `width` px (the default:
    the plot's width in a 1024 px window, so the legend is never clipped down to there)."""
    lines, used = 0, width
    for name in names:
        entry = 50 + 6.8 * len(name)
        if used + entry > width:
            lines, used = lines + 1, 0.0
        used += entry
    return lines


def legend_below(fig: go.Figure, *, plot_height: int, top: int, bottom: int) -> None:
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


def model_panels(rows: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    models = list(dict.fromkeys(str(r["model"]) for r in rows))
    known = [(m, title) for m, title in _MODEL_PANELS if m in models]
    extra = [(m, m) for m in sorted(set(models) - {m for m, _ in _MODEL_PANELS})]
    return known + extra
