"""A serve result's load sweeps as performance rows, one figure each (docs/stages/serve.md, the
rows after "The result"): what the app stores as `PerformancePoint` rows marked with the
engine that measured them (`adaptation.services.stage_results`).

Each row: {"kind", "model", "dtype", "prompt_len", "output_len", "tp_size", "concurrency",
"load_format", "engine", "engine_version", "metric", "value", "unit"}. The twin's sweep:
kind "measured", model "twin" ("release" for the real weights), the dtype served,
`prompt_len` and `output_len` the sweep's input and output tokens, `tp_size` the TP launched,
`load_format` "". The full-size run's levels (when it measured): model "full-size",
`load_format` "dummy", the dtype the engine computed in; the primary workload and each other
workload at the run's TP, and the primary workload at each smaller TP degree; with the
engine's own peaks during each level (`FULL_SIZE_ENGINE_METRICS`). Plain Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .full_size_result import FullSizeRun, Level
from .result import ServeResult

# The sweep's figures stored as rows, with their units (`errors`: a level's failed requests,
# 0 stored too).
SERVE_METRICS: dict[str, str] = {
    "ttft_s_p50": "s",
    "ttft_s_p95": "s",
    "tpot_s_p50": "s",
    "tpot_s_p95": "s",
    "e2e_s_p99": "s",
    "output_tokens_per_s": "tokens/s",
    "requests_per_s": "requests/s",
    "errors": "requests",
}

# The engine's own figures during each full-size level (its /metrics, the peaks of the scrapes
# during the level: `full_size.LEVEL_PEAKS`), with their units.
FULL_SIZE_ENGINE_METRICS: dict[str, str] = {
    "kv_cache_usage_peak": "ratio",
    "running_peak": "requests",
    "waiting_peak": "requests",
}


def _positive(value: int | None) -> int | None:
    """A count stored as a row's key: a positive whole number, else None."""
    return value if value is not None and value > 0 else None


def _level_rows(
    key: dict[str, Any], levels: Sequence[Level], metrics: dict[str, str] = SERVE_METRICS
) -> list[dict[str, Any]]:
    """`key` with each figure of `metrics` each of `levels` has (a level without a positive
    concurrency is left out)."""
    rows = []
    for level in levels:
        concurrency = _positive(level.concurrency)
        if concurrency is None:
            continue
        for metric, unit in metrics.items():
            value = getattr(level, metric)
            if value is not None:
                rows.append(
                    key
                    | {"concurrency": concurrency, "metric": metric, "value": value, "unit": unit}
                )
    return rows


def _full_size_rows(run: FullSizeRun | None, engine_key: dict[str, Any]) -> list[dict[str, Any]]:
    if run is None or not run.measured:
        return []
    base = {
        "kind": "measured",
        "model": "full-size",
        "dtype": run.dtype,
        "load_format": run.load_format,
        **engine_key,
    }
    primary = base | {
        "prompt_len": _positive(run.input_tokens),
        "output_len": _positive(run.output_tokens),
    }
    tp = _positive(run.tp)
    metrics = SERVE_METRICS | FULL_SIZE_ENGINE_METRICS
    rows = []
    for workload in run.workloads:  # the primary first: its lengths are the sweep settings'
        key = base | {
            "prompt_len": _positive(workload.input_tokens),
            "output_len": _positive(workload.output_tokens),
            "tp_size": tp,
        }
        rows += _level_rows(key, workload.levels, metrics)
    for launch in run.tp_launches:
        rows += _level_rows(primary | {"tp_size": _positive(launch.tp)}, launch.levels, metrics)
    return rows


def serve_rows(result: ServeResult) -> list[dict[str, Any]]:
    """The rows of a serve result (the module docstring): the twin's sweep, then the
    full-size run's."""
    engine = result.engine
    engine_key = {
        "engine": engine.name if engine else "",
        "engine_version": engine.version if engine else "",
    }
    settings, tp = result.sweep_settings, result.tp
    key = {
        "kind": "measured",
        "model": result.measured_on,
        "dtype": result.dtype,
        "prompt_len": _positive(settings.input_tokens) if settings else None,
        "output_len": _positive(settings.output_tokens) if settings else None,
        "tp_size": _positive(tp.launched) if tp else None,
        "load_format": "",
        **engine_key,
    }
    return _level_rows(key, result.sweep) + _full_size_rows(result.full_size, engine_key)
