"""Pages of the adaptation app: the release board, a release's page and its pool comparison,
its release notes (page, printable page, Markdown, additions, regeneration), its known
limitations (add, edit, status), stage re-runs and job cancels, the pools page, a job's
performance CSV, the performance compare view, and the managers' reports (`report_views`)."""

from django.urls import path

from adaptation import limitation_views, report_views, views

app_name = "adaptation"

urlpatterns = [
    path("", views.board, name="board"),
    path("releases/<int:pk>/", views.release_detail, name="release_detail"),
    path(
        "releases/<int:pk>/compare-pools/",
        views.release_compare_pools,
        name="release_compare_pools",
    ),
    path("releases/<int:pk>/notes/", views.release_notes_page, name="release_notes"),
    path("releases/<int:pk>/notes/print/", views.release_notes_print, name="release_notes_print"),
    path("releases/<int:pk>/notes.md", views.release_notes_markdown, name="release_notes_markdown"),
    path(
        "releases/<int:pk>/notes/additions/",
        views.release_notes_additions_save,
        name="release_notes_additions",
    ),
    path(
        "jobs/<int:job_id>/notes/regenerate/",
        views.job_notes_regenerate,
        name="job_notes_regenerate",
    ),
    path(
        "releases/<int:pk>/limitations/add/",
        limitation_views.limitation_add,
        name="limitation_add",
    ),
    path("limitations/<int:pk>/edit/", limitation_views.limitation_edit, name="limitation_edit"),
    path(
        "limitations/<int:pk>/status/",
        limitation_views.limitation_set_status,
        name="limitation_set_status",
    ),
    path("pools/", views.pool_list, name="pool_list"),
    path("jobs/<int:job_id>/stages/<str:stage>/rerun/", views.stage_rerun, name="stage_rerun"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel, name="job_cancel"),
    path(
        "jobs/<int:job_id>/performance.csv",
        views.job_performance_csv,
        name="job_performance_csv",
    ),
    path("compare/performance/", views.compare_performance, name="compare_performance"),
    path("reports/", report_views.report, name="report"),
    path("reports/readiness", report_views.report_readiness, name="report_readiness"),
    path("reports/releases.csv", report_views.report_csv, name="report_csv"),
]
