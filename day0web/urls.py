"""Root URL configuration."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from adaptation.views.metrics import metrics


def favicon(request: HttpRequest) -> HttpResponsePermanentRedirect:
    """`/favicon.ico`, which browsers and tools ask for on their own (a download, a JSON
    answer, a page they read no `<link rel="icon">` of): a permanent redirect to day0's icon,
    the static `favicon.svg` every page links."""
    return HttpResponsePermanentRedirect(static("favicon.svg"))


urlpatterns = [
    path("favicon.ico", favicon, name="favicon"),
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # REST API: answers 401 (not a login redirect) without credentials; its docs page is a
    # page, so a signed-out browser goes to the login page. Swagger UI's start script comes
    # from the docs URL itself (?script), as the Content-Security-Policy runs no inline script.
    path("api/v1/", include("adaptation.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path(
        "api/docs/",
        login_required(
            SpectacularSwaggerSplitView.as_view(
                url_name="api-schema", template_name="api_docs.html"
            )
        ),
        name="api-docs",
    ),
    path("webhooks/", include("adaptation.webhooks.urls")),
    # Prometheus's scrape: a bearer token or an allowed network, never a login (off by default).
    path("metrics", metrics, name="metrics"),
    path("", include("adaptation.urls")),
]

# Django's error answers: JSON in the API's one error shape under /api/, the site's pages
# elsewhere (adaptation/api/exceptions.py).
handler400 = "adaptation.api.exceptions.bad_request"
handler403 = "adaptation.api.exceptions.permission_denied"
handler404 = "adaptation.api.exceptions.page_not_found"
handler500 = "adaptation.api.exceptions.server_error"
