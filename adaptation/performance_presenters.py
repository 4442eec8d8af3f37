"""Shapes the `performance` and `stability` stages for the release page, the compare view and
the CSV download.

Curves are drawn from the job's `PerformancePoint` rows (one figure each), the knee, the
out-of-memory stops and the notes from the stage's result. Measured figures are the scaled
twin's on the pool's device; predicted ones for the full-size model are the planner's roofline
on the pool's accelerators. They live in separate panels of every chart, with their own axes,
and every trace name says which it is.

The chart view (which swept field is the x axis, which metric is drawn) comes from the page's
query string (`perf_x`, `perf_metric`), so a link reproduces it; a bad value falls back to the
default view with a message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.db.models import F, QuerySet
from django.urls import reverse
from django.utils.text import slugify

from adaptation.charts import performance as performance_charts
from adaptation.charts import stability as stability_charts
from adaptation.charts.performance_series import CALIBRATED_PREFIX, curve_label, dtype_key
from adaptation.models import (
    AdaptationJob,
    ModelRelease,
    PerformancePoint,
    StageRun,
    StageStatus,
)
from adaptation.plan_presenters import ChartSlot, Fact, tokens_per_s_text
from adaptation.selectors.jobs import latest_runs_by_stage
from engine.formatting import MISSING
from engine.formatting import finite as _number
from engine.stored import as_list, as_mapping

PERFORMANCE_STAGE = "performance"
STABILITY_STAGE = "stability"
CSV_COLUMNS = ("kind", "model", "dtype", "batch_size", "prompt_len", "metric", "value", "unit")
FINISHED = (StageStatus.SUCCEEDED, StageStatus.FAILED)
# Jobs offered to compare with (newest first).
COMPARE_CHOICES_LIMIT = 60


# --- metrics and the chart view -------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """How a stored metric is drawn: its label, the unit drawn and the factor to it, and the
    metric drawn as its upper error bar (the p95 of a median)."""

    name: str
    label: str
    unit: str
    scale: float = 1.0
    p95: str | None = None

    def chart_spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "unit": self.unit,
            "scale": self.scale,
            "p95": self.p95,
        }


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("decode_tokens_per_s", "decode tokens/s", "tokens/s"),
        Metric("prefill_tokens_per_s", "prefill tokens/s", "tokens/s"),
        Metric("ttft_s", "TTFT (median, p95 bar)", "ms", 1000.0, "ttft_p95_s"),
        Metric("tpot_s", "TPOT (median, p95 bar)", "ms", 1000.0, "tpot_p95_s"),
        Metric("peak_process_rss_bytes", "peak memory, process RSS", "MiB", 1 / 2**20),
        Metric("peak_device_allocated_bytes", "peak device memory allocated", "MiB", 1 / 2**20),
    )
}
# Drawn only as the error bars of their medians.
P95_METRICS = ("ttft_p95_s", "tpot_p95_s")
# The default view's two charts: (slot name, title, metrics).
DEFAULT_CHARTS = (
    ("throughput", "Throughput", ("decode_tokens_per_s", "prefill_tokens_per_s")),
    ("latency", "Latency", ("ttft_s", "tpot_s")),
)
X_FIELDS = {"batch_size": "batch size", "prompt_len": "prompt length", "dtype": "dtype"}
_EFFICIENCY_NAME = re.compile(r"[a-z0-9_]{1,64}")


def is_efficiency(metric: str) -> bool:
    """A calibration row: measured over predicted for the twin on the device that ran it."""
    return "efficiency" in metric


def efficiency_metric(name: str, unit: str) -> Metric:
    """An efficiency metric drawn in percent (a stored fraction is multiplied by 100)."""
    scale = 1.0 if unit.strip() == "%" else 100.0
    label = name.removesuffix("_pct").removesuffix("_percent").replace("_", " ")
    return Metric(name, f"{label} (measured / predicted)", "%", scale)


def metric_info(name: str, unit: str = "") -> Metric:
    if name in METRICS:
        return METRICS[name]
    base = name.removeprefix(CALIBRATED_PREFIX)
    if base != name and base in METRICS:
        raw = METRICS[base]
        label = f"{raw.label.removesuffix(' (median, p95 bar)')}, calibrated"
        return Metric(name, label, raw.unit, raw.scale)
    if is_efficiency(name):
        return efficiency_metric(name, unit)
    return Metric(name, name.replace("_", " "), unit or "")


@dataclass(frozen=True)
class PerformanceView:
    """The chart view a URL asks for: `x` the swept field on the x axis, `metric` one metric
    to draw (None: the throughput and latency charts), and why a bad value was replaced."""

    x: str = "batch_size"
    metric: str | None = None
    messages: tuple[str, ...] = ()

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
        return X_FIELDS[self.x]

    @property
    def description(self) -> str:
        what = metric_info(self.metric).label if self.metric else "throughput and latency"
        return f"{what} against {self.x_label}"


def performance_view(params: Mapping[str, Any]) -> PerformanceView:
    """The view named by `perf_x` and `perf_metric` in `params` (a QueryDict or a dict);
    an unknown value is dropped with a message saying what is shown instead."""
    messages = []
    x = str(params.get("perf_x") or "batch_size").strip()
    if x not in X_FIELDS:
        messages.append(
            f"Unknown x axis {x[:64]!r} (perf_x): showing batch size; choose one of "
            f"{', '.join(X_FIELDS)}."
        )
        x = "batch_size"
    metric: str | None = str(params.get("perf_metric") or "").strip() or None
    if metric is not None and not (
        metric in METRICS or (_EFFICIENCY_NAME.fullmatch(metric) and is_efficiency(metric))
    ):
        messages.append(
            f"Unknown metric {metric[:64]!r} (perf_metric): showing throughput and latency; "
            f"choose one of {', '.join(METRICS)}."
        )
        metric = None
    return PerformanceView(x=x, metric=metric, messages=tuple(messages))


# --- reads ----------------------------------------------------------------------------------


def point_rows(run: StageRun) -> list[dict[str, Any]]:
    """The `PerformancePoint` rows of one performance run as dicts of `CSV_COLUMNS`, in a
    stable order: kind, model, dtype, prompt length (none first), batch size, metric."""
    rows: QuerySet = PerformancePoint.objects.filter(stage_run=run).order_by(
        "kind",
        "model",
        "dtype",
        F("prompt_len").asc(nulls_first=True),
        F("batch_size").asc(nulls_first=True),
        "metric",
        "id",
    )
    return list(rows.values(*CSV_COLUMNS))


def _finished_run(runs: Iterable[StageRun]) -> StageRun | None:
    """The newest finished attempt among `runs`."""
    done = [r for r in runs if r.status in FINISHED]
    return max(done, key=lambda r: r.attempt) if done else None


def skipped_reason(job: AdaptationJob, latest: StageRun) -> str:
    """Why the `latest` attempt was skipped ("" unless it was): the stage before it that failed
    and that stage's reason ("skipped: the plan stage failed — the model does not fit ...")."""
    if latest.status != StageStatus.SKIPPED:
        return ""
    failed = [
        r
        for r in latest_runs_by_stage(job).values()
        if r.status == StageStatus.FAILED and r.position < latest.position
    ]
    if not failed:
        return "skipped: an earlier stage did not succeed"
    first = min(failed, key=lambda r: r.position)
    result = as_mapping(first.result)
    why = str(result.get("reason") or "").strip()
    if not why:
        lines = [line for line in str(first.error or "").strip().splitlines() if line.strip()]
        why = lines[-1].strip() if lines else ""
    why = why.rstrip(".")
    return f"skipped: the {first.stage} stage failed" + (f" — {why}" if why else "")


