"""The release page's "Operators and precision" section: the `operators` and `precision`
stages' rows for the release's scaled twin, from the newest of the jobs the page shows that
ran each stage (the jobs prefetched: `presenters.panels.release_showing`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adaptation.charts import precision as precision_charts
from adaptation.models import ModelRelease, OperatorCheck, PrecisionResult, StageRun
from adaptation.presenters.stages import finished_run
from adaptation.selectors.results import operator_checks, precision_results


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


# The figures a dtype's verdict rests on: (measured key, limit key, direction). The template
# names each by its measured key.
_JUDGED = (
    ("relative_logit_error", "max_relative_logit_error", "<="),
    ("max_relative_logit_error", "max_row_relative_logit_error", "<="),
    ("min_cosine_similarity", "min_cosine_similarity", ">="),
    ("worst_local_relative_error", "max_local_relative_error", "<="),
    ("top1_agreement", "min_top1_agreement", ">="),
    ("kl_divergence", "max_kl_divergence", "<="),
    ("mean_abs_error", "max_mean_abs_error", "<="),
)


@dataclass(frozen=True)
class Judged:
    """One figure a dtype was judged by (`figure`: its key in the stage's result), with its
    limit and the direction it must keep ("<=" or ">=")."""

    figure: str
    value: float
    op: str
    limit: float

    @property
    def within(self) -> bool:
        return self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    @property
    def similarity(self) -> bool:
        """A similarity, just under 1: shown with enough digits to tell it from its limit."""
        return "cosine" in self.figure


@dataclass
class PrecisionRow:
    """A dtype's stored row plus what its verdict rested on and where the limits come from."""

    row: PrecisionResult
    judged: list[Judged]
    source: str


def _precision_row(row: PrecisionResult, measured: dict[str, Any]) -> PrecisionRow:
    thresholds = measured.get("thresholds") or {}
    judged = [
        Judged(key, measured[key], op, thresholds[limit])
        for key, limit, op in _JUDGED
        if isinstance(measured.get(key), int | float)
        and isinstance(thresholds.get(limit), int | float)
    ]
    return PrecisionRow(row=row, judged=judged, source=str(thresholds.get("source") or ""))


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
    for job in release.jobs.all():
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
    result = run.result or {}
    manifest = result.get("manifest") or {}
    return OperatorCoverage(
        run=run,
        rows=rows,
        counts=counts,
        notes=[str(n) for n in result.get("notes", [])],
        device=str(result.get("device") or run.job.pool.device),
        against_manifest=result.get("checked_against") == "manifest" or bool(manifest),
        manifest_accelerator=str(manifest.get("accelerator") or ""),
        dispatch_key=str(result.get("dispatch_key") or run.job.pool.backend),
    )


def _precision(release: ModelRelease) -> Precision | None:
    run = latest_finished_run(release, stage="precision")
    if run is None:
        return None
    stored = list(precision_results(run))
    result = run.result or {}
    reference = result.get("reference") or {}
    measured = result.get("dtypes") or {}
    return Precision(
        run=run,
        rows=[_precision_row(row, measured.get(row.dtype) or {}) for row in stored],
        skipped={str(k): str(v) for k, v in (result.get("skipped_dtypes") or {}).items()},
        reference_dtype=str(reference.get("dtype", "float32")),
        reference_device=str(reference.get("device", "cpu")),
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
