"""What a stage's result changes in the domain rows besides its own `StageRun`.

Each stage that feeds the domain has its handler here, named by its `AppStage.store_result`
(`adaptation/stages/<stage>.py`); a stage without one only keeps its result on the run.
Handlers run inside the transaction that stores the result, for a succeeded run and for a
failed one that still produced a result (a precision failure keeps its measurements).
"""

from __future__ import annotations

from typing import Any

from adaptation.models import (
    LayerDrift,
    OperatorCheck,
    PerformancePoint,
    PrecisionResult,
    StageRun,
)
from adaptation.services.release_notes import release_notes_store
from adaptation.stages import app_stage
from engine.stages.performance.result import PerformanceResult


def store_fetched_files(run: StageRun, result: dict[str, Any]) -> None:
    release = run.job.release
    release.config = result.get("config")
    release.metadata = {
        "files": result.get("files", []),
        "weights": result.get("weights"),
        "generation_config": result.get("generation_config"),
        "readme_excerpt": result.get("readme_excerpt", ""),
    }
    release.save(update_fields=["config", "metadata"])


def store_architecture(run: StageRun, result: dict[str, Any]) -> None:
    release = run.job.release
    release.architecture = str(result.get("architecture") or "")[:128]
    release.family = str(result.get("family") or result.get("model_type") or "")[:64]
    release.save(update_fields=["architecture", "family"])


def store_operator_checks(run: StageRun, result: dict[str, Any]) -> None:
    OperatorCheck.objects.bulk_create(
        OperatorCheck(
            stage_run=run,
            pool=run.job.pool,
            name=str(op["name"])[:200],
            dtypes=list(op.get("dtypes") or []),
            feature=str(op.get("feature") or "")[:200],
            status=op["status"],
            missing_dtypes=list(op.get("missing_dtypes") or []),
        )
        for op in result.get("operators", [])
    )


def store_precision(run: StageRun, result: dict[str, Any]) -> None:
    for dtype, metrics in (result.get("dtypes") or {}).items():
        row = PrecisionResult.objects.create(
            stage_run=run,
            pool=run.job.pool,
            dtype=dtype,
            max_abs_error=metrics.get("max_abs_error"),
            mean_abs_error=metrics.get("mean_abs_error"),
            cosine_similarity=metrics.get("cosine_similarity"),
            top1_agreement=metrics.get("top1_agreement"),
            kl_divergence=metrics.get("kl_divergence"),
            passed=bool(metrics["passed"]),
            first_divergent_layer=metrics.get("first_divergent_layer"),
            first_divergent_module=metrics.get("first_divergent_module") or "",
            first_divergent_name=str(metrics.get("first_divergent_name") or "")[:200],
            max_local_relative_error=(metrics.get("thresholds") or {}).get(
                "max_local_relative_error"
            ),
            reason=metrics.get("reason") or "",
        )
        LayerDrift.objects.bulk_create(
            LayerDrift(
                precision=row,
                layer=layer["layer"],
                module=str(layer["module"])[:64],
                name=str(layer.get("name") or "")[:200],
                max_abs_error=layer.get("max_abs_error"),
                relative_error=layer.get("relative_error"),
                local_relative_error=layer.get("local_relative_error"),
            )
            for layer in metrics.get("layers", [])
        )


def store_performance_points(run: StageRun, result: dict[str, Any]) -> None:
    """Every point of a performance run as rows, one metric each: the twin's measured points
    and the plan's full-size predictions (`result["points"]`, with their calibrated figures
    where the plan had them), and the calibration's predicted twin points and efficiencies
    (`result["calibration"]`). A failed run stores what it measured before failing."""
    rows = PerformanceResult.from_stored(result).stored_rows()
    PerformancePoint.objects.bulk_create(
        _point(run, row, batch_size=row["batch_size"], prompt_len=row["prompt_len"]) for row in rows
    )


