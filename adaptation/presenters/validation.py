"""The release page's "Operators and precision" section: the `operators` and `precision`
stages' rows for the release's scaled twin, from the newest of the jobs the page shows that
ran each stage (the jobs prefetched: `presenters.panels.release_showing`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adaptation.charts import precision as precision_charts
from adaptation.models import ModelRelease, OperatorCheck, PrecisionResult, StageRun
from adaptation.presenters.release_jobs import release_jobs
from adaptation.presenters.stages import finished_run
from adaptation.selectors.results import operator_checks, precision_results
from engine.stages.operators.result import OperatorsResult
from engine.stages.precision.result import DtypeComparison, JudgedFigure, PrecisionStageResult


@dataclass
class OperatorCoverage:
    """The operator table of one `operators` run (missing operators first), the count per
    status, the device the twin ran on, and what the operators were checked against: the
    pool's operator manifest (`manifest_accelerator`: its accelerator, "" when it names none)
    or, when `against_manifest` is False, torch's dispatcher's `dispatch_key` kernels."""

    run: StageRun
    rows: list[OperatorCheck]
    counts: dict[str, int]
    notes: list[str]
    device: str
    against_manifest: bool
    manifest_accelerator: str = ""
    dispatch_key: str = ""


@dataclass
class PrecisionRow:
    """A dtype's stored row plus what its verdict rested on (`DtypeComparison.judged_figures`)
    and where the limits come from."""

    row: PrecisionResult
    judged: list[JudgedFigure]
    source: str


def _precision_row(row: PrecisionResult, measured: DtypeComparison | None) -> PrecisionRow:
    if measured is None:
        return PrecisionRow(row=row, judged=[], source="")
    return PrecisionRow(row=row, judged=measured.judged_figures, source=measured.limits_source)


@dataclass
class Precision:
    """The per-dtype table, skipped dtypes and per-layer chart of one `precision` run, and the
    reference it compares against (dtype on device)."""

    run: StageRun
    rows: list[PrecisionRow]
    skipped: dict[str, str]
    reference_dtype: str
    reference_device: str
    figure: dict[str, Any] | None

    @property
    def passed(self) -> bool:
        """Whether every dtype measured passed (its per-module chart is then folded)."""
        return all(item.row.passed for item in self.rows)


@dataclass
class Validation:
    """What the release page shows of operator coverage and precision, and the twin they ran."""

    operators: OperatorCoverage | None
    precision: Precision | None
    twin: dict[str, Any] | None = None
    twin_shrunk: list[dict[str, Any]] = field(default_factory=list)


def latest_finished_run(release: ModelRelease, *, stage: str) -> StageRun | None:
    """The newest finished attempt of `stage` over the release's prefetched jobs (newest job
    first, their stage runs prefetched); None when none ran it."""
    for job in release_jobs(release):
        run = finished_run(r for r in job.stage_runs.all() if r.stage == stage)
        if run is not None:
            return run
    return None


def _operators(release: ModelRelease) -> OperatorCoverage | None:
    run = latest_finished_run(release, stage="operators")
    if run is None:
        return None
    rows = list(operator_checks(run))
    counts = {status: 0 for status in OperatorCheck.Status.values}
    for row in rows:
        counts[row.status] += 1
    result = OperatorsResult.from_stored(run.result)
    return OperatorCoverage(
        run=run,
        rows=rows,
        counts=counts,
        notes=list(result.notes),
        device=result.device or run.job.pool.device,
        against_manifest=result.against_manifest,
        manifest_accelerator=result.manifest.accelerator if result.manifest else "",
        dispatch_key=result.dispatch_key or run.job.pool.backend,
    )


def _precision(release: ModelRelease) -> Precision | None:
    run = latest_finished_run(release, stage="precision")
    if run is None:
        return None
    stored = list(precision_results(run))
    result = PrecisionStageResult.from_stored(run.result)
    measured = result.dtypes or {}
    return Precision(
        run=run,
        rows=[_precision_row(row, measured.get(row.dtype)) for row in stored],
        skipped=result.skipped_dtypes,
        reference_dtype=result.reference_dtype or "float32",
        reference_device=result.reference_device or "cpu",
        figure=precision_charts.layer_drift(stored),
    )


def validation(release: ModelRelease) -> Validation | None:
    """Operator coverage and precision of the release's newest runs; None before either ran."""
    operators, precision = _operators(release), _precision(release)
    if operators is None and precision is None:
        return None
    # The twin both stages ran, as the precision run describes it, else the operators run.
    described = [
        precision and PrecisionStageResult.from_stored(precision.run.result).twin,
        operators and OperatorsResult.from_stored(operators.run.result).twin,
    ]
    twin = next((dict(d) for d in described if d), None)
    shrunk = list(twin.get("sizes") or []) if twin is not None else []
    return Validation(operators=operators, precision=precision, twin=twin, twin_shrunk=shrunk)
