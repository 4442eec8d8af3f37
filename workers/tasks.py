"""Celery tasks: thin wrappers that take ids and call the runner or a service."""

from __future__ import annotations

import socket

from celery import shared_task

from adaptation import services
from workers.runner import execute_stage_run

MAX_STAGE_RETRIES = 5


@shared_task(bind=True, max_retries=MAX_STAGE_RETRIES, name="day0.run_stage")
def run_stage(self, stage_run_id: int) -> str:
    """Run one stage attempt (acks late, rejected back to the queue if the worker is lost:
    see the CELERY_TASK_* settings).

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
    outcomes = services.hub_watches_poll(due_only=True)
    return {
        "watches": len(outcomes),
        "new_releases": sum(len(o.new_releases) for o in outcomes),
        "errors": sum(1 for o in outcomes if o.error),
    }


@shared_task(name="day0.reap_stale_stage_runs")
def reap_stale_stage_runs() -> dict[str, int]:
    """Periodic: fail stages whose worker stopped sending heartbeats, and send again the
    messages of stages left queued too long."""
    return {
        "failed": services.stage_runs_reap_stale(),
        "resent": services.stage_runs_resend_queued(),
    }
