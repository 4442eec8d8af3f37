"""Coalescing Hub uploads: many deliveries for one repo, one job at its last revision.

A large upload reaches the Hub as many commits, each announced by its own delivery. The first
taken delivery for a repo opens a waiting `PendingUpload` (one per endpoint and repo: a
partial unique constraint) and queues `day0.settle_upload` for when the endpoint's quiet
period has passed; each later delivery moves its revision and `last_event_at` on. The settle
task then:

1. waits out the rest of the quiet period if a delivery came meanwhile (reschedules itself);
2. stops, "duplicate", if the revision is a release already (the poller may have found it);
3. asks the hub whether the upload is complete at that revision (`release_at`: config present,
   every indexed shard present); if not, or on a hub error, checks again after
   `DAY0_WEBHOOK_SETTLE_RECHECK_S`, and abandons the upload `DAY0_WEBHOOK_SETTLE_GIVE_UP_S`
   after its last delivery;
4. when complete (and the watch's `job_options` are ones the stages take), claims the
   upload with a conditional update (waiting -> started, at the revision and last event it
   checked), so two settles, or a settle racing a new delivery, never start two jobs; then
   records the release and creates its job (trigger "webhook", the watch's job options, as
   a poll gives them), and links both onto the upload and its deliveries.

Only one check chain runs per upload: a check claims `last_check_at` (conditional update), and
a settle that finds a check made less than half a recheck period ago stops. The periodic
`day0.settle_uploads` sweep re-queues uploads whose chain was lost (a message dropped with a
broker restart).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    DeliveryVerdict,
    HubKind,
    HubWatch,
    ModelRelease,
    PendingUpload,
    Trigger,
    WebhookDelivery,
    WebhookEndpoint,
)
from adaptation.selectors.releases import release_newest_job
from adaptation.services.jobs import job_create
from adaptation.services.releases import release_get_or_create
from adaptation.worker_tasks import SETTLE_UPLOAD, worker_task
from engine.hubs import HubSpec, hub_source
from engine.hubs.base import HubError, HubRateLimited
from engine.registry import job_options_check

logger = logging.getLogger(__name__)

# The sweep re-queues an upload only this long after its chain should have run (seconds), so
# it never races a chain that is merely a little late.
SWEEP_GRACE_S = 60
# Uploads the sweep looks at per round (the oldest first).
SWEEP_LIMIT = 500

Status = PendingUpload.Status


@dataclass(frozen=True)
class SettleOutcome:
    """What one settle did. `status` is the upload's status after it ("waiting", "started",
    "duplicate", "abandoned"), or "skipped" (another settle checked moments ago) or "gone"
    (no such upload). `retry_in_s`: when to settle again (None: nothing more to do)."""

    status: str
    reason: str = ""
    retry_in_s: float | None = None
    job_id: int | None = None


def pending_upload_record(
    *,
    endpoint: WebhookEndpoint,
    watch: HubWatch | None,
    pool: AcceleratorPool,
    hub_endpoint: str,
    repo_id: str,
    revision: str,
    at: datetime,
) -> tuple[PendingUpload, bool]:
    """Open the waiting upload of `repo_id` on `endpoint`, or move the open one on to
    `revision` (`last_event_at` = `at`, one more delivery). Returns it and whether it was
    opened. Safe under races: the partial unique constraint admits one waiting row per repo,
    and the loser of an insert race updates the winner's row. Call inside a transaction."""
    waiting = PendingUpload.objects.filter(
        endpoint=endpoint, repo_id=repo_id, status=Status.WAITING
    )
    for _ in range(3):
        if waiting.update(revision=revision, last_event_at=at, deliveries=F("deliveries") + 1):
            return waiting.get(), False
        try:
            with transaction.atomic():
                upload = PendingUpload.objects.create(
                    endpoint=endpoint,
                    watch=watch,
                    pool=pool,
                    hub_endpoint=hub_endpoint,
                    repo_id=repo_id,
                    revision=revision,
                    first_event_at=at,
                    last_event_at=at,
                )
            return upload, True
        except IntegrityError:
            continue  # another delivery opened it meanwhile: move that one on
    raise IntegrityError(f"could not open or update the pending upload of {repo_id}")


