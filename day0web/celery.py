"""The Celery app. Workers start with `celery -A day0web worker -Q pool.<name>`."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_init, worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0web.settings")

app = Celery("day0web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"])


@worker_process_init.connect
def limit_torch_threads(**_: object) -> None:
    """One pool process per core: torch's own thread pool would oversubscribe the cores
    (concurrency x threads), so each process gets DAY0_TORCH_THREADS threads."""
    import torch
    from django.conf import settings

    torch.set_num_threads(settings.DAY0_TORCH_THREADS)


@worker_init.connect
def announce_worker(**_: object) -> None:
    """In a worker process only: register it (host, queues, devices) when it is ready, keep
    its heartbeat, and mark it stopped at shutdown (`workers.pools`)."""
    from workers.pools import connect_worker_signals

    connect_worker_signals()