def job_performance_run(job: AdaptationJob) -> StageRun | None:
    """The newest finished attempt of the job's performance stage (what its CSV holds)."""
    return _finished_run(StageRun.objects.filter(job=job, stage=PERFORMANCE_STAGE))


def jobs_with_performance(*, limit: int = COMPARE_CHOICES_LIMIT) -> list[AdaptationJob]:
    """Jobs with stored performance rows, newest first (release and pool loaded)."""
    ids = (
        PerformancePoint.objects.order_by().values_list("job_id", flat=True).distinct()
    )  # the DISTINCT needs no ordering
    return list(
        AdaptationJob.objects.filter(pk__in=ids)
        .select_related("release", "pool")
        .order_by("-created_at", "-id")[:limit]
    )


# --- number formats -------------------------------------------------------------------------


def ms_text(seconds: Any) -> str:
    """Seconds as milliseconds with three significant figures: 0.0022669 → "2.27 ms"."""
    number = _number(seconds)
    if number is None:
        return MISSING
    ms = number * 1000
    if abs(ms) >= 100:
        return f"{ms:,.0f} ms"
    return f"{ms:.1f} ms" if abs(ms) >= 10 else f"{ms:.2f} ms"


def bytes_text(value: Any) -> str:
    """Bytes as MiB with two decimals, and the exact count: "377.09 MiB"."""
    number = _number(value)
    if number is None:
        return MISSING
    return f"{number / 2**20:,.2f} MiB"


def value_text(metric: Metric, value: Any) -> str:
    """A stored figure in the unit the page draws it in."""
    number = _number(value)
    if number is None:
        return MISSING
    if metric.unit == "ms":
        return ms_text(number)
    if metric.unit == "tokens/s":
        return tokens_per_s_text(number)
    if metric.unit == "MiB":
        return bytes_text(number)
    if metric.unit == "%":
        return f"{number * metric.scale:,.1f} %"
    return f"{number:,.4g} {metric.unit}".strip()


# --- the table view -------------------------------------------------------------------------


