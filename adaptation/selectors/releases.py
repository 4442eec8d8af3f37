"""Reads of releases: one release's page, the newest job, earlier analyses (the board's rows
are `selectors.board`)."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import (
    OuterRef,
    Prefetch,
    QuerySet,
    Subquery,
)

from adaptation.models import (
    AdaptationJob,
    ModelRelease,
    StageRun,
    StageStatus,
)
from adaptation.selectors.jobs import jobs_with_stage_runs
from adaptation.selectors.limitations import open_limitations_prefetch
from engine.stages.analyze.result import AnalysisResult


def known_family_analyses(*, exclude_release_id: int | None, limit: int = 50) -> list[dict]:
    """The newest successful analysis of each model family seen so far (as stored), newest
    first, leaving out the given release (what a new release is compared against); a family
    is named as `AnalysisResult.family_name` names it."""
    runs = (
        StageRun.objects.filter(stage="analyze", status=StageStatus.SUCCEEDED)
        .exclude(job__release_id=exclude_release_id)
        .order_by("-finished_at")
        .only("result")
    )
    seen: dict[str, dict] = {}
    for run in runs.iterator():
        family = AnalysisResult.from_stored(run.result).family_name
        if family and family not in seen:
            seen[family] = run.result
            if len(seen) >= limit:
                break
    return list(seen.values())


# A stage run's fields that are large and read only where the page shows the run in full.
HEAVY_STAGE_RUN_FIELDS = ("result", "log")


def release_detail(*, release_id: int, light_runs: bool = False) -> ModelRelease:
    """One release with its jobs and all their stage attempts, and its open limitations
    (`open_limitations_prefetch`). `light_runs`: the attempts come without their
    `HEAVY_STAGE_RUN_FIELDS` (a release with 20 jobs holds megabytes of results); load those
    of the jobs shown in full with `stage_runs_load_heavy`, since reading one of another
    job's costs a query. Raises DoesNotExist."""
    runs = StageRun.objects.order_by("position", "attempt")
    if light_runs:
        runs = runs.defer(*HEAVY_STAGE_RUN_FIELDS)
    jobs = AdaptationJob.objects.select_related("pool").prefetch_related(
        Prefetch("stage_runs", queryset=runs)
    )
    return (
        ModelRelease.objects.select_related("watch")
        .prefetch_related(
            Prefetch("jobs", queryset=jobs.order_by("-created_at", "-id")),
            open_limitations_prefetch(),
        )
        .get(pk=release_id)
    )


def stage_runs_load_heavy(jobs: Iterable[AdaptationJob]) -> None:
    """Load the `HEAVY_STAGE_RUN_FIELDS` of `jobs`' prefetched stage runs (from
    `release_detail(light_runs=True)`) in one query, into those runs."""
    runs = {run.pk: run for job in jobs for run in job.stage_runs.all()}
    if not runs:
        return
    rows = StageRun.objects.filter(pk__in=runs).values_list("pk", *HEAVY_STAGE_RUN_FIELDS)
    for pk, *values in rows:
        for name, value in zip(HEAVY_STAGE_RUN_FIELDS, values, strict=True):
            setattr(runs[pk], name, value)


def releases_with_latest_job(*, with_jobs: bool = False) -> QuerySet[ModelRelease]:
    """Releases annotated with their newest job's id and status (`latest_job_id`,
    `latest_job_status`; None for a release without a job); `with_jobs` prefetches every
    job (newest first) with its stage attempts, as a release's detail needs."""
    newest = AdaptationJob.objects.filter(release=OuterRef("pk")).order_by("-created_at", "-id")
    releases = ModelRelease.objects.select_related("watch").annotate(
        latest_job_id=Subquery(newest.values("pk")[:1]),
        latest_job_status=Subquery(newest.values("status")[:1]),
    )
    if with_jobs:
        jobs = jobs_with_stage_runs().order_by("-created_at", "-id")
        releases = releases.prefetch_related(Prefetch("jobs", queryset=jobs))
    return releases


def release_newest_job(release: ModelRelease) -> AdaptationJob | None:
    """The release's newest job (the latest created; of two created together, the higher
    id), or None without one."""
    return release.jobs.order_by("-created_at", "-id").first()
