"""Shapes the `operators` and `precision` stages' rows for the release page."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adaptation.charts import precision as precision_charts
from adaptation.models import ModelRelease, OperatorCheck, PrecisionResult, StageRun
from adaptation.selectors.releases import release_latest_stage_run
from adaptation.selectors.results import operator_checks, precision_results


@dataclass
class OperatorCoverage:
    """The operator table of one `operators` run (missing operators first)."""

    run: StageRun
    rows: list[OperatorCheck]
    counts: dict[str, int]
    notes: list[str]
    device: str
    checked_against: str


# (label, measured key, limit key, direction) of the figures a dtype's verdict rests on.
_JUDGED = (
    ("mean relative logit error", "relative_logit_error", "max_relative_logit_error", "<="),
    ("worst row", "max_relative_logit_error", "max_row_relative_logit_error", "<="),
    ("worst cosine (mean-centred)", "min_cosine_similarity", "min_cosine_similarity", ">="),
    ("worst module's own error", "worst_local_relative_error", "max_local_relative_error", "<="),
    ("top-1 agreement", "top1_agreement", "min_top1_agreement", ">="),
    ("KL divergence", "kl_divergence", "max_kl_divergence", "<="),
    ("mean abs error", "mean_abs_error", "max_mean_abs_error", "<="),
)


@dataclass(frozen=True)
class Judged:
    """One figure a dtype was judged by, with its limit."""

    label: str
    value: float
    op: str
    limit: float

    @property
    def within(self) -> bool:
        return self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    def _text(self, number: float) -> str:
        # Similarities sit just under 1: show enough digits to tell them from their limit.
        return f"{number:.6f}" if "cosine" in self.label else f"{number:.3g}"

    @property
    def value_text(self) -> str:
        return self._text(self.value)

    @property
    def limit_text(self) -> str:
        return self._text(self.limit)


@dataclass
class PrecisionRow:
    """A dtype's stored row plus what its verdict rested on and where the limits come from."""

    row: PrecisionResult
    judged: list[Judged]
    source: str


def _precision_row(row: PrecisionResult, measured: dict[str, Any]) -> PrecisionRow:
    thresholds = measured.get("thresholds") or {}
    judged = [
        Judged(label, measured[key], op, thresholds[limit])
        for label, key, limit, op in _JUDGED
        if isinstance(measured.get(key), int | float)
        and isinstance(thresholds.get(limit), int | float)
    ]
    return PrecisionRow(row=row, judged=judged, source=str(thresholds.get("source") or ""))


@dataclass
class Precision:
    """The per-dtype table, skipped dtypes and per-layer chart of one `precision` run."""

    run: StageRun
    rows: list[PrecisionRow]
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
    run = release_latest_stage_run(release, stage="operators")
    if run is None:
        return None
    rows = list(operator_checks(run))
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
        checked_against=_checked_against(result, run),
    )


def _checked_against(result: dict[str, Any], run: StageRun) -> str:
    """What the operators were checked against: the pool's manifest, or torch's dispatcher."""
    manifest = result.get("manifest") or {}
    if result.get("checked_against") == "manifest" or manifest:
        return f"the operator manifest of {manifest.get('accelerator') or 'the pool'}"
    key = result.get("dispatch_key") or run.job.pool.backend
    return f"torch's dispatcher ({key} kernels)"


def _precision(release: ModelRelease) -> Precision | None:
    run = release_latest_stage_run(release, stage="precision")
    if run is None:
        return None
    stored = list(precision_results(run))
    result = run.result or {}
    reference = result.get("reference") or {}
    measured = result.get("dtypes") or {}
    rows = [_precision_row(row, measured.get(row.dtype) or {}) for row in stored]
    return Precision(
        run=run,
        rows=rows,
        skipped={str(k): str(v) for k, v in (result.get("skipped_dtypes") or {}).items()},
        reference=f"{reference.get('dtype', 'float32')} on {reference.get('device', 'cpu')}",
        figure=precision_charts.layer_drift(stored),
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
