"""Reads of accelerator pools by name and state, and of their software stacks (a pool's live
inventory, its workers and queue, is `selectors.inventory`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db.models import F, QuerySet, Window
from django.db.models.functions import RowNumber

from adaptation.models import AcceleratorPool, StackChange, Worker
from adaptation.selectors.workers import live_cutoff, serves


def pools_enabled() -> QuerySet[AcceleratorPool]:
    """The enabled pools, by name."""
    return AcceleratorPool.objects.filter(enabled=True).order_by("name")


def pool_by_name(name: str) -> AcceleratorPool | None:
    """The pool called `name`, or None."""
    return AcceleratorPool.objects.filter(name=name).first()


# --- software stacks ------------------------------------------------------------------------

# How many of a pool's latest stack changes the pools page lists.
STACK_CHANGES_SHOWN = 3


def worker_pool_stack(software: Mapping[str, Any] | None, pool_name: str) -> dict[str, Any] | None:
    """The stack a worker serves pool `pool_name` with, from its `Worker.software` (as
    `workers.stack.worker_stack` reported it): {"torch": ..., "driver": ..., "engine": the
    pool's engine versions, {} for a pool without engine}. None for a worker that reported
    no stack (one of an older day0, or not yet beaten with one)."""
    if not isinstance(software, Mapping) or not isinstance(software.get("engines"), Mapping):
        return None
    engine = software["engines"].get(pool_name)
    return {
        "torch": software.get("torch"),
        "driver": software.get("driver"),
        "engine": dict(engine) if isinstance(engine, Mapping) else {},
    }


def pool_stack_speaker(pool: AcceleratorPool, *, now: datetime | None = None) -> Worker | None:
    """The worker whose stack is the pool's (see `adaptation.services.stacks`): of the live
    workers serving `pool` that report a stack, the one started last (ties: the greater
    name). None when no live worker reports one. One query."""
    candidates = Worker.objects.filter(
        stopped_at__isnull=True, last_heartbeat_at__gte=live_cutoff(now)
    ).only("name", "queues", "started_at", "software")
    reporting = [
        worker
        for worker in candidates
        if serves(worker, pool) and worker_pool_stack(worker.software, pool.name) is not None
    ]
    return max(reporting, key=lambda w: (w.started_at, w.name), default=None)


def recent_stack_changes(
    pool_ids: Iterable[int], *, per_pool: int = STACK_CHANGES_SHOWN
) -> dict[int, list[StackChange]]:
    """Pool id -> its latest `per_pool` stack changes, newest first (each pool of `pool_ids`
    present, [] when it has none). One query for any number of pools."""
    ids = list(pool_ids)
    changes: dict[int, list[StackChange]] = {pk: [] for pk in ids}
    ranked = (
        StackChange.objects.filter(pool_id__in=ids)
        .annotate(
            rank=Window(
                RowNumber(),
                partition_by=F("pool_id"),
                order_by=[F("detected_at").desc(), F("id").desc()],
            )
        )
        .filter(rank__lte=per_pool)
        .order_by("pool_id", "-detected_at", "-id")
    )
    for change in ranked:
        changes[change.pool_id].append(change)
    return changes
