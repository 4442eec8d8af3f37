"""Worker processes as they register, beat and stop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.utils import timezone

from adaptation.models import (
    Worker,
)
from adaptation.services.errors import ServiceError
from adaptation.services.stacks import stack_fields, worker_stack_record

# What a worker may say about itself (`workers.pools.describe_this_worker`); other keys are
# ignored.
_WORKER_FIELDS = ("hostname", "pid", "queues", "backend", "devices", "cpu_cores", "memory_bytes")


def worker_register(*, name: str, description: dict[str, Any]) -> Worker:
    """Record the Celery worker `name` ("cpu@host") as started now, with what it described
    about itself: hostname, pid, queue names, torch backend, devices
    ([{"index", "name", "memory_bytes", "type"}]), cpu_cores, memory_bytes (bytes),
    software versions and the stack it serves with (`stack`: kept in `software` and
    reported to its pools, `services.stacks.worker_stack_record`). A worker restarted under
    the same name takes over its row (stopped no more). Raises `ServiceError` for a blank
    name.
    """
    if not name.strip():
        raise ServiceError("A worker needs its Celery node name to register.")
    now = timezone.now()
    defaults: dict[str, Any] = {key: description.get(key) for key in _WORKER_FIELDS}
    defaults["hostname"] = str(defaults["hostname"] or name.partition("@")[2] or name)[:255]
    defaults["backend"] = str(defaults["backend"] or "")[:32]
    defaults["queues"] = [str(q) for q in defaults["queues"] or []]
    defaults["devices"] = list(defaults["devices"] or [])
    defaults["software"] = dict(description.get("software") or {})
    stack = description.get("stack")
    if isinstance(stack, Mapping):
        defaults["software"].update(stack_fields(stack))
    defaults.update(started_at=now, last_heartbeat_at=now, stopped_at=None)
    worker, _ = Worker.objects.update_or_create(name=name[:255], defaults=defaults)
    if isinstance(stack, Mapping):
        worker_stack_record(worker=worker, stack=stack)
    return worker


def worker_heartbeat(*, name: str, stack: Mapping[str, Any] | None = None) -> bool:
    """Record that the worker `name` is alive now and, when it says, the stack it serves
    with now (`workers.stack.worker_stack`; kept and reported to its pools by
    `services.stacks.worker_stack_record`, which may record a stack change). False when it
    has no row or was marked stopped (it should register again)."""
    beating = Worker.objects.filter(name=name, stopped_at__isnull=True)
    if not beating.update(last_heartbeat_at=timezone.now()):
        return False
    if stack is not None:
        worker = beating.only("name", "queues", "software").first()
        if worker is not None:
            worker_stack_record(worker=worker, stack=stack)
    return True


def worker_stop(*, name: str) -> bool:
    """Mark the worker `name` stopped now (its warm shutdown). False when it was not
    registered or already stopped."""
    return bool(
        Worker.objects.filter(name=name, stopped_at__isnull=True).update(stopped_at=timezone.now())
    )
