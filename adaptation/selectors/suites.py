"""Reads of standard-suite runs: a run with its jobs, their stage runs and regressions, and
the run before it, in a fixed number of queries whatever the suite's size."""

from __future__ import annotations

from django.conf import settings
from django.db.models import Prefetch, QuerySet

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    Regression,
    StageRun,
    SuiteRun,
)
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


def suite_definition_or_none(name: str) -> Suite | None:
    """The suite file `name` (its folders checked under the checkout), or None when the
    checkout no longer has it or it is broken: a stored run still shows, without its
    entries' shapes."""
    try:
        return suite_load(name, base_dir=settings.BASE_DIR)
    except SuiteError:
        return None
