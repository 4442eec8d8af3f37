"""Reads of the rows a stage's result was stored as (operator checks, precision results)."""

from __future__ import annotations

from django.db.models import (
    Case,
    QuerySet,
    When,
)

from adaptation.models import (
    OperatorCheck,
    PrecisionResult,
    StageRun,
)


def operator_checks(run: StageRun) -> QuerySet[OperatorCheck]:
    """The operator rows of one `operators` run: missing first, then CPU fallbacks."""
    order = Case(
        When(status=OperatorCheck.Status.MISSING, then=0),
        When(status=OperatorCheck.Status.FALLBACK, then=1),
        default=2,
    )
    return OperatorCheck.objects.filter(stage_run=run).order_by(order, "name")


def precision_results(run: StageRun) -> QuerySet[PrecisionResult]:
    """The per-dtype rows of one `precision` run, with their per-layer drift."""
    return (
        PrecisionResult.objects.filter(stage_run=run).prefetch_related("layers").order_by("dtype")
    )
