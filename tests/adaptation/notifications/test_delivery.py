"""Delivering notifications to a real local HTTP endpoint: signatures, retries with the same
message id, backoff and Retry-After, final failures, the private-address guard, formats."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from celery.exceptions import Retry
from django.utils import timezone
from standardwebhooks import Webhook

from adaptation.models import NotificationDelivery, NotificationSubscription, StageStatus
from adaptation.notifications import services
from adaptation.notifications.services import notification_deliver, subscription_create
from adaptation.secrets import secret_decrypt
from tests.adaptation.notifications.conftest import fake_getaddrinfo
from tests.factories import make_job

pytestmark = pytest.mark.django_db

Status = NotificationDelivery.Status


def subscribe(team, url: str, **fields) -> tuple[NotificationSubscription, str]:
    fields.setdefault("format", "generic")
    fields.setdefault("allow_private_network", True)
    return subscription_create(team=team, name=fields.pop("name", "ci"), url=url, **fields)


def succeeded_job_delivery(subscription: NotificationSubscription) -> NotificationDelivery:
    """A job that succeeds now, and the job.succeeded delivery it made for `subscription`."""
    make_job(statuses={"fetch": StageStatus.SUCCEEDED, "analyze": StageStatus.SUCCEEDED})
    return NotificationDelivery.objects.get(subscription=subscription)


def failed_job_delivery(subscription, error: str = "plan: nothing fits") -> NotificationDelivery:
    make_job(statuses={"fetch": StageStatus.FAILED}, errors={"fetch": error})
    return NotificationDelivery.objects.get(subscription=subscription, event="job.failed")


def test_generic_delivery_is_signed_and_verifies(team, receiver) -> None:
    subscription, secret = subscribe(team, receiver.url())
    delivery = succeeded_job_delivery(subscription)

    outcome = notification_deliver(delivery_id=delivery.pk)

    assert outcome.status == Status.DELIVERED and outcome.retry_in_s is None
    [request] = receiver.requests
    payload = Webhook(secret).verify(request.body, request.headers)
    assert payload == delivery.payload
    assert payload["type"] == "job.succeeded"
    assert payload["data"]["job"]["id"] == delivery.job_id
    assert payload["data"]["job"]["status"] == "succeeded"
    assert [s["status"] for s in payload["data"]["stages"]] == ["succeeded", "succeeded"]
    assert request.headers["webhook-id"] == delivery.message_id
    assert request.headers["webhook-id"].startswith("msg_")
    assert request.headers["content-type"] == "application/json"
    # Another secret does not verify it.
    with pytest.raises(Exception, match="No matching signature"):
        Webhook("whsec_" + "A" * 32).verify(request.body, request.headers)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_status) == (
        Status.DELIVERED,
        1,
        200,
    )
    assert delivery.delivered_at is not None and delivery.next_attempt_at is None


def test_a_500_is_retried_with_the_same_message_id(team, receiver) -> None:
    receiver.answer("/hook", (500, {}))
    subscription, secret = subscribe(team, receiver.url())
    delivery = succeeded_job_delivery(subscription)

    first = notification_deliver(delivery_id=delivery.pk)
    assert (first.status, first.retry_in_s) == (Status.PENDING, 10.0)
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and delivery.response_status == 500
    assert delivery.last_error == "Attempt 1 of 6: HTTP 500: nope; next in 10 s"
    assert abs((delivery.next_attempt_at - timezone.now()).total_seconds() - 10) < 2
    # Not due yet: a duplicate message does nothing.
    assert notification_deliver(delivery_id=delivery.pk).status == "skipped"
    assert len(receiver.requests) == 1

    second = notification_deliver(delivery_id=delivery.pk, now=delivery.next_attempt_at)

    assert second.status == Status.DELIVERED
    assert [r.headers["webhook-id"] for r in receiver.requests] == [delivery.message_id] * 2
    assert receiver.requests[0].body == receiver.requests[1].body
    for request in receiver.requests:
        Webhook(secret).verify(request.body, request.headers)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (Status.DELIVERED, 2)


def test_backoff_doubles_from_10_s() -> None:
    assert [services.retry_countdown_s(attempts=n) for n in range(1, 6)] == [
        10.0,
        20.0,
        40.0,
        80.0,
        160.0,
    ]
    assert services.retry_countdown_s(attempts=2, retry_after_s=5) == 20.0
    assert services.retry_countdown_s(attempts=2, retry_after_s=120) == 120.0
    assert services.retry_countdown_s(attempts=1, retry_after_s=86400) == 3600.0


@pytest.mark.parametrize(
    ("retry_after", "countdown"),
    [("120", 120.0), ("3", 10.0), ("86400", 3600.0), (None, 10.0)],
)
def test_a_429_honours_retry_after_up_to_the_cap(team, receiver, retry_after, countdown) -> None:
    receiver.answer("/hook", (429, {"Retry-After": retry_after} if retry_after else {}))
    subscription, _ = subscribe(team, receiver.url())
    delivery = succeeded_job_delivery(subscription)

    outcome = notification_deliver(delivery_id=delivery.pk)

    assert (outcome.status, outcome.retry_in_s) == (Status.PENDING, countdown)
    delivery.refresh_from_db()
    assert delivery.response_status == 429
    assert abs((delivery.next_attempt_at - timezone.now()).total_seconds() - countdown) < 2


def test_the_task_retries_with_the_computed_countdown(team, receiver, monkeypatch) -> None:
    from workers.tasks import deliver_notification

    receiver.answer("/hook", (503, {"Retry-After": "90"}))
    subscription, _ = subscribe(team, receiver.url())
    delivery = succeeded_job_delivery(subscription)
    asked: list[float] = []

    def retry(*, countdown: float) -> Retry:
        asked.append(countdown)
        return Retry("retrying", when=countdown)

    monkeypatch.setattr(deliver_notification, "retry", retry)
    with pytest.raises(Retry):
        deliver_notification(delivery.pk)
    assert asked == [90.0]
    # The retry's message arrives when the row says it is due.
    NotificationDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    assert deliver_notification(delivery.pk) == "delivered"
    assert asked == [90.0]


def test_a_404_fails_at_once_without_retry(team, receiver) -> None:
    receiver.answer("/hook", (404, {}))
    subscription, _ = subscribe(team, receiver.url())
    delivery = succeeded_job_delivery(subscription)

    outcome = notification_deliver(delivery_id=delivery.pk)

    assert (outcome.status, outcome.retry_in_s) == (Status.FAILED, None)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_status) == (
        Status.FAILED,
        1,
        404,
    )
    assert delivery.next_attempt_at is None
    far_later = timezone.now() + timedelta(days=1)
    assert notification_deliver(delivery_id=delivery.pk, now=far_later).status == "skipped"
    assert len(receiver.requests) == 1


def test_gives_up_after_the_last_attempt(team, receiver, settings) -> None:
    settings.DAY0_NOTIFY_MAX_ATTEMPTS = 2
    receiver.answer("/hook", (500, {}), (502, {}), (200, {}))
    subscription, _ = subscribe(team, receiver.url())
    delivery = succeeded_job_delivery(subscription)

    assert notification_deliver(delivery_id=delivery.pk).status == Status.PENDING
    later = timezone.now() + timedelta(seconds=11)
    outcome = notification_deliver(delivery_id=delivery.pk, now=later)

    assert (outcome.status, outcome.retry_in_s) == (Status.FAILED, None)
    delivery.refresh_from_db()
    assert delivery.last_error == "Gave up after 2 attempts: HTTP 502: nope"
    assert len(receiver.requests) == 2


def test_a_network_error_is_retried(team, closed_port) -> None:
    subscription, _ = subscribe(team, f"http://127.0.0.1:{closed_port}/hook")
    delivery = succeeded_job_delivery(subscription)

    outcome = notification_deliver(delivery_id=delivery.pk)

    assert (outcome.status, outcome.retry_in_s) == (Status.PENDING, 10.0)
    delivery.refresh_from_db()
    assert "cannot connect to 127.0.0.1" in delivery.last_error
    assert delivery.response_status is None


def test_loopback_is_blocked_unless_the_admin_allows_it(team, receiver) -> None:
    subscription, _ = subscribe(team, receiver.url(), allow_private_network=False)
    delivery = succeeded_job_delivery(subscription)

    outcome = notification_deliver(delivery_id=delivery.pk)

    assert (outcome.status, outcome.retry_in_s) == (Status.BLOCKED, None)
    assert receiver.requests == []
    delivery.refresh_from_db()
    assert delivery.status == Status.BLOCKED and delivery.attempts == 1
    assert "127.0.0.1, a loopback address" in delivery.last_error

    # The admin allows it and retries: now it arrives.
    NotificationSubscription.objects.filter(pk=subscription.pk).update(allow_private_network=True)
    assert services.notification_retry_now(delivery=delivery)
    assert notification_deliver(delivery_id=delivery.pk).status == Status.DELIVERED
    assert len(receiver.requests) == 1


@pytest.mark.parametrize(
    "addresses", [["10.0.0.7"], ["169.254.169.254"], ["::1"], ["::ffff:127.0.0.1"]]
)
def test_a_name_resolving_inside_is_blocked(team, monkeypatch, addresses) -> None:
    fake_getaddrinfo(monkeypatch, {"hooks.example.test": addresses})
    subscription, _ = subscribe(
        team, "https://hooks.example.test/day0", allow_private_network=False
    )
    delivery = succeeded_job_delivery(subscription)

    outcome = notification_deliver(delivery_id=delivery.pk)

    assert (outcome.status, outcome.retry_in_s) == (Status.BLOCKED, None)
    delivery.refresh_from_db()
    assert f"hooks.example.test resolves to {addresses[0]}" in delivery.last_error


def test_a_redirect_is_not_followed(team, receiver) -> None:
    receiver.answer("/hook", (307, {"Location": receiver.url("/elsewhere")}))
    subscription, _ = subscribe(team, receiver.url())
    delivery = succeeded_job_delivery(subscription)

    outcome = notification_deliver(delivery_id=delivery.pk)

    assert (outcome.status, outcome.retry_in_s) == (Status.FAILED, None)
    assert [r.path for r in receiver.requests] == ["/hook"]
    delivery.refresh_from_db()
    assert delivery.response_status == 307
    assert delivery.last_error == (
        f"HTTP 307 redirect to {receiver.url('/elsewhere')} not followed; fix the URL"
    )


def test_slack_format_body(team, receiver) -> None:
    subscription, secret = subscribe(team, receiver.url("/slack"), format="slack")
    assert secret == ""
    delivery = failed_job_delivery(subscription, error="<boom> & more\n\nTraceback: ...")

    assert notification_deliver(delivery_id=delivery.pk).status == Status.DELIVERED

    [request] = receiver.requests
    assert "webhook-signature" not in request.headers
    body = request.json()
    assert set(body) == {"text", "blocks"}
    job = delivery.job
    ref = f"{job.release.repo_id}@{job.release.revision[:12]}"
    assert body["blocks"][0] == {
        "type": "section",
        "text": {
            "type": "mrkdwn",
            "text": f":x: Job {job.pk} *failed* at *fetch*: *{ref}* on pool *cpu*",
        },
    }
    # The error, escaped for mrkdwn, without the traceback after the blank line.
    assert body["blocks"][1]["text"]["text"] == "```&lt;boom&gt; &amp; more```"
    link = f"http://127.0.0.1:8000/releases/{job.release_id}/#job-{job.pk}"
    assert body["blocks"][2] == {
        "type": "context",
        "elements": [{"type": "mrkdwn", "text": f"<{link}|Open job {job.pk} in day0>"}],
    }
    assert body["text"].startswith(f":x: Job {job.pk} *failed*")
    assert body["text"].endswith(f"<{link}|open in day0>")


def test_an_unreadable_secret_fails_with_the_remedy(team, receiver) -> None:
    subscription, _ = subscribe(team, receiver.url())
    NotificationSubscription.objects.filter(pk=subscription.pk).update(
        secret_ciphertext="not-a-fernet-token"
    )
    delivery = succeeded_job_delivery(subscription)

    assert notification_deliver(delivery_id=delivery.pk).status == Status.FAILED
    delivery.refresh_from_db()
    assert "rotate the subscription's signing secret" in delivery.last_error
    assert receiver.requests == []


def test_a_rotated_secret_signs_the_retries(team, receiver) -> None:
    receiver.answer("/hook", (500, {}))
    subscription, old = subscribe(team, receiver.url())
    delivery = succeeded_job_delivery(subscription)
    notification_deliver(delivery_id=delivery.pk)

    new = services.subscription_rotate_secret(subscription=subscription)
    delivery.refresh_from_db()
    notification_deliver(delivery_id=delivery.pk, now=delivery.next_attempt_at)

    assert new != old and secret_decrypt(subscription.secret_ciphertext) == new
    first, second = receiver.requests
    Webhook(old).verify(first.body, first.headers)
    Webhook(new).verify(second.body, second.headers)


def test_the_sweep_resends_only_pending_deliveries_long_past_due(
    team, receiver, sent_messages
) -> None:
    subscription, _ = subscribe(team, receiver.url())
    now = timezone.now()
    rows = {}
    for name, status, due in [
        ("lost", Status.PENDING, now - timedelta(minutes=5)),
        ("just-due", Status.PENDING, now - timedelta(seconds=10)),
        ("later", Status.PENDING, now + timedelta(minutes=5)),
        ("delivered", Status.DELIVERED, None),
        ("failed", Status.FAILED, None),
    ]:
        rows[name] = NotificationDelivery.objects.create(
            subscription=subscription,
            event="job.succeeded",
            dedupe_key=name,
            message_id=services.new_message_id(),
            payload={"type": "job.succeeded"},
            status=status,
            next_attempt_at=due,
        )

    assert services.notifications_resend_due(now=now) == 1
    assert sent_messages == [rows["lost"].pk]


def test_retry_now_leaves_a_delivered_one_alone(team, receiver, sent_messages) -> None:
    subscription, _ = subscribe(team, receiver.url())
    delivery = succeeded_job_delivery(subscription)
    notification_deliver(delivery_id=delivery.pk)
    sent_messages.clear()

    assert services.notification_retry_now(delivery=delivery) is False
    delivery.refresh_from_db()
    assert delivery.status == Status.DELIVERED
    assert sent_messages == []


def test_payload_is_json_with_sorted_keys(team, receiver) -> None:
    subscription, _ = subscribe(team, receiver.url())
    delivery = succeeded_job_delivery(subscription)
    notification_deliver(delivery_id=delivery.pk)
    body = receiver.requests[0].body.decode()
    assert body == json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True)
