"""The stored points of a performance run (read by `selectors.performance`) as a table, a line
per point, and as the CSV's columns."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from adaptation.charts.performance_metrics import METRICS, P95_METRICS, Metric, metric_info
from adaptation.charts.performance_series import curve_label, dtype_key
from adaptation.selectors.performance import POINT_FIELDS
from engine.formatting import finite

# The CSV of a job's performance prints every stored field of each point.
CSV_COLUMNS = POINT_FIELDS


@dataclass(frozen=True)
class TableColumn:
    """A metric column: its metric as drawn, or for a p95 column the metric it is the p95 of
    (`p95_of`: "ttft"; its figures in ms)."""

    metric: Metric
    p95_of: str = ""


@dataclass(frozen=True)
class Cell:
    """A figure of the table in the unit its column draws ("ms", "tokens/s", "MiB", "%" (a
    fraction), or the stored unit), None where the point has none."""

    value: float | None
    unit: str


@dataclass(frozen=True)
class TableRow:
    """One point (kind, model, dtype, batch, prompt) with its figure per column, and its
    curve's name as the charts' legends say it."""

    curve: str
    kind: str
    model: str
    dtype: str
    batch_size: Any
    prompt_len: Any
    cells: list[Cell]


@dataclass(frozen=True)
class PointTable:
    """The rows of a run pivoted to a point per line and a metric per column; a row's cells
    line up with `columns`."""

    columns: list[TableColumn]
    rows: list[TableRow]


def point_table(rows: Sequence[Mapping[str, Any]]) -> PointTable:
    """The same numbers as the charts and the CSV, a line per point."""
    present = list(dict.fromkeys(r["metric"] for r in rows))
    known = [m for m in (*METRICS, *P95_METRICS) if m in present]
    names = known + sorted(m for m in present if m not in known)
    units = {r["metric"]: r["unit"] for r in rows}
    columns = [
        TableColumn(METRICS[name.replace("_p95", "")], p95_of=name.removesuffix("_p95_s"))
        if name in P95_METRICS
        else TableColumn(metric_info(name, units.get(name, "")))
        for name in names
    ]
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
        for name, column in zip(names, columns, strict=True):
            value = finite(points[key].get(name, {}).get("value"))
            if value is not None and column.metric.unit == "%":  # the percent filter's fraction
                value = value * column.metric.scale / 100
            cells.append(Cell(value, column.metric.unit))
        kind, model, dtype, batch, prompt = key
        table_rows.append(
            TableRow(curve_label(kind, model), kind, model, dtype, batch, prompt, cells)
        )
    return PointTable(columns=columns, rows=table_rows)
