"""The performance charts of the release page and of the compare page: curves of stored
performance points against one swept field, a panel per (model, metric), with the knee and the
out-of-memory stops of the measured sweep."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from adaptation.charts.cache import cached_figure
from adaptation.charts.performance_series import (
    KIND_DASH,
    LOG_Y_SPAN,
    MERGED,
    SOURCE_FAMILIES,
    SPARE_COLOURS,
    SYMBOLS,
    X_TITLES,
    curve_label,
    dtype_colour,
    dtype_key,
    fields_off_axis,
    legend_below,
    merge_single_points,
    merged_text,
    model_panels,
    off_axis_text,
    prompt_only_series,
    with_variant,
    x_key,
    x_word,
)
from engine.stages.performance.result import Knee, SweepStop

# The title of each chart of the default view (`presenters.performance_view.DEFAULT_CHARTS`).
GROUP_TITLES = {
    "throughput": "Throughput",
    "latency": "Latency",
    "calibration": "Calibration: measured / predicted for the twin",
}


@cached_figure
def curves(
    sources: Sequence[Mapping[str, Any]],
    *,
    metrics: Sequence[Mapping[str, Any]],
    x: str,
    what: str,
    overlaid: bool = False,
) -> dict[str, Any] | None:
    """Curves of performance rows against one swept field, a panel per (model, metric): the
    scaled twin's figures (measured, and the roofline's calibration prediction for the twin)
    and the full-size model's predicted ones never share an axis.

    `sources` are the curves' owners (one job, or two compared): {"release" and "pool" (the
    job's repo id and pool name, prefixed to trace names when jobs are compared), "rows"
    (PerformancePoint rows as dicts: kind, model, dtype, batch_size, prompt_len, metric,
    value, unit), "dtype_labels" ({dtype: label}, optional), "knees" (each dtype's
    `performance.result.Knee`, optional), "stops" (the sweep's `performance.result.SweepStop`s,
    optional)}. `metrics`: {"name",
    "label", "unit", "scale" (value x scale is drawn), "p95" (the metric drawn as the upper
    error bar, optional)}. `x`: "batch_size" (log-2 axis), "prompt_len" (log axis) or "dtype"
    (categories). `what` is the chart's title before "vs <x>" (`GROUP_TITLES`, or a metric's
    label); `overlaid` says two jobs share it. A row of `calibrated_<metric>` is drawn as
    that metric's "calibrated" variant (dotted, beside the raw prediction). A curve is one
    (source, kind, model, variant, metric, and the swept fields off the x axis); colour =
    dtype, marker = the off-axis value, dash = source (dotted: a prediction for the twin, or
    calibrated).
    Each trace's `meta` says what it is ({"source", "kind", "model", "variant", "metric",
    "dtype", "batch_size", "prompt_len", "role": "curve" | "knee" | "stop"}). None when no row
    has a metric.
    """
    title = f"{what} vs {x_word(x)}" + (" (two jobs overlaid)" if overlaid else "")
    names = [m["name"] for m in metrics]
    sources = [{**s, "rows": [with_variant(r, names) for r in s["rows"]]} for s in sources]
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
    panels = model_panels(charted + [{"model": m} for m, _ in moved])
    if not shown or not panels:
        return None
    p95_names = {m["p95"] for m in shown if m.get("p95")}
    filled = {(r["model"], r["metric"]) for r in charted}
    along = x_word(x)
    panel_px, gap_px = 250, 100  # a row of panels, and the gap for its x title and the next's
    plot_height = panel_px * len(panels) + gap_px * (len(panels) - 1)
    # A cell's error bar is promised only where a p95 row is there to draw it.
    with_p95 = {
        (r["model"], m["name"])
        for s in sources
        for r in s["rows"]
        for m in shown
        if m.get("p95") and r["metric"] == m["p95"] and r.get(x) is not None
    }
    fig = make_subplots(
        rows=len(panels),
        cols=len(shown),
        subplot_titles=[
            f"{_cell_label(m, (model, m['name']) in with_p95)}: "
            f"{_SHORT_PANELS.get(model, title_)}"
            + (
                ""
                if (model, m["name"]) in filled
                else " (in the prompt-length view)"
                if (model, m["name"]) in moved
                else f" (none with a {along})"
            )
            for model, title_ in panels
            for m in shown
        ],
        vertical_spacing=gap_px / plot_height if len(panels) > 1 else 0.0,
        horizontal_spacing=0.11 if len(shown) > 1 else 0.02,
    )
    compared = len(sources) > 1
    others = fields_off_axis(x)
    spare: list[str] = []
    legend_seen: set[str] = set()
    column_x: dict[tuple[int, int], set[Any]] = {}  # the x values drawn on each panel
    y_top: dict[tuple[int, int], float] = {}
    y_low: dict[tuple[int, int], float] = {}  # the smallest positive y of a panel
    stops: list[tuple[int, str, SweepStop]] = []
    for s_index, source in enumerate(sources):
        prefix = f"{source['release']} on {source['pool']} · " if source.get("release") else ""
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
        curves = merge_single_points(curves, others, x)
        source_dtypes = sorted(
            {dict(zip(others, k[4:], strict=True)).get("dtype") for k in curves},
            key=lambda d: dtype_key(str(d)),
        )
        off_values = sorted(
            {k[4:] for k in curves},
            key=lambda v: tuple(
                (x_ is None, x_ == MERGED, 0 if x_ in (None, MERGED) else x_key(f, x_))
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
            points = sorted(curves[key], key=lambda r: x_key(x, r[x]))
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
                family = SOURCE_FAMILIES[s_index % len(SOURCE_FAMILIES)]
                colour = family[source_dtypes.index(dtype) % len(family)]
            elif dtype is not None:
                colour = dtype_colour(str(dtype), spare)
            else:
                colour = SPARE_COLOURS[off_values.index(key[4:]) % len(SPARE_COLOURS)]
            dash = KIND_DASH[
                "calibrated" if variant else kind if kind in KIND_DASH else "predicted"
            ]
            off_text = ", ".join(
                dtype_labels.get(str(v), str(v))
                if f == "dtype"
                else merged_text(f, points)
                if v == MERGED
                else off_axis_text(f, v)
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
                    "symbol": SYMBOLS[off_values.index(key[4:]) % len(SYMBOLS)]
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
                "text": [", ".join(off_axis_text(f, r[f]) for f in merged) for r in points]
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
            values = sorted(column_x.get((row, col), set()), key=lambda v: x_key(x, v))
            axis: dict[str, Any] = {"title": {"text": X_TITLES[x], "standoff": 6}}
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
    # An empty cell (no figure for that model and metric) is not drawn: its title says why.
    for row, (model, _title) in enumerate(panels, start=1):
        for col, info in enumerate(shown, start=1):
            if (model, info["name"]) not in filled:
                fig.update_xaxes(visible=False, row=row, col=col)
                fig.update_yaxes(visible=False, row=row, col=col)
    fig.update_layout(title=title, template="plotly_white", hovermode="closest")
    legend_below(fig, plot_height=plot_height, top=80, bottom=70)
    return fig.to_plotly_json()


# A panel's short name in its cell titles, so two cells' titles fit side by side at 1024 px.
_SHORT_PANELS = {
    "twin": "scaled twin",
    "release": "release, full size",
    "full-size": "full size, predicted",
}


def _cell_label(metric: Mapping[str, Any], p95: bool) -> str:
    """A metric's label in a cell title: without its "p95 bar" where the cell has none."""
    label = str(metric["label"])
    return label if p95 else label.replace(", p95 bar", "")


