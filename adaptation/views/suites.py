"""The suite matrix page (a suite run's entries by stages, compared with the run before it,
as a page or CSV) and the button that starts a run of the standard suite on a pool."""

from __future__ import annotations

import csv

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from adaptation.models import AcceleratorPool, SuiteRun, SuiteTrigger
from adaptation.presenters import suites as suite_presenters
from adaptation.roles import TRIGGER_JOB
from adaptation.selectors import suites as suite_selectors
from adaptation.services.errors import ServiceError
from adaptation.services.suites import suite_start
from adaptation.views.access import VIEW_JOBS, permission_required
from engine.suites import STANDARD_SUITE


@permission_required(VIEW_JOBS)
@require_GET
def suite_matrix_latest(request: HttpRequest, pool: str, suite: str) -> HttpResponse:
    """The newest run of `suite` on `pool` as its matrix (`?format=csv`: as CSV); a page
    saying there is none yet (with the button that starts one) otherwise."""
    pool_row = get_object_or_404(AcceleratorPool, name=pool)
    run = suite_selectors.suite_run_latest(pool=pool_row, suite=suite)
    if run is None:
        definition = suite_selectors.suite_definition_or_none(suite)
        if definition is None:
            raise Http404(f"No suite {suite!r}.")
        context = {"pool": pool_row, "suite": definition, "matrix": None, "history": []}
        return render(request, "adaptation/suite_matrix.html", context)
    return _matrix_response(request, run)


@permission_required(VIEW_JOBS)
@require_GET
def suite_run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """One suite run's matrix (`?format=csv`: as CSV)."""
    run = get_object_or_404(suite_selectors.suite_runs(), pk=pk)
    return _matrix_response(request, run)


def _matrix_response(request: HttpRequest, run: SuiteRun) -> HttpResponse:
    definition = suite_selectors.suite_definition_or_none(run.suite)
    jobs = suite_selectors.suite_run_jobs(run)
    previous_jobs = suite_selectors.suite_run_jobs(run.previous)
    matrix = suite_presenters.suite_matrix(
        run=run,
        jobs=jobs,
        previous_jobs=previous_jobs,
        suite=definition,
        earlier_jobs=suite_selectors.suite_run_lookback_jobs(
            run=run, jobs=jobs, previous_jobs=previous_jobs
        ),
    )
    if request.GET.get("format") == "csv":
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = (
            f'attachment; filename="day0-suite-{run.suite}-{run.pool.name}-run-{run.pk}.csv"'
        )
        writer = csv.writer(response, lineterminator="\n")
        writer.writerow(suite_presenters.CSV_COLUMNS)
        writer.writerows(suite_presenters.csv_rows(matrix))
        return response
    history = suite_selectors.suite_run_history(run=run)
    context = {
        "pool": run.pool,
        "suite": definition,
        "matrix": matrix,
        "history": suite_presenters.run_summaries(
            history, suite_selectors.suite_runs_jobs(history)
        ),
    }
    return render(request, "adaptation/suite_matrix.html", context)


@permission_required(TRIGGER_JOB)
@require_POST
def suite_run_start(request: HttpRequest, pool: str) -> HttpResponse:
    """Start a run of the standard suite on `pool` (`services.suites.suite_start`, trigger
    manual), then show its matrix; a refusal goes back to the pools page with the reason.
    Needs the `trigger_job` permission (engineers, admins)."""
    pool_row = get_object_or_404(AcceleratorPool, name=pool)
    try:
        run = suite_start(
            pool=pool_row,
            trigger=SuiteTrigger.MANUAL,
            suite=STANDARD_SUITE,
            requested_by=request.user,
        )
    except ServiceError as exc:
        messages.error(request, str(exc))
        return redirect("adaptation:pool_list")
    messages.success(
        request,
        f"Suite run {run.pk} started on pool {pool_row.name}: "
        f"{run.jobs.count()} jobs queued on {pool_row.queue}.",
    )
    return redirect("adaptation:suite_run", pk=run.pk)
