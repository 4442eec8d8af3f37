"""A job's performance rows as CSV, and two jobs' performance curves compared."""

from __future__ import annotations

import csv

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from adaptation.charts.performance_metrics import METRICS
from adaptation.presenters import performance_compare as compare_performance_presenters
from adaptation.presenters import performance_points, performance_view
from adaptation.selectors import jobs as job_selectors
from adaptation.selectors import performance as performance_selectors
from adaptation.views.access import VIEW_JOBS, permission_required


@permission_required(VIEW_JOBS)
@require_GET
def job_performance_csv(request: HttpRequest, job_id: int) -> HttpResponse:
    """The job's performance rows (its newest finished `performance` attempt) as CSV: the
    numbers its charts and table show, one figure per line."""
    job = get_object_or_404(job_selectors.jobs_with_release_and_pool(), pk=job_id)
    run = performance_selectors.job_performance_run(job)
    if run is None:
        raise Http404(f"Job {job_id} has no finished performance run.")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = (
        f'attachment; filename="{compare_performance_presenters.csv_filename(job)}"'
    )
    writer = csv.writer(response, lineterminator="\n")
    columns = performance_points.CSV_COLUMNS
    writer.writerow(columns)
    for row in performance_selectors.point_rows(run):
        writer.writerow([compare_performance_presenters.csv_cell(row[c]) for c in columns])
    return response


@permission_required(VIEW_JOBS)
@require_GET
def compare_performance(request: HttpRequest) -> HttpResponse:
    """Two jobs' performance curves overlaid: `?jobs=<id>,<id>` (the same release on two
    pools, or two releases on one pool), in the chart view of `perf_x`/`perf_metric`. Bad
    ids answer 400, a job missing or without performance rows 404, each with the reason."""
    view = performance_view.performance_view(request.GET)
    context: dict[str, object] = {
        "view": view,
        "comparison": None,
        "error": None,
        "choices": performance_selectors.jobs_with_performance(),
        "x_choices": performance_view.x_choices(),
        "metric_choices": [(name, metric.label) for name, metric in METRICS.items()],
        "chosen": [],
    }
    status = 200
    try:
        ids = compare_performance_presenters.compare_job_ids(request.GET.getlist("jobs"))
        context["chosen"] = ids
        jobs = job_selectors.jobs_by_id(ids)
        runs = {pk: performance_selectors.job_performance_run(job) for pk, job in jobs.items()}
        context["comparison"] = compare_performance_presenters.compare_performance(
            ids,
            view,
            jobs=jobs,
            runs=runs,
            rows_by_run=performance_selectors.point_rows_by_run(r for r in runs.values() if r),
        )
    except compare_performance_presenters.CompareError as exc:
        context["error"], status = exc, exc.status
    return render(request, "adaptation/compare_performance.html", context, status=status)
