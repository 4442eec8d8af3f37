"""/metrics: Prometheus's text format for a scraper with the token or on an allowed network
(`adaptation.metrics.access`); docs/operations.md, "Metrics"."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from adaptation.metrics.access import metrics_refusal
from adaptation.metrics.exposition import CONTENT_TYPE, metrics_text


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The figures, or a plain-text refusal: 404 when metrics are off, 401 with
    `WWW-Authenticate: Bearer` without the right token, 403 from a network not allowed."""
    refusal = metrics_refusal(
        request,
        token=settings.DAY0_METRICS_TOKEN,
        networks=settings.DAY0_METRICS_ALLOWED_NETWORKS,
    )
    if refusal is not None:
        response = HttpResponse(
            refusal.reason + "\n", status=refusal.status, content_type="text/plain; charset=utf-8"
        )
        if refusal.status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="day0 metrics"'
        return response
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE)