def pending_upload_schedule(*, pending_upload_id: int, countdown_s: float) -> None:
    """Queue `day0.settle_upload` for the upload in `countdown_s` seconds, once the current
    transaction commits (robust: a broker outage leaves it to the periodic sweep)."""
    countdown = max(0.0, float(countdown_s))

    def send() -> None:
        worker_task(SETTLE_UPLOAD).apply_async(args=[pending_upload_id], countdown=countdown)

    transaction.on_commit(send, robust=True)


def pending_upload_deliveries(upload: PendingUpload) -> QuerySet[WebhookDelivery]:
    """The deliveries that fed `upload`: its endpoint's coalescing deliveries for the repo
    since its first event that point at nothing yet (one waiting upload per repo at a time,
    so these are its own)."""
    return WebhookDelivery.objects.filter(
        endpoint_id=upload.endpoint_id,
        repo_id=upload.repo_id,
        verdict=DeliveryVerdict.COALESCING,
        received_at__gte=upload.first_event_at,
        release__isnull=True,
        job__isnull=True,
    )


def _still_as_read(upload: PendingUpload) -> QuerySet[PendingUpload]:
    """The upload if it is still waiting at the revision and last event it was read with."""
    return PendingUpload.objects.filter(
        pk=upload.pk,
        status=Status.WAITING,
        revision=upload.revision,
        last_event_at=upload.last_event_at,
    )


def _finish(
    upload: PendingUpload,
    *,
    status: str,
    release: ModelRelease | None,
    job: AdaptationJob | None,
    error: str = "",
) -> None:
    PendingUpload.objects.filter(pk=upload.pk).update(
        status=status, release=release, job=job, last_check_error=error
    )
    if release is not None:
        pending_upload_deliveries(upload).update(release=release, job=job)


