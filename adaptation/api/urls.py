"""The API's routes, mounted at `/api/v1/` (namespace "api")."""

from rest_framework.routers import DefaultRouter

from adaptation.api import views

app_name = "api"

router = DefaultRouter()
router.register("releases", views.ReleaseViewSet, basename="release")
router.register("jobs", views.JobViewSet, basename="job")
router.register("stages", views.StageRunViewSet, basename="stage")
router.register("pools", views.PoolViewSet, basename="pool")
router.register("suite-runs", views.SuiteRunViewSet, basename="suite-run")
router.register("plans", views.PlanViewSet, basename="plan")
router.register("webhook-endpoints", views.WebhookEndpointViewSet, basename="webhook-endpoint")

urlpatterns = router.urls
