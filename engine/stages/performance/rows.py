"""The rows a performance result is stored as (`performance_rows`, `calibration_rows`):
plain Python without torch, so the web process flattens a result without loading the engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from engine.stages.plan.calibration import EFFICIENCY_METRICS, EFFICIENCY_UNIT

# The metrics of a performance point and their units (`performance_rows`).
UNITS: Mapping[str, str] = {
    "ttft_s": "s",
    "ttft_p95_s": "s",
    "tpot_s": "s",
    "tpot_p95_s": "s",
    "prefill_tokens_per_s": "tokens/s",
    "decode_tokens_per_s": "tokens/s",
    "peak_memory_bytes": "bytes",
    "peak_memory_increase_bytes": "bytes",
}
CALIBRATED_UNITS: Mapping[str, str] = {
    "calibrated_ttft_s": "s",
    "calibrated_tpot_s": "s",
    "calibrated_prefill_tokens_per_s": "tokens/s",
    "calibrated_decode_tokens_per_s": "tokens/s",
}
# Peak-memory metrics are stored under a name that says which memory (the point's kind).
_MEMORY_METRIC_NAMES = {
    "peak_memory_bytes": "peak_{kind}_bytes",
    "peak_memory_increase_bytes": "peak_{kind}_increase_bytes",
}


def performance_rows(points: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per point and metric, for storage (the job and pool are the caller's):
    {"kind", "model", "dtype", "batch_size", "prompt_len", "metric", "value", "unit"}.

    Metrics: ttft_s, ttft_p95_s, tpot_s, tpot_p95_s (s), prefill_tokens_per_s,
    decode_tokens_per_s (tokens/s), the peak memory named by its kind:
    peak_device_allocated_bytes or peak_process_rss_bytes (bytes, the point's peak), and what
    the point itself added: peak_device_allocated_increase_bytes or
    peak_process_rss_increase_bytes (bytes, the peak minus the memory in use as the point
    began; on the CPU the resident set carries earlier points' memory, so points compare by
    this one), and a full-size predicted point's calibrated_ttft_s, calibrated_tpot_s (s),
    calibrated_prefill_tokens_per_s, calibrated_decode_tokens_per_s (tokens/s). None values
    are left out.
    """
    rows = []
    for point in points:
        key = {k: point.get(k) for k in ("kind", "model", "dtype", "batch_size", "prompt_len")}
        for metric, unit in (UNITS | CALIBRATED_UNITS).items():
            value = point.get(metric)
            if value is None:
                continue
            name = metric
            if metric in _MEMORY_METRIC_NAMES:
                kind = point.get("memory_kind") or "memory"
                name = _MEMORY_METRIC_NAMES[metric].format(kind=kind)
            rows.append(key | {"metric": name, "value": value, "unit": unit})
    return rows


def calibration_rows(calibration: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The rows of a run's calibration (same keys as `performance_rows`): the twin's predicted
    figures (kind "predicted", model "twin": ttft_s, tpot_s, prefill_tokens_per_s,
    decode_tokens_per_s) and its efficiencies (metrics "decode_efficiency" and
    "prefill_efficiency", unit "ratio"). An efficiency is measured / predicted: a ratio
    derived from the measured point, stored with kind "measured" and the measured point's
    model ("twin"; "twin" where the point names none), never "full-size"."""
    if not isinstance(calibration, Mapping):
        return []
    points = calibration.get("points") or []
    rows = performance_rows(points)
    for point in points:
        key = {k: point.get(k) for k in ("dtype", "batch_size", "prompt_len")}
        for metric in EFFICIENCY_METRICS:
            if point.get(metric) is not None:
                rows.append(
                    {"kind": "measured", "model": point.get("model") or "twin"}
                    | key
                    | {"metric": metric, "value": point[metric], "unit": EFFICIENCY_UNIT}
                )
    return rows
