"""Reads of a performance run's stored points (`PerformancePoint` rows): for the charts, the
table and the CSV of one job, the release page's jobs, and the compare page's choices. They
read the performance stage's runs only: the serve stage's rows (`engine` set) are a serving
engine's sweep, not these curves."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import F

from adaptation.models import AdaptationJob, PerformancePoint, StageRun, StageStatus

PERFORMANCE_STAGE = "performance"
# A point's fields, as the charts, the table and the CSV read them (the CSV's columns).
POINT_FIELDS = ("kind", "model", "dtype", "batch_size", "prompt_len", "metric", "value", "unit")
FINISHED = (StageStatus.SUCCEEDED, StageStatus.FAILED)
# Jobs offered to compare with (newest first).
COMPARE_CHOICES_LIMIT = 60
# A run's points in a stable order: kind, model, dtype, prompt length (none first), batch
# size, metric.
_POINT_ORDER = (
    "kind",
    "model",
    "dtype",
    F("prompt_len").asc(nulls_first=True),
    F("batch_size").asc(nulls_first=True),
    "metric",
    "id",
)


def point_rows(run: StageRun) -> list[dict[str, Any]]:
    """The points of one performance run as dicts of `POINT_FIELDS`, in a stable order:
    kind, model, dtype, prompt length (none first), batch size, metric."""
    rows = PerformancePoint.objects.filter(stage_run=run).order_by(*_POINT_ORDER)
    return list(rows.values(*POINT_FIELDS))


def point_rows_by_run(runs: Iterable[StageRun]) -> dict[int, list[dict[str, Any]]]:
    """`point_rows` of each of `runs`, by run id, in one query (a run without points maps
    to an empty list)."""
    ids = [run.pk for run in runs]
    by_run: dict[int, list[dict[str, Any]]] = {pk: [] for pk in ids}
    if not ids:
        return by_run
    rows = PerformancePoint.objects.filter(stage_run_id__in=ids).order_by(
        "stage_run_id", *_POINT_ORDER
    )
    for row in rows.values("stage_run_id", *POINT_FIELDS):
        by_run[row.pop("stage_run_id")].append(row)
    return by_run


def job_performance_run(job: AdaptationJob) -> StageRun | None:
    """The newest finished attempt of the job's performance stage (what its CSV holds)."""
    return (
        StageRun.objects.filter(job=job, stage=PERFORMANCE_STAGE, status__in=FINISHED)
        .order_by("-attempt")
        .first()
    )


def jobs_with_performance(*, limit: int = COMPARE_CHOICES_LIMIT) -> list[AdaptationJob]:
    """Jobs with stored performance rows, newest first (release and pool loaded): rows of
    the performance stage, not a serving engine's (the serve stage's sweep is no curve of
    the twin in process, and the compare page reads `job_performance_run`)."""
    ids = (
        PerformancePoint.objects.filter(stage_run__stage=PERFORMANCE_STAGE)
        .order_by()
        .values_list("job_id", flat=True)
        .distinct()
    )  # the DISTINCT needs no ordering
    # Only what a choice names (job, release, pool), not the jobs' options or the configs.
    return list(
        AdaptationJob.objects.filter(pk__in=ids)
        .select_related("release", "pool")
        .only("id", "created_at", "release_id", "pool_id", "release__repo_id", "pool__name")
        .order_by("-created_at", "-id")[:limit]
    )
