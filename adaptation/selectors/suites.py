"""Reads of standard-suite runs: a run with its jobs, their stage runs and regressions, and
the run before it, in a fixed number of queries whatever the suite's size."""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.db.models import Prefetch, Q, QuerySet

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    Regression,
    StageRun,
    StageStatus,
    SuiteRun,
)
from adaptation.selectors.jobs import latest_runs_by_stage
from engine.suites import Suite, SuiteError, suite_load

# How many earlier runs a matrix page links to.
RUN_HISTORY_LIMIT = 20


def _suite_jobs() -> QuerySet[AdaptationJob]:
    return AdaptationJob.objects.select_related("release").prefetch_related(
        Prefetch("stage_runs", queryset=StageRun.objects.order_by("position", "attempt")),
        Prefetch("regressions", queryset=Regression.objects.select_related("stage_run")),
    )


def suite_runs() -> QuerySet[SuiteRun]:
    """Suite runs with their pool, requester and previous run, newest first."""
    return SuiteRun.objects.select_related("pool", "requested_by", "previous").order_by(
        "-created_at", "-id"
    )


def suite_run_latest(*, pool: AcceleratorPool, suite: str) -> SuiteRun | None:
    """The newest run of `suite` on `pool`, or None."""
    return suite_runs().filter(pool=pool, suite=suite).first()


def suite_run_history(*, run: SuiteRun, limit: int = RUN_HISTORY_LIMIT) -> list[SuiteRun]:
    """The newest `limit` runs of the run's suite on its pool, `run` included, newest
    first."""
    return list(suite_runs().filter(pool_id=run.pool_id, suite=run.suite)[:limit])


def suite_run_jobs(run: SuiteRun | None) -> list[AdaptationJob]:
    """The run's jobs (none for None) with their release, every stage attempt (in position
    and attempt order) and regressions (with their stage run): three queries.

    A run has one job per entry; should an entry have two (a job added by hand later), the
    newest comes first."""
    if run is None:
        return []
    return list(_suite_jobs().filter(suite_run=run).order_by("-created_at", "-id"))


def suite_runs_jobs(runs: Sequence[SuiteRun]) -> list[AdaptationJob]:
    """The jobs of all of `runs` (each job's `suite_run_id` says whose), as
    `suite_run_jobs` gives one run's: three queries whatever the number of runs."""
    if not runs:
        return []
    ids = [run.pk for run in runs]
    return list(_suite_jobs().filter(suite_run__in=ids).order_by("-created_at", "-id"))


def suite_run_lookback_jobs(
    *,
    run: SuiteRun,
    jobs: Sequence[AdaptationJob],
    previous_jobs: Sequence[AdaptationJob],
    limit: int = RUN_HISTORY_LIMIT,
) -> list[AdaptationJob]:
    """What the matrix compares a cell with when the previous run did not run its stage.

    The entries of `run` (its `jobs`) for which the previous run (its `previous_jobs`) has
    no job, or a job without one of the entry's stages or with it cancelled: their jobs in
    the `limit` runs of the suite on the pool before the previous one, newest run first (a
    run's jobs newest first), with stage runs and regressions prefetched. Three queries
    when some entry needs them, none otherwise, whatever the number of entries."""
    if run.previous_id is None or run.previous is None:
        return []
    before = {}
    for job in previous_jobs:
        before.setdefault(job.suite_entry, job)
    entries = set()
    for job in jobs:
        previous = before.get(job.suite_entry)
        if previous is None:
            entries.add(job.suite_entry)
            continue
        latest = latest_runs_by_stage(previous)
        for stage in job.stages or []:
            ran = latest.get(stage)
            if ran is None or ran.status == StageStatus.CANCELLED:
                entries.add(job.suite_entry)
                break
    if not entries:
        return []
    previous_run = run.previous
    runs_before = (
        SuiteRun.objects.filter(pool_id=run.pool_id, suite=run.suite)
        .filter(
            Q(created_at__lt=previous_run.created_at)
            | Q(created_at=previous_run.created_at, id__lt=previous_run.pk)
        )
        .order_by("-created_at", "-id")
        .values("id")[:limit]
    )
    return list(
        _suite_jobs()
        .filter(suite_run__in=runs_before, suite_entry__in=sorted(entries))
        .order_by("-suite_run__created_at", "-suite_run_id", "-created_at", "-id")
    )


def suite_definition_or_none(name: str) -> Suite | None:
    """The suite file `name` (its folders checked under the checkout), or None when the
    checkout no longer has it or it is broken: a stored run still shows, without its
    entries' shapes."""
    try:
        return suite_load(name, base_dir=settings.BASE_DIR)
    except SuiteError:
        return None
