"""Pages of the adaptation app: the release board, a release's page, and stage re-runs."""

from django.urls import path

from adaptation import views

app_name = "adaptation"

urlpatterns = [
    path("", views.board, name="board"),
    path("releases/<int:pk>/", views.release_detail, name="release_detail"),
    path("jobs/<int:job_id>/stages/<str:stage>/rerun/", views.stage_rerun, name="stage_rerun"),
]
