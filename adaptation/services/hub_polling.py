"""Hub watches: poll a hub, create releases and their jobs, record what went wrong."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import F
from django.utils import timezone

from adaptation.models import (
    HubKind,
    HubWatch,
    Trigger,
)
from adaptation.services.errors import ServiceError
from adaptation.services.pools import pool_get
from adaptation.services.releases import release_from_candidate
from engine.hubs import HubSpec, canonical_endpoint, hub_source
from engine.hubs.base import HubError, HubRateLimited

logger = logging.getLogger(__name__)


@dataclass
class WatchPollOutcome:
    """What one poll of one watch did."""

    watch: str
    new_releases: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    error: str = ""
    skipped_until: datetime | None = None


def hub_spec_for_watch(watch: HubWatch) -> HubSpec:
    """The plain hub description a source needs, from a watch row."""
    return HubSpec(
        kind=watch.kind,
        endpoint=watch.endpoint,
        author=watch.author,
        repo_pattern=watch.repo_pattern,
    )


_WATCH_POLL_FIELDS = [
    "last_polled_at",
    "last_success_at",
    "last_error",
    "consecutive_failures",
    "next_poll_at",
]


def hub_watch_poll(*, watch: HubWatch, now: datetime | None = None) -> WatchPollOutcome:
    """List the watch's hub once; create a release and a job for each complete new revision.

    A watch whose endpoint the rules refuse (`HubWatch.endpoint_refusal`: not a configured
    hub, an internal address, a folder outside the mirror roots) is not polled: that is
    recorded as its failure, before any request. Any failure (a hub error, an unreadable
    mirror, a disabled pool, a database or broker error) is recorded on the watch (message,
    failure count) and pushes its next poll out exponentially from its interval (at least
    the hub's Retry-After on 429), capped at `DAY0_MAX_BACKOFF_S`. Nothing is raised, except
    Celery's soft time limit. Every poll adds one to exactly one of the watch's counters:
    `polls_succeeded`, `polls_rate_limited` (the hub answered 429) or `polls_failed` (any
    other failure or refusal).
    """
    now = now or timezone.now()
    outcome = WatchPollOutcome(watch=watch.name)
    watch.last_polled_at = now
    try:
        if not watch.pool.enabled:
            raise ServiceError(f"pool {watch.pool.name!r} is disabled; enable it or pick another.")
        # Again at each poll: a row saved before the rule, or changed in the database.
        refusal = watch.endpoint_refusal()
        if refusal:
            raise ServiceError(f"endpoint refused: {refusal}")
        spec = hub_spec_for_watch(watch)
        candidates = hub_source(spec).list_releases()
        endpoint = canonical_endpoint(spec)
        for candidate in candidates:
            if not candidate.complete:
                outcome.incomplete.append(f"{candidate.repo_id}: {candidate.reason}")
                continue
            if release_from_candidate(
                candidate=candidate,
                hub_kind=watch.kind,
                hub_endpoint=endpoint,
                found_by=Trigger.POLL,
                pool=watch.pool,
                watch=watch,
                options=watch.job_options or None,
                seen_at=now,
            ):
                outcome.new_releases.append(f"{candidate.repo_id}@{candidate.revision[:12]}")
    except Exception as exc:  # one bad watch must not stop the round or loop without backoff
        _watch_record_failure(watch=watch, exc=exc, now=now, outcome=outcome)
        if isinstance(exc, SoftTimeLimitExceeded):
            raise
        return outcome
    watch.consecutive_failures = 0
    watch.last_error = ""
    watch.last_success_at = now
    watch.next_poll_at = now + timedelta(seconds=watch.poll_interval_s)
    watch.save(update_fields=_WATCH_POLL_FIELDS)
    _watch_count_poll(watch=watch, counter="polls_succeeded")
    return outcome


def _watch_count_poll(*, watch: HubWatch, counter: str) -> None:
    """Add one to the watch's poll counter `counter` (`polls_succeeded`, `polls_rate_limited`
    or `polls_failed`: /metrics's `day0_hub_polls_total`) in the database, atomically: two
    rounds polling the same watch at once both count."""
    HubWatch.objects.filter(pk=watch.pk).update(**{counter: F(counter) + 1})


def _watch_record_failure(
    *, watch: HubWatch, exc: Exception, now: datetime, outcome: WatchPollOutcome
) -> None:
    if isinstance(exc, HubError):
        message = exc.message
    elif isinstance(exc, ServiceError | ValueError):
        message = str(exc)
    else:
        logger.exception("Polling %s crashed", watch.name)
        message = f"{type(exc).__name__}: {exc}"
    watch.consecutive_failures += 1
    backoff = min(
        watch.poll_interval_s * 2**watch.consecutive_failures, settings.DAY0_MAX_BACKOFF_S
    )
    if isinstance(exc, HubRateLimited):
        backoff = max(backoff, exc.retry_after_s)
    watch.next_poll_at = now + timedelta(seconds=backoff)
    watch.last_error = f"{now:%Y-%m-%d %H:%M:%S} UTC: {message} (next try in {int(backoff)} s)"
    watch.save(update_fields=_WATCH_POLL_FIELDS)
    _watch_count_poll(
        watch=watch,
        counter="polls_rate_limited" if isinstance(exc, HubRateLimited) else "polls_failed",
    )
    outcome.error = message
    logger.warning("Polling %s failed: %s", watch.name, message)


def demo_hub_install(*, hub_dir: str, username: str, password: str) -> HubWatch:
    """The `demo-hub` watch on a mirror folder, polled every minute by the `cpu` pool, and a
    staff login to see it: what `make run` shows a newcomer. Both are created once; changes
    made later in the admin (or a new password) are kept on the next `make run`."""
    watch, _ = HubWatch.objects.get_or_create(
        name="demo-hub",
        defaults={
            "kind": HubKind.MIRROR,
            "endpoint": hub_dir,
            "pool": pool_get(name="cpu"),
            "poll_interval_s": 60,
            "enabled": True,
        },
    )
    user, created = get_user_model().objects.get_or_create(
        username=username, defaults={"is_staff": True, "is_superuser": True}
    )
    if created:
        user.set_password(password)
        user.save(update_fields=["password"])
    return watch


def hub_watches_poll(
    *, due_only: bool, force: bool = False, now: datetime | None = None
) -> list[WatchPollOutcome]:
    """One polling round over the enabled watches.

    `due_only` (the periodic task) skips watches whose interval has not run out. A watch
    backing off after a hub error (429 included) is skipped until its next try unless
    `force`; skipped watches are reported with the time they are due.
    """
    now = now or timezone.now()
    outcomes = []
    for watch in HubWatch.objects.filter(enabled=True).select_related("pool"):
        waiting = watch.next_poll_at is not None and watch.next_poll_at > now
        backing_off = waiting and watch.consecutive_failures > 0
        if waiting and (due_only or (backing_off and not force)):
            outcomes.append(WatchPollOutcome(watch=watch.name, skipped_until=watch.next_poll_at))
            continue
        outcomes.append(hub_watch_poll(watch=watch, now=now))
    return outcomes
