"""Celery tasks: thin wrappers that take ids and call the runner or a service."""

from __future__ import annotations

import socket

from celery import shared_task

from adaptation.notifications import services as notification_services
from adaptation.services.hub_polling import hub_watches_poll
from adaptation.services.stage_runs import stage_runs_reap_stale, stage_runs_resend_queued
from adaptation.webhooks import deliveries, uploads
from workers.broker_watch import messages_lost
from workers.runner import execute_stage_run

MAX_STAGE_RETRIES = 5


@shared_task(
    bind=True,
    max_retries=MAX_STAGE_RETRIES,
    name="day0.run_stage",
    # In the worker's main process: records a pool child killed mid-stage (SIGKILL, OOM) or
    # at the hard time limit, and queues the run again (workers/requests.py).
    Request="workers.requests:StageRequest",
)
def run_stage(self, stage_run_id: int) -> str:
    """Run one stage attempt (acks late, rejected back to the queue if the worker is lost:
    see the CELERY_TASK_* settings; a lost attempt is queued again by `StageRequest` or the
    reaper, docs/operations.md "Lost work and retries").

    A transient error (network, hub 429) retries after max(10 s * 2**retries, the hub's
    Retry-After): 10, 20, 40, 80, 160 s; the sixth transient error fails the stage with its
    reason. A stage's own failure is stored on its run and never retried.
    """
    outcome = execute_stage_run(
        stage_run_id,
        task_id=self.request.id or "",
        final_try=self.request.retries >= MAX_STAGE_RETRIES,
        worker_host=self.request.hostname or socket.gethostname(),
    )
    if outcome.status == "retry":
        backoff = 2 ** (self.request.retries + 1) * 5
        countdown = max(backoff, outcome.retry_after_s or 0)
        raise self.retry(countdown=countdown)
    return outcome.status


@shared_task(name="day0.poll_hubs", soft_time_limit=300, time_limit=360)
def poll_hubs() -> dict[str, int]:
    """Periodic: poll every watch whose interval has run out."""
    outcomes = hub_watches_poll(due_only=True)
    return {
        "watches": len(outcomes),
        "new_releases": sum(len(o.new_releases) for o in outcomes),
        "errors": sum(1 for o in outcomes if o.error),
    }


@shared_task(name="day0.reap_stale_stage_runs")
def reap_stale_stage_runs() -> dict[str, int]:
    """Periodic (every DAY0_REAP_EVERY_S): queue again the stages whose worker stopped sending
    heartbeats (or fail those out of attempts), and send again the messages the broker does
    not hold: unsent ones (it was down), all queued ones when it lost its messages
    (`broker_watch.messages_lost`), and any queued too long."""
    reaped = stage_runs_reap_stale()
    return {**reaped, "resent": stage_runs_resend_queued(broker_lost=messages_lost())}


@shared_task(
    bind=True,
    name="day0.deliver_notification",
    acks_late=True,
    max_retries=None,  # the delivery row counts attempts (DAY0_NOTIFY_MAX_ATTEMPTS)
    soft_time_limit=notification_services.attempt_time_limit_s(),
    time_limit=notification_services.attempt_time_limit_s() + 30,
)
def deliver_notification(self, delivery_id: int) -> str:
    """One attempt at sending a notification (default queue). A 408/429/5xx or network
    error retries after the backoff the delivery row records (10 s x 2**n, or a longer
    Retry-After); other outcomes are final. See `notification_deliver`."""
    outcome = notification_services.notification_deliver(delivery_id=delivery_id)
    if outcome.retry_in_s is not None:
        raise self.retry(countdown=outcome.retry_in_s)
    return outcome.status


@shared_task(name="day0.weekly_summary", soft_time_limit=120, time_limit=180)
def weekly_summary() -> dict[str, int]:
    """Periodic (Mondays 08:00 UTC): the last 7 days' report summary to the subscriptions
    that take "report.weekly", once a week each (`report_weekly_send`)."""
    return {"deliveries": len(notification_services.report_weekly_send())}


@shared_task(name="day0.resend_notifications", soft_time_limit=60, time_limit=90)
def resend_notifications() -> dict[str, int]:
    """Periodic: send again the messages of pending notifications past due (lost ones)."""
    return {"resent": notification_services.notifications_resend_due()}


@shared_task(name="day0.settle_upload", soft_time_limit=120, time_limit=180)
def settle_upload(pending_upload_id: int) -> str:
    """Settle one coalesced Hub upload (`adaptation.webhooks.uploads.pending_upload_settle`):
    start its one job once quiet and complete, else queue itself again when it says to."""
    outcome = uploads.pending_upload_settle(pending_upload_id=pending_upload_id)
    if outcome.retry_in_s is not None:
        uploads.pending_upload_schedule(
            pending_upload_id=pending_upload_id, countdown_s=outcome.retry_in_s
        )
    return outcome.status


@shared_task(name="day0.settle_uploads")
def settle_uploads() -> dict[str, int]:
    """Periodic: queue a settle for each waiting Hub upload whose settle chain was lost."""
    return {"queued": len(uploads.pending_uploads_sweep())}


@shared_task(name="day0.prune_webhook_deliveries", soft_time_limit=300, time_limit=360)
def prune_webhook_deliveries() -> dict[str, int]:
    """Periodic (daily): delete webhook deliveries older than
    `DAY0_WEBHOOK_DELIVERY_RETENTION_DAYS` that started nothing (`webhook_deliveries_prune`)."""
    return {"deleted": deliveries.webhook_deliveries_prune()}