# The serve stage's sweep figures stored as rows, with their units (docs/stages/serve.md).
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
# during the level: `engine.stages.serve.full_size.LEVEL_PEAKS`), with their units.
FULL_SIZE_ENGINE_METRICS: dict[str, str] = {
    "kv_cache_usage_peak": "ratio",
    "running_peak": "requests",
    "waiting_peak": "requests",
}


def _level_rows(
    key: dict[str, Any], sweep: Any, metrics: dict[str, str] = SERVE_METRICS
) -> list[dict[str, Any]]:
    """`key` with each figure of `metrics` of each level of `sweep` (a level without a
    concurrency is left out; `errors` 0 is stored too)."""
    rows = []
    for level in sweep if isinstance(sweep, list) else []:
        if not isinstance(level, dict) or not _is_count(level.get("concurrency")):
            continue
        for metric, unit in metrics.items():
            value = level.get(metric)
            if isinstance(value, int | float) and not isinstance(value, bool):
                rows.append(
                    key
                    | {
                        "concurrency": level["concurrency"],
                        "metric": metric,
                        "value": value,
                        "unit": unit,
                    }
                )
    return rows


def _serve_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a serve result's load sweep: per level (`concurrency`) each figure of
    `SERVE_METRICS` it has (`errors`: the level's failed requests, 0 stored too), kind
    "measured", model "twin" ("release" for a checkpoint of the real weights), the dtype
    served (the precision check's, else the checkpoint's), the sweep's input and output tokens
    as `prompt_len` and `output_len`, the TP it launched at as `tp_size`, and the engine's
    name and version; then the full-size run's rows (`_full_size_rows`)."""
    checkpoint = result.get("checkpoint") if isinstance(result.get("checkpoint"), dict) else {}
    precision = result.get("precision") if isinstance(result.get("precision"), dict) else {}
    engine = result.get("engine") if isinstance(result.get("engine"), dict) else {}
    settings = result.get("sweep_settings")
    settings = settings if isinstance(settings, dict) else {}
    tp = result.get("tp") if isinstance(result.get("tp"), dict) else {}
    engine_key = {
        "engine": engine.get("name") or "",
        "engine_version": str(engine.get("version") or ""),
    }
    key = {
        "kind": "measured",
        "model": "release" if checkpoint.get("kind") == "real" else "twin",
        "dtype": precision.get("dtype") or checkpoint.get("dtype") or "",
        "prompt_len": _count_or_none(settings.get("input_tokens")),
        "output_len": _count_or_none(settings.get("output_tokens")),
        "tp_size": _count_or_none(tp.get("launched")),
        "load_format": "",
        **engine_key,
    }
    return _level_rows(key, result.get("sweep")) + _full_size_rows(
        result.get("full_size"), engine_key
    )


def _full_size_rows(full_size: Any, engine_key: dict[str, Any]) -> list[dict[str, Any]]:
    """The full-size run's levels as rows (docs/stages/serve.md, "Full size"): kind
    "measured", model "full-size", `load_format` "dummy", the dtype the engine computed in;
    the primary workload at the run's TP, each other workload at that TP, and the primary
    workload at each smaller TP degree, each with its input and output tokens; with the
    engine's KV cache usage and running and waiting requests at their peak during each level
    (`FULL_SIZE_ENGINE_METRICS`) besides the sweep's figures."""
    if not isinstance(full_size, dict) or full_size.get("status") != "measured":
        return []
    settings = full_size.get("sweep_settings")
    settings = settings if isinstance(settings, dict) else {}
    base = {
        "kind": "measured",
        "model": "full-size",
        "dtype": str(full_size.get("dtype") or ""),
        "load_format": str(full_size.get("load_format") or ""),
        **engine_key,
    }
    primary = base | {
        "prompt_len": _count_or_none(settings.get("input_tokens")),
        "output_len": _count_or_none(settings.get("output_tokens")),
    }
    tp = _count_or_none(full_size.get("tp"))
    metrics = SERVE_METRICS | FULL_SIZE_ENGINE_METRICS
    rows = _level_rows(primary | {"tp_size": tp}, full_size.get("sweep"), metrics)
    for workload in full_size.get("workloads") or []:
        if isinstance(workload, dict):
            key = base | {
                "prompt_len": _count_or_none(workload.get("input_tokens")),
                "output_len": _count_or_none(workload.get("output_tokens")),
                "tp_size": tp,
            }
            rows += _level_rows(key, workload.get("sweep"), metrics)
    for entry in full_size.get("tp_scaling") or []:
        if isinstance(entry, dict):
            key = primary | {"tp_size": _count_or_none(entry.get("tp"))}
            rows += _level_rows(key, entry.get("sweep"), metrics)
    return rows


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _count_or_none(value: Any) -> int | None:
    return value if _is_count(value) else None


def store_serve_points(run: StageRun, result: dict[str, Any]) -> None:
    """A serve run's load sweeps as `PerformancePoint` rows, one metric each (`_serve_rows`),
    marked with the engine that measured them: the in-process performance curves, the
    compare page and the pool's calibration keep to the performance stage's rows. A failed
    run stores the levels it measured before failing."""
    PerformancePoint.objects.bulk_create(
        _point(
            run,
            row,
            prompt_len=row["prompt_len"],
            output_len=row["output_len"],
            tp_size=row["tp_size"],
            concurrency=row["concurrency"],
            engine=_fitting(row, "engine"),
            load_format=_fitting(row, "load_format"),
            engine_version=row["engine_version"][
                : PerformancePoint._meta.get_field("engine_version").max_length
            ],
        )
        for row in _serve_rows(result)
    )


def _point(run: StageRun, row: dict[str, Any], **fields: Any) -> PerformancePoint:
    """One `PerformancePoint` of `run` from a stage's row (kind, model, dtype, metric, value,
    unit), with the stage's own `fields` (batch size, concurrency, engine...)."""
    return PerformancePoint(
        stage_run=run,
        job=run.job,
        pool=run.job.pool,
        kind=row["kind"],
        model=_fitting(row, "model"),
        dtype=_fitting(row, "dtype"),
        metric=_fitting(row, "metric"),
        value=float(row["value"]),
        unit=_fitting(row, "unit"),
        **fields,
    )


def _fitting(row: dict[str, Any], name: str) -> str:
    """`row[name]` as text, refused when longer than `PerformancePoint.<name>` holds: the
    names come from the stage's code, so one that does not fit is the stage's bug, never cut
    short to pass for another. Raises `ValueError` naming the field."""
    text = str(row.get(name) or "")
    limit = PerformancePoint._meta.get_field(name).max_length
    if limit is not None and len(text) > limit:
        raise ValueError(
            f"performance row {name} {text!r} is {len(text)} characters, over the "
            f"{limit} PerformancePoint.{name} holds"
        )
    return text


def store_release_notes(run: StageRun, result: dict[str, Any]) -> None:
    """The notes the `release_notes` stage gathered, written as Markdown and stored as the
    next version of the release's notes on the job's pool
    (`adaptation.services.release_notes.release_notes_store`). The run's stored result gets
    the document and the one-line summary too ("markdown" and "summary", as written into the
    version), so that the run reads as the notes it produced (the API shows it)."""
    if isinstance(result.get("sections"), dict) and isinstance(result.get("order"), list):
        notes = release_notes_store(job=run.job, stage_run=run, notes=result)
        run.result = {**result, "markdown": notes.markdown, "summary": notes.sections["summary"]}
        StageRun.objects.filter(pk=run.pk).update(result=run.result)


def apply(*, run: StageRun, result: dict[str, Any]) -> None:
    """Run the run's stage's `store_result` (`adaptation/stages/<stage>.py`), if it has one."""
    stage = app_stage(run.stage)
    store = stage.resolved("store_result") if stage is not None else None
    if store is not None:
        store(run, result)
