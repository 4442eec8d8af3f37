"""The performance charts' view, read from the page's query string (`perf_x`, `perf_metric`) so
that a link reproduces it, and the charts it draws over one job's or two jobs' stored points.

A bad value falls back to the default view, and the view keeps what was wrong
(`ViewProblem`): `partials/perf_view_problem.html` says what is shown instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from adaptation.charts import performance as performance_charts
from adaptation.charts.performance_metrics import METRICS, is_efficiency, metric_info
from adaptation.charts.performance_series import CALIBRATED_PREFIX, X_TITLES, curve_label, x_word
from adaptation.presenters.chart_slot import ChartSlot
from engine.stages.performance.result import PerformanceResult

# The default view's charts: (name, metrics), titled by `charts.performance.GROUP_TITLES`.
DEFAULT_CHARTS = (
    ("throughput", ("decode_tokens_per_s", "prefill_tokens_per_s")),
    ("latency", ("ttft_s", "tpot_s")),
)
_EFFICIENCY_NAME = re.compile(r"[a-z0-9_]{1,64}")


@dataclass(frozen=True)
class ViewProblem:
    """A query parameter of the view (`param`: "perf_x" or "perf_metric") whose value
    (`given`, its first 64 characters) is not one of `choices`: the default is shown."""

    param: str
    given: str
    choices: tuple[str, ...]


@dataclass(frozen=True)
class PerformanceView:
    """The chart view a URL asks for: `x` the swept field on the x axis, `metric` one metric
    to draw (None: the throughput and latency charts), and the bad values replaced."""

    x: str = "batch_size"
    metric: str | None = None
    problems: tuple[ViewProblem, ...] = ()

    def params(self) -> dict[str, str]:
        params = {}
        if self.x != "batch_size":
            params["perf_x"] = self.x
        if self.metric:
            params["perf_metric"] = self.metric
        return params

    @property
    def query(self) -> str:
        """This view's query string ("" for the default view)."""
        return urlencode(self.params())

    @property
    def x_label(self) -> str:
        """The x axis's field as the charts name it ("batch size")."""
        return x_word(self.x)

    @property
    def metric_label(self) -> str:
        """The metric's label ("" for the default view)."""
        return metric_info(self.metric).label if self.metric else ""


def x_choices() -> list[tuple[str, str]]:
    """The fields a view may sweep along, with their names: ("batch_size", "batch size")."""
    return [(x, x_word(x)) for x in X_TITLES]


def performance_view(params: Mapping[str, Any]) -> PerformanceView:
    """The view named by `perf_x` and `perf_metric` in `params` (a QueryDict or a dict);
    an unknown value is dropped, and kept in the view's `problems`."""
    problems = []
    x = str(params.get("perf_x") or "batch_size").strip()
    if x not in X_TITLES:
        problems.append(ViewProblem(param="perf_x", given=x[:64], choices=tuple(X_TITLES)))
        x = "batch_size"
    metric: str | None = str(params.get("perf_metric") or "").strip() or None
    if metric is not None and not (
        metric in METRICS or (_EFFICIENCY_NAME.fullmatch(metric) and is_efficiency(metric))
    ):
        problems.append(ViewProblem(param="perf_metric", given=metric[:64], choices=tuple(METRICS)))
        metric = None
    return PerformanceView(x=x, metric=metric, problems=tuple(problems))


def chart_source(
    *,
    rows: Sequence[Mapping[str, Any]],
    result: PerformanceResult,
    release: str = "",
    pool: str = "",
) -> dict[str, Any]:
    """A job's rows and what its result adds to a chart (each dtype's knee, the stops, dtype
    labels); its `release` and `pool` name its traces when two jobs are compared."""
    return {
        "release": release,
        "pool": pool,
        "rows": rows,
        "dtype_labels": result.dtype_labels,
        "knees": list(result.knee_by_dtype.values()),
        "stops": list(result.stopped),
    }


def view_charts(
    sources: Sequence[Mapping[str, Any]], view: PerformanceView, *, stem: str
) -> list[ChartSlot]:
    """The charts of `view` over `sources` (one job's, or two jobs' overlaid): throughput and
    latency (and calibration, when efficiency rows exist), or the one metric the view asks
    for. Each slot's title is its chart's ("Throughput", or the metric's label)."""
    units = {r["metric"]: r["unit"] for s in sources for r in s["rows"]}
    if view.metric:
        info = metric_info(view.metric, units.get(view.metric, ""))
        groups = [(view.metric.replace("_", "-"), info.label, (view.metric,))]
    else:
        groups = [
            (name, performance_charts.GROUP_TITLES[name], names) for name, names in DEFAULT_CHARTS
        ]
        efficiency = sorted(m for m in units if is_efficiency(m))
        if efficiency:
            groups.append(
                ("calibration", performance_charts.GROUP_TITLES["calibration"], tuple(efficiency))
            )
    slots = []
    for name, title, names in groups:
        specs = [metric_info(n, units.get(n, "")).chart_spec() for n in names]
        figure = performance_charts.curves(
            sources, metrics=specs, x=view.x, what=title, overlaid=len(sources) > 1
        )
        if figure is not None:
            slots.append(ChartSlot(f"{stem}-{name}", figure, name, title))
    return slots


def off_axis(rows: Sequence[Mapping[str, Any]], view: PerformanceView) -> list[tuple[str, str]]:
    """The curves the view's charts leave out, as (dtype, curve name): figures of a charted
    metric without a value of the x field (the full-size decode predictions have no prompt
    length: they read a full context)."""
    wanted = {view.metric} if view.metric else {n for _, names in DEFAULT_CHARTS for n in names}
    wanted |= {CALIBRATED_PREFIX + n for n in wanted}
    curves = {
        (r["kind"], r["model"], r["dtype"])
        for r in rows
        if r["metric"] in wanted and r.get(view.x) is None
    }
    return [(dtype, curve_label(kind, model)) for kind, model, dtype in sorted(curves)]
