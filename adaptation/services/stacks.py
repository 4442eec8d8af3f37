"""Pools' software stacks as their workers report them, and the stack upgrades they make.

A worker reports the stack it serves with at registration and in every heartbeat
(`workers.stack.worker_stack`: torch, the accelerator driver, each of its pools' serving
engine versions); `worker_stack_record` keeps it in `Worker.software` and reports, for each
pool the worker serves, the stack it serves that pool with (`selectors.pools.
worker_pool_stack`: {"torch", "driver", "engine"}) to `pool_stack_report`.

A pool's stack (`AcceleratorPool.stack`) is what its **newest live worker** reports: of the
live workers serving it that report a stack, the one started last (`selectors.pools.
pool_stack_speaker`). Reports of the other workers are kept on their rows (the pools page
shows where they differ) and change nothing. So during a rolling upgrade the pool moves once,
when the first upgraded worker starts, and does not flap while old and new workers beat side
by side; it moves back only if the upgraded workers all go and an older one speaks again
(then it does serve with the older stack, and that is a change too).

A change of the pool's stack is a `StackChange`. The first stack a pool ever reports is
recorded with an empty `previous` and starts nothing; any later change is a **stack
upgrade**: it starts the standard suite on the pool (`services.suites.suite_start`, trigger
"stack-upgrade"), linked from the change.

Two workers of a pool beating at once do not record one change twice: the pool's row is
locked (`select_for_update`) and its stack compared again inside the transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.utils import timezone

from adaptation.models import AcceleratorPool, StackChange, SuiteRun, SuiteTrigger, Worker
from adaptation.selectors.pools import pool_stack_speaker, worker_pool_stack
from adaptation.services.errors import ServiceError

logger = logging.getLogger(__name__)

# The suite a stack upgrade re-runs on the pool.
UPGRADE_SUITE = "standard"
# The longest version text kept (a version is short; anything longer is not one).
MAX_VERSION_CHARS = 128


def _version(value: Any) -> str | None:
    """A version as stored: text of at most `MAX_VERSION_CHARS`, or None (unknown)."""
    if value is None or isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    text = str(value).strip()
    return text[:MAX_VERSION_CHARS] or None


def _versions(value: Any) -> dict[str, str | None]:
    """A {name: version} map as stored: names as text, versions through `_version`."""
    if not isinstance(value, Mapping):
        return {}
    return {str(name)[:64]: _version(version) for name, version in value.items()}


def stack_fields(stack: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a worker's `stack` (`workers.stack.worker_stack`) as `Worker.software`
    keeps them: "torch" (a version or None), "driver" (None: the worker has no accelerator;
    else {name: version}, only known versions) and "engines" ({pool name: {name: version or
    None}}). Anything else is left out."""
    driver = stack.get("driver")
    engines = stack.get("engines")
    return {
        "torch": _version(stack.get("torch")),
        "driver": None
        if not isinstance(driver, Mapping)
        else {k: v for k, v in _versions(driver).items() if v is not None},
        "engines": {}
        if not isinstance(engines, Mapping)
        else {str(pool)[:64]: _versions(versions) for pool, versions in engines.items()},
    }


def _start_upgrade_suite(pool: AcceleratorPool) -> SuiteRun | None:
    """The standard suite started on `pool` for a stack upgrade, inside the caller's
    transaction (its jobs are enqueued when that commits). None when the suite refuses to
    start (a `ServiceError`: logged; the change stays recorded)."""
    from adaptation.services.suites import suite_start  # the suite module imports much

    try:
        with transaction.atomic():  # a savepoint: a refused suite leaves nothing half made
            return suite_start(pool=pool, trigger=SuiteTrigger.STACK_UPGRADE, suite=UPGRADE_SUITE)
    except ServiceError as exc:
        logger.warning(
            "Stack upgrade on pool %s: the %s suite did not start: %s",
            pool.name,
            UPGRADE_SUITE,
            exc,
        )
        return None


def pool_stack_report(
    *, pool: AcceleratorPool, worker_name: str, stack: Mapping[str, Any]
) -> StackChange | None:
    """Worker `worker_name` serves `pool` with `stack` ({"torch", "driver", "engine"}, as
    `selectors.pools.worker_pool_stack` gives it). When it is the pool's speaker (its newest
    live worker reporting a stack; any reporter when none is live) and `stack` differs from
    the pool's: the pool's stack becomes `stack` and the change is recorded, the first of a
    pool with an empty `previous` and nothing started, any later one starting the standard
    suite on the pool (`StackChange.suite_run`). Returns the change, or None when nothing
    changed or the worker does not speak for the pool. `pool.stack` is updated in place."""
    current = dict(stack)
    if pool.stack == current:
        return None
    speaker = pool_stack_speaker(pool)
    if speaker is not None and speaker.name != worker_name:
        return None  # an older worker of a pool in a rolling upgrade: kept on its row only
    with transaction.atomic():
        locked = AcceleratorPool.objects.select_for_update().get(pk=pool.pk)
        previous = dict(locked.stack or {})
        if previous == current:  # another beat recorded it first
            pool.stack = previous
            return None
        locked.stack = current
        locked.save(update_fields=["stack"])
        change = StackChange.objects.create(
            pool=locked,
            worker_name=worker_name[:255],
            detected_at=timezone.now(),
            previous=previous,
            current=current,
        )
        if previous:
            change.suite_run = _start_upgrade_suite(locked)
            if change.suite_run is not None:
                change.save(update_fields=["suite_run"])
    pool.stack = current
    logger.info(
        "Pool %s: stack %s by %s",
        pool.name,
        "upgraded" if previous else "first reported",
        worker_name,
    )
    return change


def worker_stack_record(*, worker: Worker, stack: Mapping[str, Any]) -> list[StackChange]:
    """Keep the stack `worker` reports (`stack_fields`, in its `software` beside the python
    and celery versions) and report it to each pool the worker serves (`pool_stack_report`).
    The changes it made, usually none. A beat with an unchanged stack costs one query (the
    worker's pools) when nothing changed."""
    software = {**(worker.software or {}), **stack_fields(stack)}
    if software != worker.software:
        worker.software = software
        worker.save(update_fields=["software"])
    changes: list[StackChange] = []
    for pool in AcceleratorPool.objects.filter(queue__in=list(worker.queues or [])):
        reported = worker_pool_stack(software, pool.name)
        if reported is None or reported == pool.stack:
            continue
        change = pool_stack_report(pool=pool, worker_name=worker.name, stack=reported)
        if change is not None:
            changes.append(change)
    return changes


__all__ = ["pool_stack_report", "stack_fields", "worker_stack_record"]
