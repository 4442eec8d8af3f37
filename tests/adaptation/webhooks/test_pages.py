"""The deliveries page (`/webhooks/deliveries/`) and the webhook admin: who may see them,
what they list, and that a secret is shown once and never again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from adaptation.models import (
    DeliveryVerdict,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookKind,
)
from adaptation.secrets import secret_decrypt, secret_matches
from adaptation.webhooks.endpoints import webhook_endpoint_create
from tests import dom
from tests.factories import make_job

pytestmark = pytest.mark.django_db

URL = reverse("webhooks:deliveries")


@pytest.fixture
def reader(django_user_model):
    """A signed-in-able user holding only `adaptation.view_webhookdelivery`."""
    user = django_user_model.objects.create_user(username="rita", password="pw-rita-123")
    user.user_permissions.add(Permission.objects.get(codename="view_webhookdelivery"))
    return user


@pytest.fixture
def outsider(django_user_model):
    return django_user_model.objects.create_user(username="otto", password="pw-otto-123")


def delivery(endpoint: WebhookEndpoint, **fields) -> WebhookDelivery:
    defaults = {
        "status_code": 200,
        "verdict": DeliveryVerdict.IGNORED,
        "event": "repo.content/update",
        "repo_id": "acme-ai/Acme-LLM-7B",
        "revision": "5f1c0ffee0ddba11c0de5eedfacade0123456789",
        "reason": "updated refs/pr/3, not refs/heads/main",
    }
    return WebhookDelivery.objects.create(endpoint=endpoint, **{**defaults, **fields})


def rows(html: str) -> list[str]:
    """The delivery ids of the list's rows, in order."""
    return [row["data-delivery"] for row in dom.find_all(html, "[data-delivery]")]


def test_anonymous_is_sent_to_login(client):
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_a_user_without_the_permission_gets_403(client, outsider):
    client.force_login(outsider)
    assert client.get(URL).status_code == 403
    board = client.get(reverse("adaptation:board")).content.decode()
    assert URL not in board  # no nav link either


def test_a_reader_sees_the_latest_deliveries_with_their_job(client, reader):
    hub, _ = webhook_endpoint_create(name="hub", kind=WebhookKind.HUGGINGFACE)
    job = make_job()
    older = delivery(hub, received_at=timezone.now() - timedelta(hours=1))
    accepted = delivery(
        hub, verdict=DeliveryVerdict.ACCEPTED, status_code=202, release=job.release, job=job,
        reason="job started",
    )  # fmt: skip
    client.force_login(reader)

    response = client.get(URL)

    assert response.status_code == 200
    html = response.content.decode()
    assert rows(html) == [str(accepted.pk), str(older.pk)]  # newest first
    assert (
        f'href="{reverse("adaptation:release_detail", args=[job.release_id])}#job-{job.pk}"' in html
    )
    assert "acme-ai/Acme-LLM-7B" in html and "5f1c0ffee0dd" in html
    assert "updated refs/pr/3, not refs/heads/main" in html
    assert '<span class="badge status-succeeded">accepted</span>' in html
    assert f'href="{URL}" aria-current="page">Deliveries</a>' in html  # the nav link


def test_filters_by_endpoint_and_verdict(client, reader):
    hub, _ = webhook_endpoint_create(name="hub", kind=WebhookKind.HUGGINGFACE)
    ci, _ = webhook_endpoint_create(name="ci", kind=WebhookKind.GENERIC)
    hub_ignored = delivery(hub)
    hub_rejected = delivery(hub, verdict=DeliveryVerdict.REJECTED, status_code=401)
    ci_rejected = delivery(ci, verdict=DeliveryVerdict.REJECTED, status_code=401)
    client.force_login(reader)

    by_endpoint = rows(client.get(URL, {"endpoint": str(hub.pk)}).content.decode())
    by_verdict = rows(client.get(URL, {"verdict": "rejected"}).content.decode())
    both = rows(client.get(URL, {"endpoint": str(ci.pk), "verdict": "rejected"}).content.decode())

    assert sorted(by_endpoint) == sorted([str(hub_ignored.pk), str(hub_rejected.pk)])
    assert sorted(by_verdict) == sorted([str(hub_rejected.pk), str(ci_rejected.pk)])
    assert both == [str(ci_rejected.pk)]


def test_pages_of_fifty_keep_the_filter(client, reader):
    hub, _ = webhook_endpoint_create(name="hub", kind=WebhookKind.HUGGINGFACE)
    start = timezone.now()
    made = [
        delivery(hub, verdict=DeliveryVerdict.REJECTED, status_code=401,
                 received_at=start - timedelta(seconds=i))
        for i in range(55)
    ]  # fmt: skip
    delivery(hub)  # ignored: filtered out
    client.force_login(reader)

    first = client.get(URL, {"verdict": "rejected"}).content.decode()
    second = client.get(URL, {"verdict": "rejected", "page": 2}).content.decode()

    assert rows(first) == [str(d.pk) for d in made[:50]]
    assert rows(second) == [str(d.pk) for d in made[50:]]
    assert "Page 1 of 2" in first
    assert '?verdict=rejected&amp;page=2" rel="next"' in first


