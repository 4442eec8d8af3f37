"""Every write about notifications: subscriptions and their secrets, emitting events as
deliveries, and delivering them with retries.

A `NotificationDelivery` row is the truth about one event sent to one subscription. It is
created in the same transaction as the change it reports (so a rolled-back stage notifies
nobody, and a committed one is not forgotten if the process dies right after), and its
Celery message is sent once that transaction commits. Each attempt first claims the row with
a conditional update, so a retry and the periodic sweep never send it twice at once.

Retry policy (`notification_deliver`): a 2xx answer delivers; a 408, 429, 5xx or network
error is retried after 10 s x 2**(attempt - 1) (10, 20, 40, 80, 160 s: or the answer's
`Retry-After`, when longer, up to `RETRY_AFTER_CAP_S`) until `DAY0_NOTIFY_MAX_ATTEMPTS`
attempts; any other answer (a 3xx, which is never followed, or a 4xx) fails at once; a URL
refused by the private-address guard is blocked at once.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from adaptation import outbound_http
from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    NotificationDelivery,
    NotificationEvent,
    NotificationFormat,
    NotificationSubscription,
    StageRun,
    Team,
    default_notification_events,
)
from adaptation.notifications.events import (
    event_dedupe_key,
    event_payload,
    weekly_summary_dedupe_key,
    weekly_summary_payload,
)
from adaptation.notifications.formats import render_message
from adaptation.secrets import SecretUnreadable, new_signing_secret, secret_decrypt, secret_encrypt
from adaptation.worker_tasks import DELIVER_NOTIFICATION, worker_task
from engine.hubs.http import retry_after_seconds

logger = logging.getLogger(__name__)

Status = NotificationDelivery.Status

# The first retry waits this long (seconds); each further one twice as long.
BACKOFF_BASE_S = 10
# A receiver's Retry-After is honoured up to this many seconds.
RETRY_AFTER_CAP_S = 3600
# Answers worth trying again: a timeout, rate limiting, and the receiver's server errors.
RETRYABLE_STATUS = frozenset({408, 429})
# The periodic sweep re-sends a pending delivery this long (seconds) after it fell due:
# by then its own message (the first send or a Celery retry) should have run.
SWEEP_GRACE_S = 30
# An attempt's task may start this many seconds before the time the row says (clocks of
# different machines, Celery's ETA rounding).
DUE_TOLERANCE_S = 2


class SubscriptionError(ValueError):
    """A subscription that cannot be created or changed as asked, with the reason."""


# --- subscriptions -----------------------------------------------------------------------------


def subscription_url_check(url: str) -> str:
    """`url` stripped, if it is an absolute http or https URL with a host. Raises
    `SubscriptionError` otherwise. (Where it points is checked at each delivery: a name can
    resolve somewhere else tomorrow.)"""
    url = (url or "").strip()
    parts = urlsplit(url)
    if parts.scheme not in outbound_http.ALLOWED_SCHEMES:
        raise SubscriptionError(
            f"Notification URLs must be http or https, not {parts.scheme or 'none'!r}: {url!r}."
        )
    if not parts.hostname:
        raise SubscriptionError(f"The notification URL {url!r} has no host.")
    return url


def subscription_events_check(events: Iterable[str] | None) -> list[str]:
    """The event names, each once, in the order of `NotificationEvent` (for None, a new
    subscription's default: every job event, `default_notification_events`). Raises
    `SubscriptionError` for an unknown name or an empty list."""
    if events is None:
        return default_notification_events()
    if isinstance(events, str):
        raise SubscriptionError(f"Events must be a list of names, not the text {events!r}.")
    wanted = list(events)
    unknown = [name for name in wanted if name not in NotificationEvent.values]
    if unknown:
        raise SubscriptionError(
            f"Unknown {'event' if len(unknown) == 1 else 'events'} "
            f"{', '.join(map(repr, unknown))}; events: {', '.join(NotificationEvent.values)}."
        )
    if not wanted:
        raise SubscriptionError("A subscription needs at least one event.")
    return [name for name in NotificationEvent.values if name in wanted]


def subscription_create(
    *,
    team: Team,
    name: str,
    url: str,
    format: str,
    events: Iterable[str] | None = None,
    pools: Iterable[AcceleratorPool] | None = None,
    allow_private_network: bool = False,
) -> tuple[NotificationSubscription, str]:
    """Create a subscription of `team` to `events` (default: all) of `pools` (default: every
    pool) sent to `url` in `format` ("generic" or "slack").

    Returns the subscription and its signing secret ("whsec_…", generic only; "" for slack).
    The secret is stored encrypted and cannot be read back through the admin: the caller
    shows it once. Raises `SubscriptionError` for a blank or taken name, an unknown format
    or event, or a URL that is not http(s).
    """
    name = (name or "").strip()
    if not name:
        raise SubscriptionError("A subscription needs a name.")
    if format not in NotificationFormat.values:
        raise SubscriptionError(
            f"Unknown format {format!r}; use one of {', '.join(NotificationFormat.values)}."
        )
    subscription = NotificationSubscription(
        team=team,
        name=name,
        url=subscription_url_check(url),
        format=format,
        events=subscription_events_check(events),
        allow_private_network=allow_private_network,
    )
    secret = ""
    if format == NotificationFormat.GENERIC:
        secret = new_signing_secret()
        subscription.secret_ciphertext = secret_encrypt(secret)
    try:
        with transaction.atomic():
            subscription.save()
            if pools is not None:
                subscription.pools.set(list(pools))
    except IntegrityError as exc:
        raise SubscriptionError(f"Team {team.name!r} has a subscription {name!r} already.") from exc
    return subscription, secret


def subscription_rotate_secret(*, subscription: NotificationSubscription) -> str:
    """Give a generic subscription a new signing secret, stored encrypted, and return it (to
    be shown once). Deliveries sent from now on, retries included, are signed with it.
    Raises `SubscriptionError` for a Slack subscription (it is not signed)."""
    if subscription.format != NotificationFormat.GENERIC:
        raise SubscriptionError(
            f"{subscription} is a {subscription.get_format_display()} subscription: "
            "it is not signed, so it has no secret."
        )
    secret = new_signing_secret()
    subscription.secret_ciphertext = secret_encrypt(secret)
    subscription.save(update_fields=["secret_ciphertext"])
    return secret


# --- emitting ------------------------------------------------------------------------------------


def subscriptions_for(*, event: str, pool_id: int) -> list[NotificationSubscription]:
    """The enabled subscriptions that want `event` from the pool `pool_id` (those naming no
    pool want every pool's)."""
    candidates = (
        NotificationSubscription.objects.filter(enabled=True)
        .filter(Q(pools__isnull=True) | Q(pools=pool_id))
        .distinct()
        .order_by("pk")
    )
    # `events` is a JSON list; SQLite has no JSON "contains", so filter here.
    return [sub for sub in candidates if event in (sub.events or [])]


def new_message_id() -> str:
    """A Standard Webhooks message id: "msg_" + 128 random bits, URL-safe."""
    return "msg_" + secrets.token_urlsafe(16)


def notifications_emit(
    *, event: str, job: AdaptationJob, stage_run: StageRun | None = None
) -> list[NotificationDelivery]:
    """Record `event` about `job` (and `stage_run`, for `stage.failed`) as one pending
    delivery per subscription that wants it, and send their Celery messages once the
    current transaction commits (nothing is sent for work that is rolled back).

    The same event about the same subject (`event_dedupe_key`) is recorded once per
    subscription, even when reported again or concurrently. Returns the deliveries created.
    Raises `ValueError` for an unknown event; database errors propagate (callers in the
    stage flow use `notifications_emit_safely`).
    """
    if event not in NotificationEvent.values:
        raise ValueError(f"Unknown event {event!r}; events: {', '.join(NotificationEvent.values)}.")
    subscriptions = subscriptions_for(event=event, pool_id=job.pool_id)
    if not subscriptions:
        return []
    if stage_run is not None:
        # The caller's object may predate the update that failed it: read it back.
        stage_run = StageRun.objects.select_related("job__release", "job__pool").get(
            pk=stage_run.pk
        )
        job = stage_run.job
    else:
        job = AdaptationJob.objects.select_related("release", "pool").get(pk=job.pk)
    key = event_dedupe_key(event=event, job=job, stage_run=stage_run)
    payload = event_payload(event=event, job=job, stage_run=stage_run)
    now = timezone.now()
    created: list[NotificationDelivery] = []
    for subscription in subscriptions:
        if NotificationDelivery.objects.filter(subscription=subscription, dedupe_key=key).exists():
            continue
        delivery = _record_once(
            subscription=subscription,
            event=event,
            dedupe_key=key,
            job=job,
            stage_run=stage_run,
            payload=payload,
            next_attempt_at=now,
        )
        if delivery is not None:
            created.append(delivery)
    _send_after_commit(created)
    return created


def notifications_emit_safely(
    *, event: str, job: AdaptationJob, stage_run: StageRun | None = None
) -> int:
    """`notifications_emit` that never raises: for the stage flow, which a notification
    problem must not break. Its writes run in a savepoint, so a failure rolls back only
    them; it is logged. Returns how many deliveries were created (0 after a failure)."""
    try:
        with transaction.atomic():
            return len(notifications_emit(event=event, job=job, stage_run=stage_run))
    except Exception:
        logger.exception("Could not record the %s notifications of job %s", event, job.pk)
        return 0


def report_weekly_send(*, now: datetime | None = None) -> list[NotificationDelivery]:
    """Send the managers' weekly summary: the report of the last 7 days before today (UTC;
    on a Monday, the week before) to every enabled subscription that takes "report.weekly",
    each for its own pools (every pool when it names none), as one pending delivery per
    subscription, sent after commit. At most once per subscription and ISO week of `now`
    (dedupe key "report.weekly:2025-W29"), however often it runs. Returns the deliveries
    created."""
    from adaptation.domain.reports import release_report
    from adaptation.selectors.reports import ReportQuery, report_rows

    now = now or timezone.now()
    today = now.astimezone(UTC).date()
    week = weekly_summary_dedupe_key(now=now)
    event = NotificationEvent.REPORT_WEEKLY
    subscriptions = [
        sub
        for sub in NotificationSubscription.objects.filter(enabled=True)
        .prefetch_related("pools")
        .order_by("pk")
        if event in (sub.events or [])
    ]
    payloads: dict[tuple[str, ...], dict[str, Any]] = {}
    created: list[NotificationDelivery] = []
    for subscription in subscriptions:
        if NotificationDelivery.objects.filter(subscription=subscription, dedupe_key=week).exists():
            continue
        pools = tuple(sorted(pool.name for pool in subscription.pools.all()))
        if pools not in payloads:
            query = ReportQuery(
                date_from=today - timedelta(days=7), date_to=today - timedelta(days=1), pools=pools
            )
            payloads[pools] = weekly_summary_payload(
                summary=release_report(report_rows(query)).summary.as_dict(), query=query, now=now
            )
        delivery = _record_once(
            subscription=subscription,
            event=event,
            dedupe_key=week,
            payload=payloads[pools],
            next_attempt_at=now,
        )
        if delivery is not None:
            created.append(delivery)
    _send_after_commit(created)
    return created


def _record_once(**fields: Any) -> NotificationDelivery | None:
    """A new pending delivery with `fields` and a fresh message id, or None when the same
    (subscription, dedupe_key) was recorded meanwhile by another process (the unique
    constraint)."""
    try:
        with transaction.atomic():
            return NotificationDelivery.objects.create(message_id=new_message_id(), **fields)
    except IntegrityError:
        return None


def _send_after_commit(created: list[NotificationDelivery]) -> None:
    """Send the deliveries' messages once the transaction commits. robust: a broker outage
    must not undo committed work; the resend sweep sends them later."""
    if created:
        ids = [delivery.pk for delivery in created]
        transaction.on_commit(lambda: _send_delivery_messages(ids), robust=True)


def _send_delivery_messages(delivery_ids: list[int]) -> None:
    """Send one `day0.deliver_notification` message per delivery (default queue)."""
    for delivery_id in delivery_ids:
        worker_task(DELIVER_NOTIFICATION).delay(delivery_id)


# --- delivering ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeliveryOutcome:
    """What one attempt did: `status` is the delivery's status after it ("delivered",
    "pending", "failed", "blocked"), or "skipped" when the attempt did not run (not pending,
    not due, or claimed by another worker). `retry_in_s` (seconds) is set when the delivery
    should be tried again."""

    status: str
    retry_in_s: float | None = None
    reason: str = ""


def retry_countdown_s(*, attempts: int, retry_after_s: float | None = None) -> float:
    """Seconds to wait after the `attempts`-th failed attempt: 10 s x 2**(attempts - 1), or
    the receiver's Retry-After when longer, capped at `RETRY_AFTER_CAP_S`."""
    backoff = float(BACKOFF_BASE_S * 2 ** max(attempts - 1, 0))
    if retry_after_s is not None:
        backoff = max(backoff, min(float(retry_after_s), float(RETRY_AFTER_CAP_S)))
    return backoff


def attempt_time_limit_s() -> int:
    """Seconds an attempt may take at most: connect, write and read timeouts on each address
    tried, and a little more (the delivery task's soft time limit)."""
    return settings.DAY0_NOTIFY_TIMEOUT_S * 3 * outbound_http.MAX_ADDRESSES_TRIED + 10


def _lease_s() -> int:
    """How long (seconds) a claimed attempt keeps other workers off its delivery: past the
    task's hard time limit, so the sweep never re-sends an attempt still under way."""
    return attempt_time_limit_s() + 60


def _claim(delivery_id: int, now: datetime) -> bool:
    """Take one attempt of a pending, due delivery: count it and push `next_attempt_at` out
    by the lease. False when it is not pending, not due yet, or another worker has it."""
    due = Q(next_attempt_at__isnull=True) | Q(
        next_attempt_at__lte=now + timedelta(seconds=DUE_TOLERANCE_S)
    )
    return bool(
        NotificationDelivery.objects.filter(pk=delivery_id, status=Status.PENDING)
        .filter(due)
        .update(
            attempts=F("attempts") + 1,
            next_attempt_at=now + timedelta(seconds=_lease_s()),
        )
    )


def _finish(
    delivery: NotificationDelivery,
    *,
    status: str,
    error: str = "",
    response_status: int | None = None,
    retry_in_s: float | None = None,
) -> DeliveryOutcome:
    now = timezone.now()
    fields: dict[str, Any] = {
        "status": status,
        "last_error": error[:4000],
        "response_status": response_status,
        "next_attempt_at": now + timedelta(seconds=retry_in_s) if retry_in_s is not None else None,
    }
    if status == Status.DELIVERED:
        fields["delivered_at"] = now
    NotificationDelivery.objects.filter(pk=delivery.pk).update(**fields)
    if status == Status.DELIVERED:
        logger.info("Delivered %s (%s)", delivery, delivery.message_id)
    else:
        logger.warning("Notification %s %s: %s", delivery.message_id, status, error)
    return DeliveryOutcome(status=status, retry_in_s=retry_in_s, reason=error)


def _transient(
    delivery: NotificationDelivery,
    *,
    error: str,
    response_status: int | None = None,
    retry_after_s: float | None = None,
) -> DeliveryOutcome:
    """A failure worth another try, unless this was the last attempt allowed."""
    limit = settings.DAY0_NOTIFY_MAX_ATTEMPTS
    if delivery.attempts >= limit:
        return _finish(
            delivery,
            status=Status.FAILED,
            error=f"Gave up after {delivery.attempts} attempts: {error}",
            response_status=response_status,
        )
    countdown = retry_countdown_s(attempts=delivery.attempts, retry_after_s=retry_after_s)
    return _finish(
        delivery,
        status=Status.PENDING,
        error=f"Attempt {delivery.attempts} of {limit}: {error}; next in {countdown:g} s",
        response_status=response_status,
        retry_in_s=countdown,
    )


def notification_deliver(*, delivery_id: int, now: datetime | None = None) -> DeliveryOutcome:
    """Make one attempt at sending a pending delivery that is due (its `next_attempt_at`
    has come), and record the outcome on its row (see the module docstring for the policy).

    Never raises for the receiver's or the network's failures: they are recorded. Returns
    the outcome; `retry_in_s` says when to try again (the task retries then).
    """
    now = now or timezone.now()
    if not _claim(delivery_id, now):
        return DeliveryOutcome(status="skipped", reason="not pending, not due, or claimed")
    delivery = NotificationDelivery.objects.select_related("subscription").get(pk=delivery_id)
    subscription = delivery.subscription
    if not subscription.enabled:
        return _finish(delivery, status=Status.FAILED, error="The subscription is disabled.")
    try:
        secret = (
            secret_decrypt(subscription.secret_ciphertext)
            if subscription.format == NotificationFormat.GENERIC
            else ""
        )
        message = render_message(
            format=subscription.format,
            payload=delivery.payload,
            message_id=delivery.message_id,
            secret=secret,
            timestamp=timezone.now(),
        )
    except (SecretUnreadable, ValueError) as exc:
        return _finish(
            delivery,
            status=Status.FAILED,
            error=f"{exc} (rotate the subscription's signing secret in the admin).",
        )
    try:
        response = outbound_http.post(
            subscription.url,
            body=message.body,
            headers=message.headers,
            allow_private_network=subscription.allow_private_network,
        )
    except outbound_http.OutboundBlocked as exc:
        return _finish(delivery, status=Status.BLOCKED, error=exc.reason)
    except outbound_http.OutboundError as exc:
        return _transient(delivery, error=exc.reason)
    code = response.status_code
    if 200 <= code < 300:
        return _finish(delivery, status=Status.DELIVERED, response_status=code)
    answer = response.body_excerpt.strip()[:300]
    said = f"HTTP {code}: {answer}" if answer else f"HTTP {code}"
    if code in RETRYABLE_STATUS or code >= 500:
        return _transient(
            delivery,
            error=said,
            response_status=code,
            retry_after_s=retry_after_seconds(response.headers),
        )
    if 300 <= code < 400:
        location = response.headers.get("location", "")
        said = f"HTTP {code} redirect to {location or 'nowhere'} not followed; fix the URL"
    return _finish(delivery, status=Status.FAILED, error=said, response_status=code)


def notifications_resend_due(*, now: datetime | None = None) -> int:
    """Send again the message of each pending delivery that fell due more than
    `SWEEP_GRACE_S` seconds ago (its message lost with a broker restart, or its worker lost
    mid-attempt once the claim's lease ran out). A duplicate message is harmless: only one
    attempt claims the row. Returns how many were sent."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=SWEEP_GRACE_S)
    ids = list(
        NotificationDelivery.objects.filter(status=Status.PENDING)
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lt=cutoff))
        .order_by("next_attempt_at", "pk")
        .values_list("pk", flat=True)[:500]
    )
    if ids:
        _send_delivery_messages(ids)
    return len(ids)


def notification_retry_now(*, delivery: NotificationDelivery) -> bool:
    """Try a delivery again now (the admin's "retry now"): a failed or blocked one becomes
    pending again, a pending one is made due now; its message is sent after commit. One that
    had used up its `DAY0_NOTIFY_MAX_ATTEMPTS` gets exactly one more attempt (its count goes
    on). False for a delivered one, which is left alone."""
    with transaction.atomic():
        updated = NotificationDelivery.objects.filter(
            pk=delivery.pk, status__in=[Status.PENDING, Status.FAILED, Status.BLOCKED]
        ).update(status=Status.PENDING, next_attempt_at=timezone.now())
        if not updated:
            return False
        transaction.on_commit(lambda: _send_delivery_messages([delivery.pk]), robust=True)
    return True
