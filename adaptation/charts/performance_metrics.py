"""How each stored performance metric is drawn (its label, the unit drawn and the factor to it,
its p95 error bar): the vocabulary the performance charts' axes and the pages' metric
choices and table columns share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adaptation.charts.performance_series import CALIBRATED_PREFIX
from engine.units import MIB


@dataclass(frozen=True)
class Metric:
    """How a stored metric is drawn: its label, the unit drawn and the factor to it (value x
    `scale` is drawn), and the metric drawn as its upper error bar (the p95 of a median)."""

    name: str
    label: str
    unit: str
    scale: float = 1.0
    p95: str | None = None

    @property
    def short_label(self) -> str:
        """The label without what the chart draws around the median: "TTFT"."""
        return self.label.removesuffix(" (median, p95 bar)")

    @property
    def header(self) -> str:
        """A table column's header: the short label and its unit, the unit once ("decode
        tokens/s", not "decode tokens/s (tokens/s)"; "TTFT (ms)")."""
        if not self.unit or self.short_label.endswith(self.unit):
            return self.short_label
        return f"{self.short_label} ({self.unit})"

    def chart_spec(self) -> dict[str, Any]:
        """The metric as `charts.performance.curves` takes it."""
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
        Metric("peak_process_rss_bytes", "peak memory, process RSS", "MiB", 1 / MIB),
        Metric("peak_device_allocated_bytes", "peak device memory allocated", "MiB", 1 / MIB),
        Metric(
            "peak_process_rss_increase_bytes", "peak memory increase, process RSS", "MiB", 1 / MIB
        ),
        Metric(
            "peak_device_allocated_increase_bytes",
            "peak device memory increase",
            "MiB",
            1 / MIB,
        ),
    )
}
# Drawn only as the error bars of their medians.
P95_METRICS = ("ttft_p95_s", "tpot_p95_s")


def is_efficiency(metric: str) -> bool:
    """A calibration row: measured over predicted for the twin on the device that ran it."""
    return "efficiency" in metric


def efficiency_metric(name: str, unit: str) -> Metric:
    """An efficiency metric drawn in percent (a stored fraction is multiplied by 100)."""
    scale = 1.0 if unit.strip() == "%" else 100.0
    label = name.removesuffix("_pct").removesuffix("_percent").replace("_", " ")
    return Metric(name, f"{label} (measured / predicted)", "%", scale)


def metric_info(name: str, unit: str = "") -> Metric:
    """How `name` (stored in `unit`) is drawn: a known metric, its calibrated variant, an
    efficiency, or any other metric in its own unit."""
    if name in METRICS:
        return METRICS[name]
    base = name.removeprefix(CALIBRATED_PREFIX)
    if base != name and base in METRICS:
        raw = METRICS[base]
        return Metric(name, f"{raw.short_label}, calibrated", raw.unit, raw.scale)
    if is_efficiency(name):
        return efficiency_metric(name, unit)
    return Metric(name, name.replace("_", " "), unit or "")
