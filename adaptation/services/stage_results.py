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
from engine.stages.analyze.result import AnalysisResult
from engine.stages.fetch.result import FetchResult
from engine.stages.operators.result import STATUSES as OPERATOR_STATUSES
from engine.stages.operators.result import OperatorsResult
from engine.stages.performance.result import PerformanceResult
from engine.stages.precision.result import PrecisionStageResult
from engine.stages.release_notes.result import ReleaseNotesResult
from engine.stages.serve.result import ServeResult
from engine.stages.serve.rows import serve_rows


def store_fetched_files(run: StageRun, result: dict[str, Any]) -> None:
    """The release's config and what it keeps of the fetch (`FetchResult.release_metadata`)."""
    fetched = FetchResult.from_stored(result)
    release = run.job.release
    release.config = None if fetched.config is None else dict(fetched.config)
    release.metadata = fetched.release_metadata()
    release.save(update_fields=["config", "metadata"])


def store_architecture(run: StageRun, result: dict[str, Any]) -> None:
    """The release's architecture and family, as the analysis names them."""
    analysis = AnalysisResult.from_stored(result)
    release = run.job.release
    release.architecture = (analysis.architecture or "")[:128]
    release.family = (analysis.family_name or "")[:64]
    release.save(update_fields=["architecture", "family"])


def store_operator_checks(run: StageRun, result: dict[str, Any]) -> None:
    """Each operator checked as an `OperatorCheck` row, read through `OperatorsResult` (a
    row without a name or a known status is no check)."""
    OperatorCheck.objects.bulk_create(
        OperatorCheck(
            stage_run=run,
            pool=run.job.pool,
            name=op.name[:200],
            dtypes=list(op.dtypes),
            feature=op.feature[:200],
            status=op.status,
            missing_dtypes=list(op.missing_dtypes),
        )
        for op in OperatorsResult.from_stored(result).rows
        if op.name and op.status in OPERATOR_STATUSES
    )


def store_precision(run: StageRun, result: dict[str, Any]) -> None:
    """Each compared dtype as a `PrecisionResult` row with its modules' `LayerDrift` rows (a
    failed run stores what it measured), read through `PrecisionStageResult`."""
    for entry in PrecisionStageResult.from_stored(result).compared:
        row = PrecisionResult.objects.create(
            stage_run=run,
            pool=run.job.pool,
            dtype=entry.dtype,
            max_abs_error=entry.max_abs_error,
            mean_abs_error=entry.mean_abs_error,
            cosine_similarity=entry.cosine_similarity,
            top1_agreement=entry.top1_agreement,
            kl_divergence=entry.kl_divergence,
            passed=bool(entry.passed),
            first_divergent_layer=entry.first_divergent_layer,
            first_divergent_module=entry.first_divergent_module,
            first_divergent_name=entry.first_divergent_name[:200],
            max_local_relative_error=entry.limit("max_local_relative_error"),
            reason=entry.reason,
        )
        LayerDrift.objects.bulk_create(
            LayerDrift(
                precision=row,
                layer=layer.layer,
                module=layer.module[:64],
                name=layer.name[:200],
                max_abs_error=layer.max_abs_error,
                relative_error=layer.relative_error,
                local_relative_error=layer.local_relative_error,
            )
            for layer in entry.layers
            if layer.layer is not None  # a module without its layer is no drift row
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


def store_serve_points(run: StageRun, result: dict[str, Any]) -> None:
    """A serve run's load sweeps as `PerformancePoint` rows, one metric each
    (`engine.stages.serve.rows.serve_rows`), marked with the engine that measured them: the
    in-process performance curves, the compare page and the pool's calibration keep to the
    performance stage's rows. A failed run stores the levels it measured before failing."""
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
        for row in serve_rows(ServeResult.from_stored(result))
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
    written = ReleaseNotesResult.from_stored(result)
    if written.has_notes:
        notes = release_notes_store(job=run.job, stage_run=run, notes=result)
        run.result = written.written(notes.markdown, notes.sections["summary"])
        StageRun.objects.filter(pk=run.pk).update(result=run.result)


def apply(*, run: StageRun, result: dict[str, Any]) -> None:
    """Run the run's stage's `store_result` (`adaptation/stages/<stage>.py`), if it has one."""
    stage = app_stage(run.stage)
    store = stage.resolved("store_result") if stage is not None else None
    if store is not None:
        store(run, result)
