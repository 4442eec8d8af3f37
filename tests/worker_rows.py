"""Worker rows as a registered Celery worker leaves them, for inventory and page tests."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from adaptation.models import Worker

GIB = 2**30
_counter = itertools.count(1)


def cpu_device(memory_bytes: int = 64 * GIB) -> dict[str, Any]:
    return {"index": 0, "name": "AMD EPYC 9654", "memory_bytes": memory_bytes, "type": "cpu"}


def cuda_devices(count: int, *, name: str = "NVIDIA H200", gib: int = 141) -> list[dict]:
    return [
        {"index": i, "name": name, "memory_bytes": gib * GIB, "type": "cuda"} for i in range(count)
    ]


def make_worker(
    *,
    queues: tuple[str, ...] = ("pool.cpu",),
    devices: list[dict] | None = None,
    heartbeat_age_s: float = 1,
    stopped: bool = False,
    now: datetime | None = None,
    **fields: Any,
) -> Worker:
    """A worker that beat `heartbeat_age_s` seconds before `now`; `stopped` marks it stopped
    at its last beat. Its backend is its devices' type ("cuda" for `cuda_devices`), as a
    worker describes itself (`workers.pools.describe_this_worker`), unless given."""
    now = now or timezone.now()
    n = next(_counter)
    beat = now - timedelta(seconds=heartbeat_age_s)
    devices = [cpu_device()] if devices is None else devices
    backend = next((d.get("type") for d in devices if d.get("type")), "cpu")
    defaults: dict[str, Any] = {
        "name": f"w{n}@host-{n}",
        "hostname": f"host-{n}",
        "pid": 1000 + n,
        "queues": list(queues),
        "backend": backend,
        "devices": devices,
        "cpu_cores": 16,
        "memory_bytes": 64 * GIB,
        "software": {"torch": "2.13.0+cpu", "python": "3.11.7", "celery": "5.7.0"},
        "started_at": beat - timedelta(minutes=5),
        "last_heartbeat_at": beat,
        "stopped_at": beat if stopped else None,
    }
    defaults.update(fields)
    return Worker.objects.create(**defaults)