@dataclass(frozen=True)
class TableRow:
    """One point (kind, model, dtype, batch, prompt) with its figures per metric column."""

    curve: str
    kind: str
    model: str
    dtype: str
    batch_size: Any
    prompt_len: Any
    cells: list[str]


@dataclass(frozen=True)
class PointTable:
    """The rows of a run pivoted to a point per line and a metric per column."""

    columns: list[str]
    rows: list[TableRow]


def point_table(rows: Sequence[Mapping[str, Any]]) -> PointTable:
    """The same numbers as the charts and the CSV, a line per point."""
    present = list(dict.fromkeys(r["metric"] for r in rows))
    known = [m for m in (*METRICS, *P95_METRICS) if m in present]
    metrics = known + sorted(m for m in present if m not in known)
    units = {r["metric"]: r["unit"] for r in rows}
    labels = []
    for name in metrics:
        if name in P95_METRICS:
            labels.append(f"{name.removesuffix('_p95_s').upper()} p95 (ms)")
        else:
            info = metric_info(name, units.get(name, ""))
            labels.append(f"{info.label.removesuffix(' (median, p95 bar)')} ({info.unit})")
    points: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        key = (r["kind"], r["model"], r["dtype"], r["batch_size"], r["prompt_len"])
        points.setdefault(key, {})[r["metric"]] = r
    table_rows = []
    for key in sorted(
        points,
        key=lambda k: (
            k[1] != "twin",
            k[0] != "measured",
            dtype_key(k[2]),
            k[4] is not None,
            k[4] or 0,
            k[3] or 0,
        ),
    ):
        cells = []
        for name in metrics:
            row = points[key].get(name)
            if row is None:
                cells.append(MISSING)
            elif name in P95_METRICS:
                cells.append(ms_text(row["value"]))
            else:
                cells.append(value_text(metric_info(name, row["unit"]), row["value"]))
        kind, model, dtype, batch, prompt = key
        table_rows.append(
            TableRow(curve_label(kind, model), kind, model, dtype, batch, prompt, cells)
        )
    return PointTable(columns=labels, rows=table_rows)


# --- the release page's performance panel ---------------------------------------------------


@dataclass(frozen=True)
class KneeRow:
    """A dtype's recommended batch (the knee of its measured decode curve)."""

    dtype: str
    prompt_len: Any
    batch_size: Any
    tpot: str
    tpot_p95: str
    decode: str
    found: bool
    reason: str


@dataclass
class PerformancePanel:
    """One job's performance: its newest finished `performance` attempt, shaped for a page."""

    job: AdaptationJob
    run: StageRun | None  # the attempt shown (None while the first one has not finished)
    latest: StageRun  # the newest attempt, whatever its status
    state: str = "waiting"  # "measured", "failed", "empty" or "waiting"
    rows: list[dict[str, Any]] = field(default_factory=list)
    charts: list[ChartSlot] = field(default_factory=list)
    chart_note: str = ""
    facts: list[Fact] = field(default_factory=list)
    knees: list[KneeRow] = field(default_factory=list)
    knee_rule: str = ""
    stops: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    calibration: list[Fact] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    predicted_note: str = ""
    failure: str = ""
    skipped: str = ""  # why the newest attempt was skipped ("" unless it was)
    table: PointTable | None = None
    compare_choices: list[tuple[str, list[tuple[int, str]]]] = field(default_factory=list)

    @property
    def dom_id(self) -> str:
        return f"performance-job-{self.job.pk}"

    @property
    def csv_url(self) -> str:
        return reverse("adaptation:job_performance_csv", args=[self.job.pk])

    @property
    def showing_older(self) -> bool:
        return self.run is not None and self.run.pk != self.latest.pk


def _knee_rows(result: Mapping[str, Any]) -> list[KneeRow]:
    rows = []
    for knee in (as_mapping(k) for k in as_mapping(result.get("knee_by_dtype")).values()):
        rows.append(
            KneeRow(
                dtype=str(knee.get("dtype", MISSING)),
                prompt_len=knee.get("prompt_len"),
                batch_size=knee.get("batch_size"),
                tpot=ms_text(knee.get("tpot_s")),
                tpot_p95=ms_text(knee.get("tpot_p95_s")),
                decode=tokens_per_s_text(knee.get("decode_tokens_per_s")),
                found=bool(knee.get("found")),
                reason=str(knee.get("reason") or ""),
            )
        )
    return rows


def _problems(result: Mapping[str, Any]) -> list[str]:
    problems = [
        f"{e.get('dtype')} at prompt {e.get('prompt_len')}, batch {e.get('batch_size')}: the twin "
        f"raised {e.get('error')}"
        for e in (as_mapping(e) for e in as_list(result.get("errors")))
    ]
    problems += [
        f"{dtype} not measured: {why}"
        for dtype, why in as_mapping(result.get("skipped_dtypes")).items()
    ]
    problems += [
        f"prompt {s.get('prompt_len')} not measured: {s.get('reason')}"
        for s in (as_mapping(s) for s in as_list(result.get("skipped_prompt_lens")))
    ]
    return problems


