"""Each stage's panel values from the release page: a function of the `ReleasePage` per stage
with a presenter, named by the stage's `AppStage.presenter` (`adaptation/stages/<name>.py`).

Each hands the stage's presenter what it takes from the page (the release, the pools without
a live worker, the query string), and makes the reads a presenter needs beyond the prefetched
jobs (the plan's start on its pool, the performance points) through `adaptation.selectors`.
What it returns is what the stage's panel template reads as `panel.values`.
"""

from __future__ import annotations

from adaptation.catalog import pool_layout
from adaptation.presenters import (
    analysis,
    distributed,
    performance,
    plan,
    serve,
    stability,
    validation,
)
from adaptation.presenters.panels import ReleasePage
from adaptation.presenters.release_jobs import release_jobs
from adaptation.selectors import inventory as inventory_selectors
from adaptation.selectors import performance as performance_selectors
from adaptation.selectors.release_notes import NotesSummary


def analyze_panel(page: ReleasePage) -> analysis.Analysis | None:
    """The architecture analysis of the release."""
    return analysis.analysis(page.release)


def operators_panel(page: ReleasePage) -> validation.Validation | None:
    """Operator coverage and precision, per pool (the panel shows the `precision` stage too)."""
    return validation.validation(page.release)


def plan_panel(page: ReleasePage) -> list[plan.PlanPanel]:
    """The plans per pool, each with when its devices would start on the pool (a queue
    estimate read here)."""
    starts = {
        job.pk: inventory_selectors.plan_start_estimate(
            pool=job.pool, devices=devices, job=job, layout_of=pool_layout
        )
        for job in release_jobs(page.release)
        if (devices := plan.start_devices(job)) is not None
    }
    return plan.plan_panels(
        page.release, pools_without_worker=page.pools_without_worker, starts=starts
    )


def distributed_panel(page: ReleasePage) -> list[distributed.DistributedPanel]:
    """The split runs per pool."""
    return distributed.distributed_panels(
        page.release, pools_without_worker=page.pools_without_worker
    )


def serve_panel(page: ReleasePage) -> list[serve.ServePanel]:
    """The serving engine's runs per pool."""
    return serve.serve_panels(page.release, pools_without_worker=page.pools_without_worker)


def performance_panel(page: ReleasePage) -> performance.PerformanceSection:
    """The performance section in the chart view the query string asks for, with its points
    (one read) and, when there are runs, the jobs it can be compared with."""
    runs = performance.release_performance_runs(page.release)
    return performance.performance_section(
        page.release,
        params=page.params,
        rows_by_run=performance_selectors.point_rows_by_run(runs),
        candidates=performance_selectors.jobs_with_performance() if runs else [],
    )


def stability_panel(page: ReleasePage) -> list[stability.StabilityPanel]:
    """The stability runs per pool."""
    return stability.stability_panels(page.release)


def release_notes_panel(page: ReleasePage) -> list[NotesSummary]:
    """The release's latest notes per pool, as the view read them for the page."""
    return page.release_notes
