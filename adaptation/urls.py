"""Pages of the adaptation app: the release board, a release's page and its pool comparison,
stage re-runs and job cancels, the pools page, a job's performance CSV and the performance
compare view."""

from django.urls import path

from adaptation import views

app_name = "adaptation"

urlpatterns = [
    path("", views.board, name="board"),
    path("releases/<int:pk>/", views.release_detail, name="release_detail"),
    path(
        "releases/<int:pk>/compare-pools/",
        views.release_compare_pools,
        name="release_compare_pools",
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
]