def _facts(result: Mapping[str, Any]) -> list[Fact]:
    twin = as_mapping(result.get("twin"))
    options = as_mapping(result.get("options"))
    params = _number(twin.get("parameters"))
    facts = [
        Fact("Device", f"{result.get('device', MISSING)} ({result.get('backend', MISSING)})"),
        Fact(
            "Measured on",
            f"the scaled twin, {params:,.0f} parameters" if params else "the scaled twin",
            "speeds and memory of the twin, not of the full-size model",
        ),
        Fact("Timer", str(result.get("timer") or MISSING)),
        Fact(
            "Memory",
            str(result.get("memory_kind") or MISSING),
            str(result.get("memory_method") or ""),
        ),
    ]
    if options:
        facts.append(
            Fact(
                "Sweep",
                f"batch 1 to {options.get('max_batch_size', MISSING)} (powers of two), prompts "
                f"{', '.join(str(n) for n in as_list(options.get('prompt_lens'))) or MISSING} "
                "tokens",
                f"{options.get('repeats', MISSING)} timed decode steps after "
                f"{options.get('warmup', MISSING)} warm-up; "
                f"{options.get('prefill_repeats', MISSING)} timed prefills after "
                f"{options.get('prefill_warmup', MISSING)}",
            )
        )
    if result.get("threads"):
        facts.append(Fact("CPU threads", str(result["threads"])))
    duration = _number(result.get("duration_s"))
    if duration is not None:
        facts.append(Fact("Stage took", f"{duration:,.1f} s"))
    return facts


def _predicted_note(result: Mapping[str, Any]) -> str:
    info = as_mapping(result.get("predicted"))
    if not info:
        return ""
    if not info.get("available"):
        return f"No full-size prediction: {info.get('reason') or 'the plan made none'}."
    split = as_mapping(info.get("split"))
    context = _number(info.get("context_tokens"))
    return (
        f"Predicted for the full-size model by the planner's roofline on {info.get('accelerator')}"
        f" (TP{split.get('tp')} PP{split.get('pp')} EP{split.get('ep')} DP{split.get('dp')}, "
        f"{split.get('devices')} devices), {info.get('dtype_label') or info.get('dtype')}"
        + (f", decode at a {context:,.0f}-token context per sequence" if context else "")
        + ": a prediction, not a measurement, on another scale than the twin's."
    )


def _percent(value: Any) -> str:
    number = _number(value)
    return MISSING if number is None else f"{number * 100:,.1f} %"


def _calibration(result: Mapping[str, Any]) -> list[Fact]:
    """The run's calibration (the twin measured against the roofline's prediction for the
    twin on the same device) and the full-size prediction it corrected, as facts."""
    cal = as_mapping(result.get("calibration"))
    facts = []
    if cal.get("available"):
        by_dtype = as_mapping(cal.get("by_dtype"))
        per_dtype = "; ".join(
            f"{dtype} {_percent(as_mapping(d).get('decode_efficiency_median'))} over "
            f"{as_mapping(d).get('points', MISSING)} points"
            for dtype, d in by_dtype.items()
        )
        facts += [
            Fact(
                "Decode efficiency, twin (measured / predicted, median)",
                _percent(cal.get("decode_efficiency_median")),
                per_dtype,
            ),
            Fact(
                "Prefill efficiency, twin (measured / predicted, median)",
                _percent(cal.get("prefill_efficiency_median")),
            ),
        ]
        figures = as_mapping(cal.get("figures"))
        if figures:
            facts.append(
                Fact(
                    "Roofline figures for the twin's device",
                    f"{figures.get('kind') or MISSING}: {figures.get('name') or MISSING}",
                    str(figures.get("source") or ""),
                )
            )
        if cal.get("basis"):
            facts.append(Fact("Basis", str(cal["basis"])))
    elif cal:
        facts.append(Fact("Calibration", "none", str(cal.get("reason") or "")))
    calibrated = as_mapping(as_mapping(result.get("predicted")).get("calibrated"))
    if calibrated.get("available"):
        factors = ", ".join(
            f"{what} x {value:.3g}"
            for what, value in (
                ("decode", _number(calibrated.get("decode_factor"))),
                ("prefill", _number(calibrated.get("prefill_factor"))),
            )
            if value is not None
        )
        note = " ".join(
            str(calibrated[k]) for k in ("basis", "caveat", "warning") if calibrated.get(k)
        )
        facts.append(
            Fact(
                "Full-size prediction, calibrated",
                f"{factors or MISSING} (the pool's running calibration over "
                f"{calibrated.get('runs', MISSING)} runs), drawn dotted beside the raw one",
                note,
            )
        )
    elif calibrated:
        facts.append(
            Fact("Full-size prediction, calibrated", "none", str(calibrated.get("reason") or ""))
        )
    return facts


