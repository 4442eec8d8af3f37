"""The full-size charts: a workload measured on the pool's engine serving the full-size model
with dummy weights (the serve stage's `full_size`), beside the plan's prediction for the same
workload and the fit it names.

Measured and predicted figures are both the full-size model's at the same lengths and
concurrency, so they share each panel's axes (the twin's figures, another scale, are never
drawn here); every trace's name says which it is and on what.
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
    SI_TICKS,
    figure_json,
)
from engine.formatting import finite
from engine.stages.plan.result import PredictedPoint, StoredFit
from engine.stages.serve.full_size_result import Level

MEASURED = "measured · engine · full size · dummy weights"
MEASURED_COLOUR = "#1d5fb4"
PREDICTED_COLOUR = "#5d6875"
# The panels: (the measured level's key, the predicted point's key, the p95 key, title, unit,
# scale to the axis's unit).
PANELS = (
    ("output_tokens_per_s", "output_tokens_per_s", None, "Output tokens/s", "tokens/s", 1.0),
    ("ttft_s_p50", "ttft_s", "ttft_s_p95", "TTFT p50", "ms", 1000.0),
    ("tpot_s_p50", "tpot_s", "tpot_s_p95", "TPOT p50", "ms per token", 1000.0),
)


def _everyone(value: Any, word: str) -> str:
    text = str(value or "")
    return f"every {word}" if text in ("", "*") else text


def fit_words(fit: StoredFit | None) -> str:
    """A fit as a trace names it: "fit h200 x vllm, 8 points, x1.26"; the engine's over every
    accelerator "fit every accelerator x vllm, ..."; a prior without points "fit: prior (no
    points)"; "" without a fit."""
    if fit is None:
        return ""
    if not fit.points:
        return f"fit {_everyone(fit.accelerator, 'accelerator')}: prior (no points)"
    return (
        f"fit {_everyone(fit.accelerator, 'accelerator')} x "
        f"{_everyone(fit.engine, 'engine')}, {fit.points} points"
        + (f", x{fit.residual:.2f}" if fit.residual is not None else "")
    )


def predicted_label(fit: StoredFit | None, made: str) -> str:
    """How a predicted trace says what it is: "predicted · full size · fit h200 x vllm, 8
    points, x1.26", with "made before the measurement" for the serve stage's own."""
    words = fit_words(fit)
    return (
        "predicted · full size"
        + (f" · {words}" if words else "")
        + (" · made before the measurement" if made == "before" else "")
    )


def workload_title(label: str, input_tokens: Any, output_tokens: Any) -> str:
    """ "primary workload, 128 + 64 tokens"."""
    lengths = [finite(input_tokens), finite(output_tokens)]
    tokens = f", {lengths[0]:,.0f} + {lengths[1]:,.0f} tokens" if None not in lengths else ""
    return f"{label or 'the'} workload{tokens}"


@cached_figure
def workload_curves(
    measured: Sequence[Level],
    predicted: Sequence[PredictedPoint],
    *,
    label: str,
    input_tokens: Any,
    output_tokens: Any,
    fit: StoredFit | None = None,
    made: str = "",
) -> dict[str, Any] | None:
    """Output tokens/s, TTFT p50 and TPOT p50 (ms; p95 as the upper error bar) against
    concurrency for one workload at full size: `measured` (its levels on the engine with
    dummy weights, `MeasuredWorkload.levels`; solid) and `predicted` (the plan's points for
    the same lengths, `Prediction.points`; dotted, open markers, named with its `fit` and how
    it was `made`: "before" or "plan"), sharing each panel's axes. `label`, `input_tokens`
    and `output_tokens` name the workload. None without a measured level.

    Each trace's `meta` says what it is ({"kind": "measured" | "predicted", "model":
    "full-size", "load_format": "dummy" for the measured, "metric", "role": "curve"})."""
    levels = [p for p in measured if p.concurrency is not None]
    if not any(getattr(p, key) is not None for p in levels for key, *_ in PANELS):
        return None
    forecast = [p for p in predicted if finite(p.concurrency) is not None]
    forecast_name = predicted_label(fit, made)
    fig = make_subplots(
        rows=1,
        cols=len(PANELS),
        subplot_titles=[f"{title} ({unit})" for _, _, _, title, unit, _ in PANELS],
        horizontal_spacing=0.08,
    )
    ticks: set[float] = set()
    for col, (key, predicted_key, p95, _title, unit, scale) in enumerate(PANELS, start=1):
        xs = [p.concurrency for p in levels]
        ys = [None if getattr(p, key) is None else getattr(p, key) * scale for p in levels]
        ticks.update(xs)
        trace: dict[str, Any] = {
            "x": xs,
            "y": ys,
            "mode": "lines+markers",
            "line": {"color": MEASURED_COLOUR, "width": 2},
            "marker": {"color": MEASURED_COLOUR, "size": 8},
            "name": MEASURED,
            "legendgroup": "measured",
            "showlegend": col == 1,
            "meta": {
                "kind": "measured",
                "model": "full-size",
                "load_format": "dummy",
                "metric": key,
                "role": "curve",
            },
            "hovertemplate": f"concurrency %{{x}}<br>%{{y:,.4g}} {unit}"
            "<extra>%{fullData.name}</extra>",
        }
        if p95:
            tops = [None if getattr(p, p95) is None else getattr(p, p95) * scale for p in levels]
            if any(t is not None for t in tops):
                trace["error_y"] = {
                    "type": "data",
                    "symmetric": False,
                    "array": [
                        0.0 if t is None or y is None else max(t - y, 0.0)
                        for t, y in zip(tops, ys, strict=True)
                    ],
                    "arrayminus": [0.0] * len(ys),
                    "color": MEASURED_COLOUR,
                    "thickness": 1,
                    "width": 3,
                }
        fig.add_trace(go.Scatter(**trace), row=1, col=col)
        points = [p for p in forecast if getattr(p, predicted_key) is not None]
        if points:
            ticks.update(p.concurrency for p in points)
            fig.add_trace(
                go.Scatter(
                    x=[p.concurrency for p in points],
                    y=[getattr(p, predicted_key) * scale for p in points],
                    mode="lines+markers",
                    line={"color": PREDICTED_COLOUR, "dash": "dot", "width": 2},
                    marker={"color": PREDICTED_COLOUR, "size": 8, "symbol": "circle-open"},
                    name=forecast_name,
                    legendgroup="predicted",
                    showlegend=col == 1,
                    meta={
                        "kind": "predicted",
                        "model": "full-size",
                        "metric": predicted_key,
                        "role": "curve",
                    },
                    hovertemplate=f"concurrency %{{x}}<br>%{{y:,.4g}} {unit}"
                    "<extra>%{fullData.name}</extra>",
                ),
                row=1,
                col=col,
            )
        fig.update_yaxes(
            title_text=unit,
            rangemode="tozero",
            row=1,
            col=col,
            **(SI_TICKS if key == "output_tokens_per_s" else {}),
        )
    values = sorted(ticks)
    for col in range(1, len(PANELS) + 1):
        fig.update_xaxes(
            type="log",
            tickvals=values,
            title_text="concurrency (requests in flight)",
            row=1,
            col=col,
            **COUNT_TICKS,
        )
    return figure_json(
        fig,
        title=f"Full size, {workload_title(label, input_tokens, output_tokens)}: "
        "measured on the engine beside the prediction",
        height=420,
        margin={**ONE_AXIS_MARGIN, "t": 90},
        legend={**LEGEND_BELOW, "y": -0.3},
    )
