"""The webhook receivers (thin: the providers verify, decide and store) and the deliveries
page.

Receivers are CSRF-exempt and need no login (the secret or signature is the credential), take
POST only, and answer JSON `{"delivery", "verdict", "reason", "release", "job", "job_url",
...}`: 404 for an unknown or disabled endpoint (or one of the other kind, or a path that is
not an endpoint id), 413 for a body over `DAY0_WEBHOOK_MAX_BODY_BYTES`. Nothing slow runs
in the request: no hub call, and work is queued after the transaction commits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_not_required, permission_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

from adaptation.models import DeliveryVerdict, WebhookEndpoint, WebhookKind
from adaptation.page_links import job_page_url
from adaptation.views.access import login_required
from adaptation.webhooks.deliveries import (
    BodyTooLarge,
    DeliveryRecorder,
    Incoming,
    Outcome,
    endpoint_touch,
    incoming_from,
    read_body,
    rejected,
)
from adaptation.webhooks.generic import generic_delivery_handle
from adaptation.webhooks.huggingface import huggingface_delivery_handle
from adaptation.webhooks.selectors import webhook_deliveries_list

DELIVERIES_PER_PAGE = 50
# The board's status colours, by verdict: started (green), waiting (amber), refused (red).
VERDICT_BADGES = {
    DeliveryVerdict.ACCEPTED: "succeeded",
    DeliveryVerdict.COALESCING: "queued",
    DeliveryVerdict.DUPLICATE: "skipped",
    DeliveryVerdict.IGNORED: "pending",
    DeliveryVerdict.REJECTED: "failed",
}

Handler = Callable[..., Outcome]


def _answer(outcome: Outcome) -> JsonResponse:
    """The JSON answer to a delivery: its verdict and reason, what it points at (the job's
    page under `DAY0_PUBLIC_URL`, as notifications link it) and the provider's extras."""
    payload: dict[str, Any] = {
        "delivery": None,
        "verdict": outcome.verdict,
        "reason": outcome.reason,
        "release": outcome.release.pk if outcome.release is not None else None,
        "job": outcome.job.pk if outcome.job is not None else None,
        "job_url": job_page_url(outcome.job) if outcome.job is not None else None,
        **outcome.extra,
    }
    return JsonResponse(payload, status=outcome.status_code)


def _no_such_endpoint(reason: str = "no such webhook endpoint") -> JsonResponse:
    return JsonResponse({"verdict": DeliveryVerdict.REJECTED, "reason": reason}, status=404)


def _receive(
    request: HttpRequest, endpoint_id: UUID, *, kind: str, handle: Handler
) -> HttpResponse:
    if request.method != "POST":
        response = JsonResponse(
            {"verdict": DeliveryVerdict.REJECTED, "reason": "webhooks are delivered by POST"},
            status=405,
        )
        response["Allow"] = "POST"
        return response
    endpoint = WebhookEndpoint.objects.select_related("pool").filter(pk=endpoint_id, kind=kind)
    endpoint = endpoint.first()
    if endpoint is None:
        return _no_such_endpoint()
    outcome: Outcome
    incoming: Incoming
    try:
        body = read_body(request, limit_bytes=settings.DAY0_WEBHOOK_MAX_BODY_BYTES)
    except BodyTooLarge as exc:
        incoming, outcome = incoming_from(request), rejected(413, str(exc))
    else:
        incoming = incoming_from(request, body)
        if not endpoint.enabled:
            outcome = rejected(404, "no such webhook endpoint (it is disabled)")
        else:
            outcome = handle(endpoint=endpoint, incoming=incoming)
    if outcome.verdict == DeliveryVerdict.REJECTED and "delivery" not in outcome.extra:
        # Refused before the provider saw it: its sender never proved itself.
        DeliveryRecorder(endpoint=endpoint, incoming=incoming)(outcome)
    endpoint_touch(endpoint=endpoint, at=incoming.received_at)
    return _answer(outcome)


@csrf_exempt
@login_not_required
def huggingface(request: HttpRequest, endpoint_id: UUID) -> HttpResponse:
    """A Hugging Face Hub delivery (`adaptation.webhooks.huggingface`)."""
    return _receive(
        request, endpoint_id, kind=WebhookKind.HUGGINGFACE, handle=huggingface_delivery_handle
    )


@csrf_exempt
@login_not_required
def generic(request: HttpRequest, endpoint_id: UUID) -> HttpResponse:
    """A Standard Webhooks delivery asking for a job (`adaptation.webhooks.generic`)."""
    return _receive(request, endpoint_id, kind=WebhookKind.GENERIC, handle=generic_delivery_handle)


@csrf_exempt
@login_not_required
def not_an_endpoint(request: HttpRequest, rest: str) -> HttpResponse:
    """/webhooks/<kind>/<anything but an endpoint id>: the receivers' JSON 404, not a page."""
    return _no_such_endpoint("no such webhook endpoint (an endpoint's id is a UUID)")


class DeliveryFilter(forms.Form):
    """The deliveries page's filters; blank means all."""

    endpoint = forms.ChoiceField(required=False)
    verdict = forms.ChoiceField(
        required=False, choices=[("", "All verdicts"), *DeliveryVerdict.choices]
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["endpoint"].choices = [
            ("", "All endpoints"),
            *((str(e.pk), str(e)) for e in WebhookEndpoint.objects.order_by("name")),
        ]


@login_required
@permission_required("adaptation.view_webhookdelivery", raise_exception=True)
@require_GET
def delivery_list(request: HttpRequest) -> HttpResponse:
    """The latest deliveries, newest first, filtered by endpoint and verdict, 50 a page. A
    filter that is not one of the choices (an endpoint since deleted, a mistyped verdict)
    lists nothing and says why on the form: never every delivery as if unfiltered."""
    form = DeliveryFilter(request.GET or None)
    filters: dict[str, str] = {}
    if form.is_bound and form.is_valid():
        filters = {k: v for k, v in form.cleaned_data.items() if v}
    deliveries = webhook_deliveries_list(
        endpoint_id=filters.get("endpoint"), verdict=filters.get("verdict")
    )
    if form.errors:
        deliveries = deliveries.none()
    page = Paginator(deliveries, DELIVERIES_PER_PAGE).get_page(request.GET.get("page"))
    rows = [{"delivery": d, "badge": VERDICT_BADGES.get(d.verdict, "pending")} for d in page]
    return render(
        request,
        "adaptation/webhook_deliveries.html",
        {
            "form": form,
            "page": page,
            "rows": rows,
            "filter_query": urlencode(filters),
            "filtered": bool(filters) or bool(form.errors),
        },
    )