def chart_source(
    *, label: str, rows: Sequence[Mapping[str, Any]], result: Mapping[str, Any]
) -> dict[str, Any]:
    """A job's rows and what its result adds to a chart (knees, stops, dtype labels)."""
    predicted = as_mapping(result.get("predicted"))
    labels = {}
    if predicted.get("dtype") and predicted.get("dtype_label"):
        labels[str(predicted["dtype"])] = str(predicted["dtype_label"])
    return {
        "label": label,
        "rows": rows,
        "dtype_labels": labels,
        "knees": [as_mapping(k) for k in as_mapping(result.get("knee_by_dtype")).values()],
        "stops": [as_mapping(s) for s in as_list(result.get("stopped"))],
    }


def view_charts(
    sources: Sequence[Mapping[str, Any]], view: PerformanceView, *, stem: str, whose: str
) -> list[ChartSlot]:
    """The charts of `view` over `sources`: throughput and latency (and calibration, when
    efficiency rows exist), or the one metric the view asks for."""
    units = {r["metric"]: r["unit"] for s in sources for r in s["rows"]}
    along = X_FIELDS[view.x]
    if view.metric:
        info = metric_info(view.metric, units.get(view.metric, ""))
        groups = [(view.metric.replace("_", "-"), info.label, (view.metric,))]
    else:
        groups = list(DEFAULT_CHARTS)
        efficiency = sorted(m for m in units if is_efficiency(m))
        if efficiency:
            groups.append(
                ("calibration", "Calibration: measured / predicted for the twin", tuple(efficiency))
            )
    slots = []
    for name, title, names in groups:
        specs = [metric_info(n, units.get(n, "")).chart_spec() for n in names]
        figure = performance_charts.curves(
            sources, metrics=specs, x=view.x, title=f"{title} vs {along}{whose}"
        )
        if figure is not None:
            slots.append(
                ChartSlot(
                    f"{stem}-{name}",
                    figure,
                    f"{title} against {along}: measured on the scaled twin and predicted for the "
                    "full-size model, in separate panels",
                )
            )
    return slots


def chart_note(rows: Sequence[Mapping[str, Any]], view: PerformanceView, *, drawn: bool) -> str:
    """What the view's charts leave out, in words ("" when nothing)."""
    if not drawn:
        return f"No stored row has the metric {view.metric} with a {view.x_label}."
    wanted = {view.metric} if view.metric else {n for _, _, names in DEFAULT_CHARTS for n in names}
    wanted |= {CALIBRATED_PREFIX + n for n in wanted}
    off_axis = {
        (r["kind"], r["model"], r["dtype"])
        for r in rows
        if r["metric"] in wanted and r.get(view.x) is None
    }
    if not off_axis:
        return ""
    curves = ", ".join(f"{dtype} ({curve_label(k, m)})" for k, m, dtype in sorted(off_axis))
    return (
        f"Figures without a {view.x_label} are not on this axis: {curves}. The full-size decode "
        "predictions are made at the plan's context; choose batch size as the x axis to see them."
    )


def _compare_choices(
    job: AdaptationJob, candidates: Sequence[AdaptationJob]
) -> list[tuple[str, list[tuple[int, str]]]]:
    """Other jobs with performance rows, grouped: same release on other pools, same pool with
    other releases, the rest."""
    groups: dict[str, list[tuple[int, str]]] = {
        "Same release, other pools": [],
        "Same pool, other releases": [],
        "Other jobs": [],
    }
    for other in candidates:
        if other.pk == job.pk:
            continue
        label = f"job {other.pk}: {other.release.repo_id} on {other.pool.name}"
        if other.release_id == job.release_id:
            groups["Same release, other pools"].append((other.pk, label))
        elif other.pool_id == job.pool_id:
            groups["Same pool, other releases"].append((other.pk, label))
        else:
            groups["Other jobs"].append((other.pk, label))
    return [(title, items) for title, items in groups.items() if items]


