"""Deliveries that started nothing are pruned after DAY0_WEBHOOK_DELIVERY_RETENTION_DAYS
(the daily `day0.prune_webhook_deliveries`); those that started or joined a job are kept, and
an endpoint's log never goes with the endpoint."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db.models import ProtectedError
from django.utils import timezone

from adaptation.models import DeliveryVerdict, WebhookDelivery, WebhookKind
from adaptation.webhooks.endpoints import webhook_endpoint_create
from tests.factories import make_job
from workers import tasks

pytestmark = pytest.mark.django_db

V = DeliveryVerdict


def delivery(endpoint, *, days_ago: float, verdict: str, **fields) -> WebhookDelivery:
    return WebhookDelivery.objects.create(
        endpoint=endpoint,
        received_at=timezone.now() - timedelta(days=days_ago),
        status_code=200,
        verdict=verdict,
        **fields,
    )


def test_old_deliveries_that_started_nothing_are_pruned(settings):
    settings.DAY0_WEBHOOK_DELIVERY_RETENTION_DAYS = 30
    hub, _ = webhook_endpoint_create(name="hub", kind=WebhookKind.HUGGINGFACE)
    job = make_job()
    old = [delivery(hub, days_ago=31, verdict=v) for v in (V.REJECTED, V.IGNORED, V.DUPLICATE)]
    kept = [
        delivery(hub, days_ago=31, verdict=V.ACCEPTED, job=job),
        delivery(hub, days_ago=31, verdict=V.COALESCING, job=job),
        delivery(hub, days_ago=29, verdict=V.REJECTED),  # not old enough yet
    ]

    assert tasks.prune_webhook_deliveries() == {"deleted": len(old)}

    assert set(WebhookDelivery.objects.values_list("pk", flat=True)) == {d.pk for d in kept}


def test_the_retention_is_the_setting(settings):
    settings.DAY0_WEBHOOK_DELIVERY_RETENTION_DAYS = 7
    hub, _ = webhook_endpoint_create(name="hub", kind=WebhookKind.HUGGINGFACE)
    delivery(hub, days_ago=8, verdict=V.REJECTED)
    recent = delivery(hub, days_ago=6, verdict=V.REJECTED)

    assert tasks.prune_webhook_deliveries() == {"deleted": 1}
    assert list(WebhookDelivery.objects.all()) == [recent]


def test_many_old_deliveries_are_pruned_in_batches(settings):
    from adaptation.webhooks import deliveries

    hub, _ = webhook_endpoint_create(name="hub", kind=WebhookKind.HUGGINGFACE)
    old = timezone.now() - timedelta(days=40)
    WebhookDelivery.objects.bulk_create(
        WebhookDelivery(endpoint=hub, received_at=old, status_code=401, verdict=V.REJECTED)
        for _ in range(deliveries.PRUNE_BATCH * 2 + 3)
    )
    assert deliveries.webhook_deliveries_prune() == deliveries.PRUNE_BATCH * 2 + 3
    assert WebhookDelivery.objects.count() == 0


def test_beat_prunes_daily():
    entry = django_settings.CELERY_BEAT_SCHEDULE["prune-webhook-deliveries"]
    assert entry["task"] == "day0.prune_webhook_deliveries" == tasks.prune_webhook_deliveries.name


def test_deleting_an_endpoint_does_not_delete_its_log():
    hub, _ = webhook_endpoint_create(name="hub", kind=WebhookKind.HUGGINGFACE)
    row = delivery(hub, days_ago=1, verdict=V.IGNORED)

    with pytest.raises(ProtectedError):
        hub.delete()
    assert WebhookDelivery.objects.filter(pk=row.pk).exists()
