"""Celery tasks: thin wrappers that take ids and call the runner or a service."""

from __future__ import annotations

from celery import shared_task

from adaptation import services
from workers.runner import execute_stage_run

MAX_STAGE_RETRIES = 5


@shared_task(
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=MAX_STAGE_RETRIES,
    name="day0.run_stage",
)
def run_stage(self, stage_run_id: int) -> str:
    """Run one stage attempt; retry with exponential backoff on transient errors only."""
    outcome = execute_stage_run(
        stage_run_id,
        task_id=self.request.id or "",
        final_try=self.request.retries >= MAX_STAGE_RETRIES,
    )
    if outcome.status == "retry":
        backoff = 2 ** (self.request.retries + 1) * 5
        countdown = max(backoff, outcome.retry_after_s or 0)
        raise self.retry(countdown=countdown)
    return outcome.status


@shared_task(name="day0.poll_hubs", acks_late=True, soft_time_limit=300, time_limit=360)
def poll_hubs() -> dict[str, int]:
    """Periodic: poll every watch whose interval has run out."""
    outcomes = services.hub_watches_poll(due_only=True)
    return {
        "watches": len(outcomes),
        "new_releases": sum(len(o.new_releases) for o in outcomes),
        "errors": sum(1 for o in outcomes if o.error),
    }


@shared_task(name="day0.reap_stale_stage_runs", acks_late=True)
def reap_stale_stage_runs() -> int:
    """Periodic: fail stages whose worker stopped sending heartbeats."""
    return services.stage_runs_reap_stale()
