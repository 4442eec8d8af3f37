"""The release page's stability charts: memory and step time over the stability run
(measured on the scaled twin)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from adaptation.charts.cache import cached_figure
from adaptation.charts.layout import ONE_AXIS_MARGIN, figure_json
from engine.stages.stability.result import StabilitySample
from engine.units import MIB

# What a run's `memory_kind` sampled, as the memory chart's trace says it.
MEMORY_KINDS = {
    "process_rss": "process resident set",
    "device_allocated": "device memory allocated",
}


@cached_figure
def memory(
    samples: Sequence[StabilitySample],
    *,
    warmup_steps: int | None,
    slope_bytes_per_step: float | None,
    threshold_bytes_per_step: float | None,
    memory_kind: str,
) -> dict[str, Any] | None:
    """Memory in use after each step (MiB) over the run's time (s from its start; the step
    number where a result has no times), measured on the twin, with the warm-up left out of the
    leak fit shaded and the fitted slope (per step) drawn through the samples after it.
    `memory_kind` is what the run sampled ("process_rss", "device_allocated"). None when no
    sample has a memory figure."""
    points = [s for s in samples if s.memory_bytes is not None and s.step is not None]
    if not points:
        return None
    steps = [s.step for s in points]
    timed = all(s.elapsed_s is not None for s in points)
    # x of each sample: seconds since the start, or the step number
    at = {s.step: (s.elapsed_s if timed else s.step) for s in points}
    mib = [s.memory_bytes / MIB for s in points]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[at[s] for s in steps],
            y=mib,
            customdata=steps,
            mode="lines+markers",
            marker={"size": 4},
            name=f"{MEMORY_KINDS.get(memory_kind, 'memory in use')} (measured, twin)",
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
    return figure_json(
        fig,
        title="Memory over the stability run (measured, twin)",
        height=340,
        margin=ONE_AXIS_MARGIN,
        xaxis_title="time since the start (s)" if timed else "step",
        yaxis={"title": "memory in use (MiB)", "tickformat": ",.1f"},
    )


@cached_figure
def step_time(
    samples: Sequence[StabilitySample],
    *,
    warmup_steps: int | None,
    first_quarter_s: float | None,
    last_quarter_s: float | None,
    basis: str,
) -> dict[str, Any] | None:
    """Each step's wall time and process CPU time (ms) against the step number, measured on
    the twin, with the medians of the first and last quarters the drift verdict compares
    (`basis` says which time they are of). None without samples."""
    points = [s for s in samples if s.step is not None and s.step_time_s is not None]
    if not points:
        return None
    steps = [s.step for s in points]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=steps,
            y=[s.step_time_s * 1000 for s in points],
            mode="lines+markers",
            marker={"size": 4},
            name="step wall time (measured, twin)",
            meta={"role": "step_time", "metric": "step_time_s"},
            hovertemplate="step %{x}<br>%{y:,.2f} ms<extra>%{fullData.name}</extra>",
        )
    )
    if any(s.cpu_time_s is not None for s in points):
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=[None if s.cpu_time_s is None else s.cpu_time_s * 1000 for s in points],
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
    return figure_json(
        fig,
        title="Step time over the stability run (measured, twin)",
        height=340,
        margin=ONE_AXIS_MARGIN,
        xaxis_title="step",
        yaxis={"title": "time per step (ms)", "rangemode": "tozero"},
    )