def _knee_markers(fig, source, prefix, panels, shown, spare, legend_seen, s_index) -> None:
    """A star on the measured decode tokens/s and TPOT curves at each dtype's recommended
    batch (the knee), on the panel of the measured model."""
    measured_models = [m for m, _ in panels if m in ("twin", "release")]
    if not measured_models:
        return
    row = [m for m, _ in panels].index(measured_models[0]) + 1
    by_metric = {m["name"]: (i + 1, m) for i, m in enumerate(shown)}
    knees: Sequence[Knee] = source.get("knees") or ()
    for knee in knees:
        for metric, value in (
            ("decode_tokens_per_s", knee.decode_tokens_per_s),
            ("tpot_s", knee.tpot_s),
        ):
            if metric not in by_metric or value is None:
                continue
            col, info = by_metric[metric]
            found = "" if knee.found else " (no knee found: the largest batch measured)"
            name = f"{prefix}recommended batch, {knee.dtype}{found}"
            fig.add_trace(
                go.Scatter(
                    x=[knee.batch_size],
                    y=[value * float(info.get("scale") or 1.0)],
                    mode="markers",
                    name=name,
                    legendgroup=name,
                    showlegend=name not in legend_seen,
                    marker={
                        "symbol": "star",
                        "size": 16,
                        "color": dtype_colour(knee.dtype, spare),
                        "line": {"color": "#1d232b", "width": 1},
                    },
                    meta={
                        "source": s_index,
                        "role": "knee",
                        "metric": metric,
                        "dtype": knee.dtype,
                        "prompt_len": knee.prompt_len,
                        "batch_size": knee.batch_size,
                    },
                    hovertemplate=f"recommended batch %{{x}} (prompt {knee.prompt_len})"
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
        batch = stop.batch_size
        if batch is None or batch < 1:
            continue
        # A sweep stops where memory ran out or where its time budget did (budget.py).
        name = f"{prefix}{stop.cause} at batch {batch} ({stop.dtype}, prompt {stop.prompt_len})"
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
                        "dtype": stop.dtype,
                        "prompt_len": stop.prompt_len,
                        "batch_size": batch,
                    },
                    hovertemplate=f"{name}<extra></extra>",
                ),
                row=row,
                col=col,
            )
            legend_seen.add(name)
