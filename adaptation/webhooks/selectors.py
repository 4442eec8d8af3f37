"""Reads of the inbound webhook log."""

from __future__ import annotations

from uuid import UUID

from django.db.models import QuerySet

from adaptation.models import WebhookDelivery


def webhook_deliveries_list(
    *, endpoint_id: UUID | str | None = None, verdict: str | None = None
) -> QuerySet[WebhookDelivery]:
    """Deliveries, newest first (ties: the later stored), with their endpoint, release and
    job loaded; only those of `endpoint_id` and with `verdict` when given (None or "": all)."""
    deliveries = WebhookDelivery.objects.select_related("endpoint", "release", "job").order_by(
        "-received_at", "-id"
    )
    if endpoint_id:
        deliveries = deliveries.filter(endpoint_id=endpoint_id)
    if verdict:
        deliveries = deliveries.filter(verdict=verdict)
    return deliveries