def performance_panel(
    job: AdaptationJob,
    view: PerformanceView,
    *,
    candidates: Sequence[AdaptationJob] = (),
) -> PerformancePanel | None:
    """The performance panel of `job` (stage runs prefetched), or None without a
    `performance` run."""
    runs = [r for r in job.stage_runs.all() if r.stage == PERFORMANCE_STAGE]
    latest = latest_runs_by_stage(job).get(PERFORMANCE_STAGE)
    if latest is None:
        return None
    run = _finished_run(runs)
    panel = PerformancePanel(job=job, run=run, latest=latest, skipped=skipped_reason(job, latest))
    if run is None:
        return panel
    result = as_mapping(run.result)
    panel.rows = point_rows(run)
    if run.status == StageStatus.FAILED:
        panel.failure = str(run.error or result.get("reason") or "the stage failed").strip()
    if not panel.rows:
        panel.state = "failed" if run.status == StageStatus.FAILED else "empty"
        return panel
    panel.state = "failed" if run.status == StageStatus.FAILED else "measured"
    panel.charts = view_charts(
        [chart_source(label="", rows=panel.rows, result=result)],
        view,
        stem=panel.dom_id,
        whose="",
    )
    panel.chart_note = chart_note(panel.rows, view, drawn=bool(panel.charts))
    panel.facts = _facts(result)
    panel.knees = _knee_rows(result)
    panel.knee_rule = str(result.get("knee_rule") or "")
    stops = [as_mapping(s) for s in as_list(result.get("stopped"))]
    panel.stops = [
        f"{s.get('dtype')}, prompt {s.get('prompt_len')}: {s.get('reason')}" for s in stops
    ]
    panel.problems = _problems(result)
    panel.calibration = _calibration(result)
    panel.notes = [str(n) for n in as_list(result.get("notes"))]
    panel.predicted_note = _predicted_note(result)
    panel.table = point_table(panel.rows)
    panel.compare_choices = _compare_choices(job, candidates)
    return panel


@dataclass
class PerformanceSection:
    """The release page's performance section: the view and a panel per job."""

    view: PerformanceView
    panels: list[PerformancePanel]

    @property
    def x_choices(self) -> list[tuple[str, str]]:
        return list(X_FIELDS.items())

    @property
    def metric_choices(self) -> list[tuple[str, str]]:
        present = {r["metric"]: r["unit"] for p in self.panels for r in p.rows}
        names = [m for m in METRICS if m in present or m in ("decode_tokens_per_s",)]
        names += sorted(m for m in present if is_efficiency(m))
        return [(m, metric_info(m, present.get(m, "")).label) for m in names]


def performance_section(release: ModelRelease, *, params: Mapping[str, Any]) -> PerformanceSection:
    """Every job of the release (jobs and stage runs prefetched) with a performance run,
    newest job first, drawn in the view `params` ask for."""
    view = performance_view(params)
    jobs = [
        j
        for j in release.jobs.all()
        if any(r.stage == PERFORMANCE_STAGE for r in j.stage_runs.all())
    ]
    candidates = jobs_with_performance() if jobs else []
    panels = [p for j in jobs if (p := performance_panel(j, view, candidates=candidates))]
    return PerformanceSection(view=view, panels=panels)


# --- the stability panel --------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """A figure of the stability run beside its threshold."""

    label: str
    value: str
    threshold: str
    within: bool | None  # None: not judged (too few samples)


@dataclass
class StabilityPanel:
    """One job's stability run: its newest finished `stability` attempt."""

    job: AdaptationJob
    run: StageRun | None
    latest: StageRun
    state: str = "waiting"  # "passed", "failed" or "waiting"
    passed: bool | None = None
    reason: str = ""
    reasons: list[str] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    charts: list[ChartSlot] = field(default_factory=list)
    error_messages: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str = ""  # why the newest attempt was skipped ("" unless it was)

    @property
    def dom_id(self) -> str:
        return f"stability-job-{self.job.pk}"

    @property
    def showing_older(self) -> bool:
        return self.run is not None and self.run.pk != self.latest.pk


def _verdicts(result: Mapping[str, Any]) -> list[Verdict]:
    limits = as_mapping(result.get("thresholds"))
    slope = _number(result.get("memory_slope_bytes_per_step"))
    growth = _number(result.get("memory_growth_bytes"))
    slope_limit = _number(limits.get("leak_bytes_per_step"))
    growth_limit = _number(limits.get("leak_min_growth_bytes"))
    # A leak needs both limits: over a short run the growth limit is the stricter one.
    effective = _number(limits.get("leak_effective_bytes_per_step"))
    drift = _number(result.get("step_time_drift"))
    drift_limit = _number(limits.get("max_step_time_drift"))
    nonfinite = _number(result.get("nonfinite_outputs"))
    nonfinite_limit = _number(limits.get("max_nonfinite_outputs"))
    errors = _number(result.get("errors"))
    leak = (
        None
        if slope is None or slope_limit is None
        else not (slope > slope_limit and (growth or 0) > (growth_limit or 0))
    )
    return [
        Verdict(
            "Memory slope",
            MISSING if slope is None else f"{slope:,.0f} bytes/step",
            MISSING
            if slope_limit is None
            else f"leak above {max(slope_limit, effective or 0):,.0f} bytes/step"
            + (
                f" (the {slope_limit:,.0f} floor, or the growth limit over this run's steps)"
                if effective and effective > slope_limit
                else ""
            ),
            leak,
        ),
        Verdict(
            "Fitted memory growth",
            MISSING if growth is None else f"{growth:,.0f} bytes",
            MISSING if growth_limit is None else f"and above {growth_limit:,.0f} bytes",
            leak,
        ),
        Verdict(
            "NaN/Inf outputs",
            MISSING if nonfinite is None else f"{nonfinite:,.0f} logit rows",
            MISSING if nonfinite_limit is None else f"at most {nonfinite_limit:,.0f}",
            None if nonfinite is None or nonfinite_limit is None else nonfinite <= nonfinite_limit,
        ),
        Verdict(
            "Exceptions",
            MISSING if errors is None else f"{errors:,.0f} steps raised",
            "none",
            None if errors is None else errors == 0,
        ),
        Verdict(
            "Step-time drift",
            MISSING if drift is None else f"{drift:+.1%}",
            MISSING
            if drift_limit is None
            else f"at most {drift_limit:+.0%} ("
            f"{result.get('step_time_drift_basis') or 'step time'})",
            None if drift is None or drift_limit is None else drift <= drift_limit,
        ),
    ]