def pending_upload_settle(*, pending_upload_id: int, now: datetime | None = None) -> SettleOutcome:
    """Settle one pending upload as the module describes: wait, recheck, abandon, or start
    its one job. Hub errors are recorded on the upload (`last_check_error`) and retried, not
    raised; database errors propagate (the task fails and the sweep queues it again)."""
    now = now or timezone.now()
    upload = (
        PendingUpload.objects.select_related("endpoint", "pool", "watch")
        .filter(pk=pending_upload_id)
        .first()
    )
    if upload is None:
        return SettleOutcome("gone", f"no pending upload {pending_upload_id}")
    if upload.status != Status.WAITING:
        return SettleOutcome(upload.status, "settled already", job_id=upload.job_id)
    label = f"{upload.repo_id}@{upload.revision[:12]}"
    quiet_left_s = upload.endpoint.quiet_period_s - (now - upload.last_event_at).total_seconds()
    if quiet_left_s > 0:
        return SettleOutcome(
            Status.WAITING, f"{label}: a delivery came in the quiet period", quiet_left_s
        )

    existing = ModelRelease.objects.filter(
        hub_kind=HubKind.HUGGINGFACE,
        hub_endpoint=upload.hub_endpoint,
        repo_id=upload.repo_id,
        revision=upload.revision,
    ).first()
    if existing is not None:
        with transaction.atomic():
            if not _still_as_read(upload).update(status=Status.DUPLICATE):
                return SettleOutcome("skipped", f"{label}: changed while settling")
            job = release_newest_job(existing)
            _finish(upload, status=Status.DUPLICATE, release=existing, job=job)
        return SettleOutcome(
            Status.DUPLICATE, f"{label} is a release already", job_id=job and job.pk
        )

    recheck_s = settings.DAY0_WEBHOOK_SETTLE_RECHECK_S
    # Claim this check: a second chain (the sweep's, a redelivered message) stops here.
    claimed = (
        PendingUpload.objects.filter(pk=upload.pk, status=Status.WAITING)
        .filter(
            Q(last_check_at__isnull=True)
            | Q(last_check_at__lte=now - timedelta(seconds=recheck_s / 2))
        )
        .update(last_check_at=now, checks=F("checks") + 1)
    )
    if not claimed:
        return SettleOutcome("skipped", f"{label}: checked moments ago by another settle")

    problem, retry_in_s, published_at = "", float(recheck_s), None
    try:
        spec = HubSpec(kind=HubKind.HUGGINGFACE, endpoint=upload.hub_endpoint)
        candidate = hub_source(spec).release_at(upload.repo_id, upload.revision)
    except HubError as exc:
        problem = exc.message
        if isinstance(exc, HubRateLimited):
            retry_in_s = max(retry_in_s, exc.retry_after_s)
    else:
        problem = "" if candidate.complete else f"upload not complete: {candidate.reason}"
        published_at = candidate.published_at
    options: dict | None = None
    if not problem and upload.watch is not None and upload.watch.job_options:
        # The watch's stage options, as the poller gives its jobs; refused ones (edited
        # outside the admin's check) wait here, so fixing the watch lets the upload through.
        try:
            options = job_options_check(options=upload.watch.job_options)
        except ValueError as exc:
            problem = f"watch {upload.watch.name!r} has job options the stages refuse: {exc}"

    if problem:
        quiet_for_s = (now - upload.last_event_at).total_seconds()
        if quiet_for_s >= settings.DAY0_WEBHOOK_SETTLE_GIVE_UP_S:
            reason = f"given up {int(quiet_for_s)} s after the last delivery: {problem}"
            if _still_as_read(upload).update(status=Status.ABANDONED, last_check_error=reason):
                logger.warning("Pending upload %s abandoned: %s", label, reason)
                return SettleOutcome(Status.ABANDONED, reason)
            return SettleOutcome("skipped", f"{label}: changed while settling")
        PendingUpload.objects.filter(pk=upload.pk, status=Status.WAITING).update(
            last_check_error=problem
        )
        return SettleOutcome(Status.WAITING, f"{label}: {problem}", retry_in_s)

    with transaction.atomic():
        # The claim that makes the job start once: still waiting at what was checked.
        if not _still_as_read(upload).update(status=Status.STARTED):
            current = PendingUpload.objects.filter(pk=upload.pk).values_list("status", flat=True)
            if current.first() == Status.WAITING:  # a newer delivery: its quiet period first
                # Not sooner than the claim spacing, or the next settle would find this
                # check too recent and stop the chain.
                retry_in_s = max(float(upload.endpoint.quiet_period_s), recheck_s / 2)
                return SettleOutcome(
                    Status.WAITING,
                    f"{label}: a newer delivery arrived during the check",
                    retry_in_s,
                )
            return SettleOutcome("skipped", f"{label}: settled by another settle")
        release, created = release_get_or_create(
            hub_kind=HubKind.HUGGINGFACE,
            hub_endpoint=upload.hub_endpoint,
            repo_id=upload.repo_id,
            revision=upload.revision,
            published_at=published_at,
            found_by=Trigger.WEBHOOK,
            watch=upload.watch,
        )
        if not created:  # the poller (or a generic delivery) recorded it during the check
            job = release_newest_job(release)
            _finish(upload, status=Status.DUPLICATE, release=release, job=job)
            return SettleOutcome(
                Status.DUPLICATE, f"{label} is a release already", job_id=job and job.pk
            )
        job = job_create(
            release=release, pool=upload.pool, trigger=Trigger.WEBHOOK, options=options
        )
        _finish(upload, status=Status.STARTED, release=release, job=job)
    logger.info("Pending upload %s settled: job %s", label, job.pk)
    return SettleOutcome(Status.STARTED, f"{label}: job {job.pk} started", job_id=job.pk)


def pending_uploads_sweep(*, now: datetime | None = None) -> list[int]:
    """Queue a settle for every waiting upload whose settle chain looks lost: its quiet
    period (and, once checked, its recheck period) ended more than `SWEEP_GRACE_S` ago.
    Returns their ids. An upload past its give-up time is queued too, so it is abandoned."""
    now = now or timezone.now()
    recheck = timedelta(seconds=settings.DAY0_WEBHOOK_SETTLE_RECHECK_S)
    grace = timedelta(seconds=SWEEP_GRACE_S)
    due: list[int] = []
    waiting = (
        PendingUpload.objects.filter(status=Status.WAITING, last_event_at__lte=now - grace)
        .select_related("endpoint")
        .order_by("last_event_at")[:SWEEP_LIMIT]
    )
    for upload in waiting:
        quiet = timedelta(seconds=upload.endpoint.quiet_period_s)
        if now < upload.last_event_at + quiet + grace:
            continue
        if upload.last_check_at is not None and now < upload.last_check_at + recheck + grace:
            continue
        due.append(upload.pk)
        pending_upload_schedule(pending_upload_id=upload.pk, countdown_s=0)
    return due
