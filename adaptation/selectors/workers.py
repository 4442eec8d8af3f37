"""Reads of the worker processes: which are live, and which pools none serves."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from adaptation.models import AcceleratorPool, Worker


def live_cutoff(now: datetime | None = None) -> datetime:
    """The oldest heartbeat a live worker may have at `now`."""
    return (now or timezone.now()) - timedelta(seconds=settings.DAY0_WORKER_STALE_S)


def serves(worker: Worker, pool: AcceleratorPool) -> bool:
    """Whether `worker` takes tasks from `pool`'s queue."""
    return pool.queue in (worker.queues or [])


def worker_state(worker: Worker, *, now: datetime | None = None) -> str:
    """The worker's state at `now`: "live", "stale" (no heartbeat for `DAY0_WORKER_STALE_S`
    seconds) or "stopped"."""
    if worker.stopped_at is not None:
        return "stopped"
    return "live" if worker.last_heartbeat_at >= live_cutoff(now) else "stale"


def live_workers(pool: AcceleratorPool, *, now: datetime | None = None) -> list[Worker]:
    """The workers serving `pool` that are live at `now` (default: now), by name."""
    candidates = Worker.objects.filter(
        stopped_at__isnull=True, last_heartbeat_at__gte=live_cutoff(now)
    )
    return [worker for worker in candidates if serves(worker, pool)]


def pools_without_live_worker(*, now: datetime | None = None) -> dict[int, AcceleratorPool]:
    """Every pool no live worker serves, by id: two queries, whatever the number of pools
    (for pages that mark queued stages as waiting)."""
    queues: set[str] = set()
    live = Worker.objects.filter(stopped_at__isnull=True, last_heartbeat_at__gte=live_cutoff(now))
    for worker_queues in live.values_list("queues", flat=True):
        queues.update(worker_queues or [])
    return {pool.pk: pool for pool in AcceleratorPool.objects.all() if pool.queue not in queues}