def _stability_facts(result: Mapping[str, Any]) -> list[Fact]:
    workload = as_mapping(result.get("workload"))
    duration = _number(result.get("duration_s"))
    wall = _number(result.get("wall_time_drift"))
    facts = [
        Fact("Duration", MISSING if duration is None else f"{duration:,.1f} s"),
        Fact(
            "Steps",
            f"{result.get('steps', MISSING)}",
            f"{result.get('warmup_steps', MISSING)} warm-up steps left out of the fits",
        ),
        Fact(
            "Step",
            f"batch {workload.get('batch_size', MISSING)} x (prompt "
            f"{workload.get('prompt_len', MISSING)} + "
            f"{workload.get('decode_steps', MISSING)} decode steps)",
            f"{workload.get('dtype', MISSING)} on {workload.get('device', MISSING)}",
        ),
        Fact(
            "Step time",
            f"median {ms_text(result.get('step_time_median_s'))}, "
            f"p95 {ms_text(result.get('step_time_p95_s'))}",
            ""
            if wall is None
            else f"wall-time drift {wall:+.1%} (reported, not judged on the CPU)",
        ),
        Fact(
            "Memory",
            f"{bytes_text(result.get('memory_start_bytes'))} to "
            f"{bytes_text(result.get('memory_end_bytes'))}, "
            f"max {bytes_text(result.get('memory_max_bytes'))}",
            str(result.get("memory_method") or result.get("memory_kind") or ""),
        ),
    ]
    if result.get("stopped_early"):
        facts.append(Fact("Stopped early", str(result["stopped_early"])))
    return facts


def stability_panel(job: AdaptationJob) -> StabilityPanel | None:
    """The stability panel of `job` (stage runs prefetched), or None without a run."""
    latest = latest_runs_by_stage(job).get(STABILITY_STAGE)
    if latest is None:
        return None
    run = _finished_run(r for r in job.stage_runs.all() if r.stage == STABILITY_STAGE)
    panel = StabilityPanel(job=job, run=run, latest=latest, skipped=skipped_reason(job, latest))
    if run is None:
        return panel
    result = as_mapping(run.result)
    if not result:
        panel.state = "failed"
        panel.passed = False
        panel.reason = str(run.error or "the stage failed without a result")
        return panel
    panel.passed = bool(result.get("passed")) and run.status == StageStatus.SUCCEEDED
    panel.state = "passed" if panel.passed else "failed"
    panel.reason = str(result.get("reason") or run.error or "")
    panel.reasons = [str(r) for r in as_list(result.get("reasons"))]
    panel.verdicts = _verdicts(result)
    panel.facts = _stability_facts(result)
    panel.error_messages = [str(m) for m in as_list(result.get("error_messages"))]
    panel.notes = [str(n) for n in as_list(result.get("notes"))]
    samples = [as_mapping(s) for s in as_list(result.get("samples"))]
    limits = as_mapping(result.get("thresholds"))
    warmup = result.get("warmup_steps") if isinstance(result.get("warmup_steps"), int) else None
    figures = (
        (
            "memory",
            stability_charts.memory(
                samples,
                warmup_steps=warmup,
                slope_bytes_per_step=_number(result.get("memory_slope_bytes_per_step")),
                threshold_bytes_per_step=_number(
                    limits.get("leak_effective_bytes_per_step") or limits.get("leak_bytes_per_step")
                ),
                memory_kind=str(result.get("memory_kind")),
            ),
            "Memory in use after each step of the stability run (measured, twin)",
        ),
        (
            "step-time",
            stability_charts.step_time(
                samples,
                warmup_steps=warmup,
                first_quarter_s=_number(result.get("step_time_first_quarter_s")),
                last_quarter_s=_number(result.get("step_time_last_quarter_s")),
                basis=str(result.get("step_time_drift_basis") or "step time"),
            ),
            "Time per step of the stability run (measured, twin)",
        ),
    )
    panel.charts = [
        ChartSlot(f"{panel.dom_id}-{name}", figure, label)
        for name, figure, label in figures
        if figure is not None
    ]
    return panel


