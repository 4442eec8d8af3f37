"""Pages of the adaptation app: the release board, a release's page and its pool comparison,
its release notes (page, printable page, Markdown, additions, regeneration), its known
limitations (add, edit, status), stage re-runs and job cancels, the pools page, a job's
performance CSV, the performance compare view, and the managers' reports; a module of
`adaptation/views/` per page."""

from django.urls import path

from adaptation.views import (
    adapt,
    board,
    compare_pools,
    limitations,
    performance,
    pools,
    release_notes,
    releases,
    reports,
    suites,
)

app_name = "adaptation"

urlpatterns = [
    path("", board.board, name="board"),
    path("releases/<int:pk>/", releases.release_detail, name="release_detail"),
    path("releases/<int:pk>/adapt/", adapt.release_adapt, name="release_adapt"),
    path(
        "releases/<int:pk>/compare-pools/",
        compare_pools.release_compare_pools,
        name="release_compare_pools",
    ),
    path("releases/<int:pk>/notes/", release_notes.release_notes_page, name="release_notes"),
    path(
        "releases/<int:pk>/notes/print/",
        release_notes.release_notes_print,
        name="release_notes_print",
    ),
    path(
        "releases/<int:pk>/notes.md",
        release_notes.release_notes_markdown,
        name="release_notes_markdown",
    ),
    path(
        "releases/<int:pk>/notes/additions/",
        release_notes.release_notes_additions_save,
        name="release_notes_additions",
    ),
    path(
        "jobs/<int:job_id>/notes/regenerate/",
        release_notes.job_notes_regenerate,
        name="job_notes_regenerate",
    ),
    path(
        "releases/<int:pk>/limitations/add/",
        limitations.limitation_add,
        name="limitation_add",
    ),
    path("limitations/<int:pk>/edit/", limitations.limitation_edit, name="limitation_edit"),
    path(
        "limitations/<int:pk>/status/",
        limitations.limitation_set_status,
        name="limitation_set_status",
    ),
    path("pools/", pools.pool_list, name="pool_list"),
    path("pools/<slug:pool>/suite-runs/", suites.suite_run_start, name="suite_run_start"),
    path(
        "pools/<slug:pool>/suites/<slug:suite>/",
        suites.suite_matrix_latest,
        name="suite_matrix",
    ),
    path("suite-runs/<int:pk>/", suites.suite_run_detail, name="suite_run"),
    path("jobs/<int:job_id>/stages/<str:stage>/rerun/", releases.stage_rerun, name="stage_rerun"),
    path("jobs/<int:job_id>/cancel/", releases.job_cancel, name="job_cancel"),
    path(
        "jobs/<int:job_id>/performance.csv",
        performance.job_performance_csv,
        name="job_performance_csv",
    ),
    path("compare/performance/", performance.compare_performance, name="compare_performance"),
    path("reports/", reports.report, name="report"),
    path("reports/readiness", reports.report_readiness, name="report_readiness"),
    path("reports/releases.csv", reports.report_csv, name="report_csv"),
]
