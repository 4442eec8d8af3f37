"""The admin: a generic subscription's secret is shown once, only superusers open private
networks, secrets rotate, deliveries are read-only and can be retried."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from adaptation.models import NotificationDelivery, NotificationSubscription, StageStatus
from adaptation.notifications.services import new_message_id, subscription_create
from adaptation.secrets import secret_decrypt
from tests.factories import make_job

pytestmark = pytest.mark.django_db

ADD_URL = reverse("admin:adaptation_notificationsubscription_add")
LIST_URL = reverse("admin:adaptation_notificationsubscription_changelist")
DELIVERIES_URL = reverse("admin:adaptation_notificationdelivery_changelist")


def shown_secrets(response) -> list[str]:
    """The whsec_ secrets on a page (messages show on the page after a redirect)."""
    return re.findall(r"whsec_[A-Za-z0-9+/=]+", response.content.decode())


def form_data(team, **fields) -> dict:
    data = {
        "team": team.pk,
        "name": "ci",
        "enabled": "on",
        "url": "https://hooks.example.com/day0",
        "format": "generic",
        "events": ["stage.failed", "job.failed"],
    }
    data.update(fields)
    return data


@pytest.fixture
def engineer(django_user_model):
    """Staff who may manage subscriptions, but is no superuser."""
    user = django_user_model.objects.create_user(username="eng", password="x", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            codename__in=[
                "add_notificationsubscription",
                "change_notificationsubscription",
                "view_notificationsubscription",
            ]
        )
    )
    return user


def test_adding_a_generic_subscription_shows_its_secret_once(logged_in_client, team) -> None:
    response = logged_in_client.post(
        ADD_URL, form_data(team, allow_private_network="on"), follow=True
    )
    assert response.redirect_chain == [(LIST_URL, 302)]

    [secret] = shown_secrets(response)
    subscription = NotificationSubscription.objects.get(name="ci")
    assert secret_decrypt(subscription.secret_ciphertext) == secret
    assert subscription.events == ["stage.failed", "job.failed"]
    assert subscription.allow_private_network is True  # a superuser may
    change = logged_in_client.get(
        reverse("admin:adaptation_notificationsubscription_change", args=[subscription.pk])
    )
    assert secret not in change.content.decode()
    assert "Set (stored encrypted" in change.content.decode()


def test_a_slack_subscription_has_no_secret(logged_in_client, team) -> None:
    response = logged_in_client.post(
        ADD_URL,
        form_data(team, format="slack", url="https://hooks.slack.com/services/T/B/X"),
        follow=True,
    )
    assert response.redirect_chain == [(LIST_URL, 302)]
    assert shown_secrets(response) == []
    assert NotificationSubscription.objects.get(name="ci").secret_ciphertext == ""


def test_the_form_refuses_other_schemes(logged_in_client, team) -> None:
    response = logged_in_client.post(ADD_URL, form_data(team, url="ftp://hooks.example.com/x"))
    assert response.status_code == 200
    assert NotificationSubscription.objects.count() == 0


def test_only_a_superuser_opens_private_networks(client, engineer, team) -> None:
    client.force_login(engineer)
    response = client.post(ADD_URL, form_data(team, allow_private_network="on"))
    assert response.status_code == 302
    subscription = NotificationSubscription.objects.get(name="ci")
    assert subscription.allow_private_network is False

    change_url = reverse("admin:adaptation_notificationsubscription_change", args=[subscription.pk])
    page = client.get(change_url).content.decode()
    assert 'name="allow_private_network"' not in page
    client.post(change_url, form_data(team, allow_private_network="on"))
    subscription.refresh_from_db()
    assert subscription.allow_private_network is False


def test_rotating_shows_a_new_secret_once(logged_in_client, team) -> None:
    subscription, old = subscription_create(
        team=team, name="ci", url="https://hooks.example.com/x", format="generic"
    )
    response = logged_in_client.post(
        LIST_URL,
        {"action": "rotate_signing_secret", "_selected_action": [subscription.pk]},
        follow=True,
    )
    [new] = shown_secrets(response)
    subscription.refresh_from_db()
    assert new != old
    assert secret_decrypt(subscription.secret_ciphertext) == new
    assert shown_secrets(logged_in_client.get(LIST_URL)) == []  # once


def test_deliveries_are_read_only_and_can_be_retried(
    logged_in_client, team, django_capture_on_commit_callbacks, sent_messages
) -> None:
    subscription, _ = subscription_create(
        team=team, name="ci", url="https://hooks.example.com/x", format="generic"
    )
    job = make_job(statuses={"fetch": StageStatus.FAILED})
    failed = NotificationDelivery.objects.create(
        subscription=subscription,
        event="job.failed",
        dedupe_key="x",
        message_id=new_message_id(),
        job=job,
        payload={"type": "job.failed"},
        status=NotificationDelivery.Status.FAILED,
        attempts=6,
        last_error="Gave up after 6 attempts: HTTP 503",
    )
    sent_messages.clear()
    assert (
        logged_in_client.get(reverse("admin:adaptation_notificationdelivery_add")).status_code
        == 403
    )
    page = logged_in_client.get(f"{DELIVERIES_URL}?status__exact=failed")
    assert page.status_code == 200 and "Retry now" in page.content.decode()

    with django_capture_on_commit_callbacks(execute=True):
        logged_in_client.post(
            DELIVERIES_URL, {"action": "retry_now", "_selected_action": [failed.pk]}
        )

    failed.refresh_from_db()
    assert failed.status == NotificationDelivery.Status.PENDING
    assert sent_messages == [failed.pk]
    change = logged_in_client.get(
        reverse("admin:adaptation_notificationsubscription_change", args=[subscription.pk])
    ).content.decode()
    assert f"?subscription__id__exact={subscription.pk}" in change
    assert "job.failed" in change


@pytest.mark.parametrize(("who", "expected"), [("eli", 403), ("mona", 403), ("ada", 200)])
def test_subscriptions_and_their_deliveries_are_the_admin_roles_only(
    client, cast, team, who, expected
) -> None:
    """A subscription's URL is a secret (a Slack URL is the credential itself): engineers and
    managers, who read every other day0 model, do not see them, nor the deliveries."""
    subscription = NotificationSubscription.objects.create(
        team=team, name="slack", url="https://hooks.slack.com/services/T0/B0/s3cr3t", format="slack"
    )
    user = getattr(cast, who)
    user.is_staff = True  # as if let into the admin site: the role alone must keep them out
    user.save()
    client.force_login(user)

    for url in (
        LIST_URL,
        reverse("admin:adaptation_notificationsubscription_change", args=[subscription.pk]),
        DELIVERIES_URL,
    ):
        response = client.get(url)
        assert response.status_code == expected, url
        if expected == 403:
            assert "s3cr3t" not in response.content.decode()
    index = client.get(reverse("admin:index")).content.decode()
    assert ("Notification subscriptions" in index) is (expected == 200)