def stability_panels(release: ModelRelease) -> list[StabilityPanel]:
    """A stability panel per job of the release with a `stability` run, newest job first."""
    return [p for job in release.jobs.all() if (p := stability_panel(job)) is not None]


# --- the compare view and the CSV -----------------------------------------------------------


class CompareError(Exception):
    """A compare request that cannot be answered: `status` 400 (bad ids) or 404."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def compare_job_ids(values: Sequence[str]) -> list[int]:
    """Two distinct job ids from `jobs` values ("12,34", or two values "12" and "34").
    Raises `CompareError` (400) naming what is wrong."""
    parts = [p.strip() for v in values for p in str(v).split(",") if p.strip()]
    if not parts:
        raise CompareError("Name two jobs to compare: ?jobs=<id>,<id>.", 400)
    bad = [p for p in parts if not p.isascii() or not p.isdigit() or len(p) > 12]
    if bad:
        raise CompareError(
            f"Job ids are whole numbers; got {', '.join(repr(b[:20]) for b in bad)}.", 400
        )
    ids = [int(p) for p in parts]
    if len(ids) != 2:
        raise CompareError(
            f"Compare takes two jobs; got {len(ids)} ({', '.join(map(str, ids))}).", 400
        )
    if ids[0] == ids[1]:
        raise CompareError(f"Compare takes two different jobs; got job {ids[0]} twice.", 400)
    return ids


@dataclass
class CompareJob:
    """One job of a comparison, with its performance run's rows and result."""

    job: AdaptationJob
    run: StageRun
    rows: list[dict[str, Any]]
    result: Mapping[str, Any]
    knees: list[KneeRow]

    @property
    def label(self) -> str:
        return f"{self.job.release.repo_id} on {self.job.pool.name}"

    @property
    def csv_url(self) -> str:
        return reverse("adaptation:job_performance_csv", args=[self.job.pk])


@dataclass
class Comparison:
    view: PerformanceView
    jobs: list[CompareJob]
    charts: list[ChartSlot]
    kind: str  # what is compared, in words
    note: str = ""  # what the charts leave out

    @property
    def jobs_query(self) -> str:
        return ",".join(str(c.job.pk) for c in self.jobs)


def compare_performance(job_ids: Sequence[int], view: PerformanceView) -> Comparison:
    """Both jobs' performance rows overlaid on the same axes. Raises `CompareError` (404) for
    a job that does not exist or has no stored performance rows."""
    found = {
        j.pk: j
        for j in AdaptationJob.objects.filter(pk__in=job_ids).select_related("release", "pool")
    }
    missing = [i for i in job_ids if i not in found]
    if missing:
        raise CompareError(f"No job {', '.join(map(str, missing))}.", 404)
    jobs = []
    for pk in job_ids:
        job = found[pk]
        run = job_performance_run(job)
        rows = point_rows(run) if run is not None else []
        if not rows:
            raise CompareError(
                f"Job {pk} ({job.release.repo_id} on {job.pool.name}) has no stored "
                "performance rows: its performance stage has not finished with measurements.",
                404,
            )
        result = as_mapping(run.result)
        jobs.append(CompareJob(job, run, rows, result, _knee_rows(result)))
    a, b = (c.job for c in jobs)
    if a.release_id == b.release_id:
        kind = f"the same release, {a.release.repo_id}, on pools {a.pool.name} and {b.pool.name}"
    elif a.pool_id == b.pool_id:
        kind = f"two releases on pool {a.pool.name}"
    else:
        kind = "two releases on two pools"
    sources = [chart_source(label=c.label, rows=c.rows, result=c.result) for c in jobs]
    slots = view_charts(sources, view, stem="compare-performance", whose=" (two jobs overlaid)")
    note = chart_note([r for c in jobs for r in c.rows], view, drawn=bool(slots)) if slots else ""
    return Comparison(view=view, jobs=jobs, charts=slots, kind=kind, note=note)


def csv_filename(job: AdaptationJob) -> str:
    """day0-job-12-deepseek-ai-deepseek-v3-h200x8-performance.csv"""
    repo = slugify(job.release.repo_id.replace("/", "-"))
    return f"day0-job-{job.pk}-{repo}-{slugify(job.pool.name)}-performance.csv"


def csv_cell(value: Any) -> str:
    """A CSV cell: "" for None, an integral float as an integer (bytes: 1189212160, not
    1189212160.0), else the shortest exact repr of a float."""
    if value is None:
        return ""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 2**53:
            return str(int(value))
        return repr(value)
    return str(value)


def compare_choices() -> list[tuple[int, str]]:
    """Jobs with stored performance rows, for the compare page's selects."""
    return [
        (j.pk, f"job {j.pk}: {j.release.repo_id} on {j.pool.name}") for j in jobs_with_performance()
    ]
