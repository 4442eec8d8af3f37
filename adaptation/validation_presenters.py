"""Shapes the `operators` and `precision` stages' rows for the release page."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adaptation import charts, selectors
from adaptation.models import ModelRelease, OperatorCheck, PrecisionResult, StageRun


@dataclass
class OperatorCoverage:
    """The operator table of one `operators` run (missing operators first)."""

    run: StageRun
    rows: list[OperatorCheck]
    counts: dict[str, int]
    notes: list[str]
    device: str


@dataclass
class Precision:
    """The per-dtype table, skipped dtypes and per-layer chart of one `precision` run."""

    run: StageRun
    rows: list[PrecisionResult]
    skipped: dict[str, str]
    reference: str
    figure: dict[str, Any] | None


@dataclass
class Validation:
    """What the release page shows of operator coverage and precision, and the twin they ran."""

    operators: OperatorCoverage | None
    precision: Precision | None
    twin: dict[str, Any] | None = None
    twin_shrunk: list[dict[str, Any]] = field(default_factory=list)


def _operators(release: ModelRelease) -> OperatorCoverage | None:
    run = selectors.release_latest_stage_run(release, stage="operators")
    if run is None:
        return None
    rows = list(selectors.operator_checks(run))
    counts = {status: 0 for status in OperatorCheck.Status.values}
    for row in rows:
        counts[row.status] += 1
    result = run.result or {}
    return OperatorCoverage(
        run=run,
        rows=rows,
        counts=counts,
        notes=[str(n) for n in result.get("notes", [])],
        device=str(result.get("device") or run.job.pool.device),
    )


def _precision(release: ModelRelease) -> Precision | None:
    run = selectors.release_latest_stage_run(release, stage="precision")
    if run is None:
        return None
    rows = list(selectors.precision_results(run))
    result = run.result or {}
    reference = result.get("reference") or {}
    return Precision(
        run=run,
        rows=rows,
        skipped={str(k): str(v) for k, v in (result.get("skipped_dtypes") or {}).items()},
        reference=f"{reference.get('dtype', 'float32')} on {reference.get('device', 'cpu')}",
        figure=charts.precision_layer_drift(rows),
    )


def validation(release: ModelRelease) -> Validation | None:
    """Operator coverage and precision of the release's newest runs; None before either ran."""
    operators, precision = _operators(release), _precision(release)
    if operators is None and precision is None:
        return None
    twin = None
    for part in (precision, operators):
        if part is not None and (part.run.result or {}).get("twin"):
            twin = part.run.result["twin"]
            break
    shrunk = list(twin.get("sizes", [])) if isinstance(twin, dict) else []
    return Validation(operators=operators, precision=precision, twin=twin, twin_shrunk=shrunk)