# --- admin ---------------------------------------------------------------------------------


def test_the_admin_shows_a_new_endpoints_secret_once(client, staff_user):
    client.force_login(staff_user)
    response = client.post(
        reverse("admin:adaptation_webhookendpoint_add"),
        {"name": "hub", "kind": "huggingface", "quiet_period_s": "120", "enabled": "on"},
        follow=True,
    )

    endpoint = WebhookEndpoint.objects.get()
    assert (endpoint.quiet_period_s, endpoint.created_by) == (120, staff_user)
    html = response.content.decode()
    shown = [
        code.text
        for code in dom.find_all(html, "code")
        if code.parent and f"Secret of 'hub': {code.text} — copy it now" in code.parent.text
    ]
    assert len(shown) == 1, html[:2000]
    secret = shown[0]
    assert secret_matches(secret, endpoint.secret_digest)
    assert f"/webhooks/huggingface/{endpoint.pk}" in html
    # Never again: not on the change page, not in the list.
    change = client.get(reverse("admin:adaptation_webhookendpoint_change", args=[endpoint.pk]))
    listing = client.get(reverse("admin:adaptation_webhookendpoint_changelist"))
    for page in (change, listing):
        text = page.content.decode()
        assert secret not in text and endpoint.secret_digest not in text
    assert f"/webhooks/huggingface/{endpoint.pk}" in change.content.decode()


def test_the_rotate_action_replaces_the_secret_and_shows_it_once(client, staff_user):
    endpoint, old = webhook_endpoint_create(name="ci", kind=WebhookKind.GENERIC)
    client.force_login(staff_user)
    response = client.post(
        reverse("admin:adaptation_webhookendpoint_changelist"),
        {"action": "rotate_secret", "_selected_action": [str(endpoint.pk)]},
        follow=True,
    )

    endpoint.refresh_from_db()
    new = secret_decrypt(endpoint.secret_ciphertext)
    assert new != old and new.startswith("whsec_")
    assert new in response.content.decode() and old not in response.content.decode()


def test_deliveries_and_uploads_are_read_only_in_the_admin(client, staff_user):
    hub, _ = webhook_endpoint_create(name="hub", kind=WebhookKind.HUGGINGFACE)
    row = delivery(hub)
    client.force_login(staff_user)

    assert client.get(reverse("admin:adaptation_webhookdelivery_add")).status_code == 403
    change = client.get(reverse("admin:adaptation_webhookdelivery_change", args=[row.pk]))
    assert change.status_code == 200 and 'name="_save"' not in change.content.decode()
    found = client.get(reverse("admin:adaptation_webhookdelivery_changelist"), {"q": "Acme"})
    assert "acme-ai/Acme-LLM-7B" in found.content.decode()
    assert client.get(reverse("admin:adaptation_pendingupload_add")).status_code == 403


def test_an_endpoint_filter_that_is_no_choice_says_so_and_lists_nothing(client, reader):
    hub, _ = webhook_endpoint_create(name="hub", kind=WebhookKind.HUGGINGFACE)
    delivery(hub)
    client.force_login(reader)

    for query in ({"endpoint": "not-an-endpoint"}, {"verdict": "maybe"}):
        html = client.get(URL, query).content.decode()
        assert rows(html) == [], query
        assert 'id="filter-errors"' in html and "Select a valid choice" in html
        assert "Nothing listed: fix the filter above." in html


def test_a_new_endpoints_secret_never_travels_in_a_cookie(client, staff_user):
    """Messages are kept in the session: a messages cookie is only signed, so the secret
    would be readable in it."""
    client.force_login(staff_user)
    response = client.post(
        reverse("admin:adaptation_webhookendpoint_add"),
        {"name": "ci", "kind": "generic", "quiet_period_s": "60", "enabled": "on"},
    )

    assert response.status_code == 302
    assert "messages" not in response.cookies
    shown = dom.texts(client.get(response.url), "code")
    [secret] = [code for code in shown if code.startswith("whsec_")]
    assert secret_decrypt(WebhookEndpoint.objects.get().secret_ciphertext) == secret
    for cookie in response.cookies.values():
        assert "whsec_" not in cookie.value


def test_the_admin_will_not_delete_an_endpoint_with_deliveries(client, staff_user):
    hub, _ = webhook_endpoint_create(name="hub", kind=WebhookKind.HUGGINGFACE)
    row = delivery(hub)
    client.force_login(staff_user)
    url = reverse("admin:adaptation_webhookendpoint_delete", args=[hub.pk])

    page = client.get(url).content.decode()
    assert "would require deleting the following protected related objects" in page
    client.post(url, {"post": "yes"})
    assert WebhookEndpoint.objects.filter(pk=hub.pk).exists()
    assert WebhookDelivery.objects.filter(pk=row.pk).exists()
