"""What a Celery worker tells day0 about itself: its host, the devices torch sees, and a
heartbeat while it runs.

`connect_worker_signals()` is called from `day0web.celery` when a worker process starts
(`worker_init`), so only workers register; the web process never imports torch through
here. On `worker_ready` a daemon thread registers the worker (`services.worker_register`)
and then beats every `DAY0_WORKER_HEARTBEAT_S` seconds; on `worker_shutdown` the thread
stops and the worker is marked stopped. A failure to register or beat is logged and tried
again at the next beat: it never stops the worker.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import threading
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

logger = logging.getLogger(__name__)


def host_memory_bytes() -> int | None:
    """The host's physical memory in bytes (`os.sysconf`), or None where it cannot say."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
    if pages <= 0 or page_size <= 0:
        return None
    return int(pages) * int(page_size)


def cpu_model_name() -> str:
    """The CPU's model name ("AMD EPYC 9654 96-Core Processor"), from /proc/cpuinfo on
    Linux, else what `platform` says, else "cpu"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _accelerator_devices(torch: Any) -> tuple[str, list[dict[str, Any]]]:
    """The torch backend ("cuda", "xpu" or "cpu") and its devices as torch reports them
    (memory in bytes); ("cpu", []) when no accelerator is available."""
    for backend in ("cuda", "xpu"):
        module = getattr(torch, backend, None)
        if module is None or not module.is_available():
            continue
        devices = []
        for index in range(module.device_count()):
            props = module.get_device_properties(index)
            devices.append(
                {
                    "index": index,
                    "name": str(getattr(props, "name", backend)),
                    "memory_bytes": int(getattr(props, "total_memory", 0)) or None,
                    "type": backend,
                }
            )
        return backend, devices
    return "cpu", []


def describe_this_worker(queues: list[str]) -> dict[str, Any]:
    """What this process runs on, as plain JSON-able values: hostname, pid, queues, backend
    ("cuda", "xpu" or "cpu", as torch reports), devices ([{"index", "name", "memory_bytes",
    "type"}]; on a host without accelerator, the host itself as one "cpu" device with its
    memory), cpu_cores (`os.cpu_count()`), memory_bytes (physical memory, bytes; None where
    the OS cannot say) and software versions (torch, python, celery).

    Imports torch (a few seconds the first time): call it in a worker, not in the web
    process.
    """
    import celery
    import torch

    memory = host_memory_bytes()
    backend, devices = _accelerator_devices(torch)
    if not devices:
        devices = [{"index": 0, "name": cpu_model_name(), "memory_bytes": memory, "type": "cpu"}]
    return {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "queues": list(queues),
        "backend": backend,
        "devices": devices,
        "cpu_cores": os.cpu_count(),
        "memory_bytes": memory,
        "software": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "celery": celery.__version__,
        },
    }


def consumer_queue_names(consumer: Any) -> list[str]:
    """The names of the queues a Celery consumer takes tasks from: its task consumer's
    queues once it consumes, else the app's `consume_from` (the worker's -Q)."""
    task_consumer = getattr(consumer, "task_consumer", None)
    queues = list(getattr(task_consumer, "queues", None) or [])
    if not queues:
        queues = list(consumer.app.amqp.queues.consume_from.values())
    names = [queue.name for queue in queues]
    return list(dict.fromkeys(names))


class WorkerAnnouncer:
    """Registers one worker and keeps its heartbeat, from a daemon thread with its own
    database connection (closed when it ends, like `workers.runner.Heartbeat`)."""

    def __init__(self, name: str, queues: list[str], every_s: float) -> None:
        self.name = name
        self.queues = queues
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="day0-worker-beat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5) -> None:
        """Stop beating and wait up to `timeout_s` seconds for the thread to end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)

    def _register(self) -> bool:
        from adaptation import services

        try:
            services.worker_register(name=self.name, description=describe_this_worker(self.queues))
            if self._stop.is_set():  # shut down while registering: do not look live after it
                services.worker_stop(name=self.name)
        except Exception:
            logger.warning("Worker %s could not register; retrying", self.name, exc_info=True)
            connection.close()
            return False
        logger.info("Worker %s registered for queues %s", self.name, ", ".join(self.queues))
        return True

    def _beat(self) -> bool:
        from adaptation import services

        try:
            return services.worker_heartbeat(name=self.name)
        except Exception:
            logger.warning("Heartbeat of worker %s failed", self.name, exc_info=True)
            connection.close()
            return True  # the row is there as far as we know; try again next time

    def _run(self) -> None:
        try:
            registered = self._register()
            while not self._stop.wait(self.every_s):
                # A beat that finds no live row (deleted, marked stopped) registers again.
                registered = self._beat() if registered else False
                if not registered:
                    registered = self._register()
        finally:
            connection.close()  # the thread's own connection


_announcers: dict[str, WorkerAnnouncer] = {}


def on_worker_ready(sender: Any = None, **_: object) -> None:
    """`worker_ready`: start registering and beating for the consumer's node. Never raises."""
    try:
        name = str(sender.hostname)
        queues = consumer_queue_names(sender)
        announcer = WorkerAnnouncer(name, queues, settings.DAY0_WORKER_HEARTBEAT_S)
        previous = _announcers.pop(name, None)
        if previous is not None:
            previous.stop()
        _announcers[name] = announcer
        announcer.start()
    except Exception:
        logger.warning("Could not start announcing this worker", exc_info=True)


def on_worker_shutdown(sender: Any = None, **_: object) -> None:
    """`worker_shutdown`: stop the heartbeat and mark the worker stopped. Never raises."""
    from adaptation import services

    name = str(getattr(sender, "hostname", "") or "")
    announcer = _announcers.pop(name, None)
    if announcer is not None:
        announcer.stop()
    if not name:
        return
    try:
        services.worker_stop(name=name)
    except Exception:
        logger.warning("Could not mark worker %s stopped", name, exc_info=True)
    finally:
        connection.close()


def connect_worker_signals() -> None:
    """Connect `on_worker_ready` and `on_worker_shutdown` (once, however often called)."""
    from celery.signals import worker_ready, worker_shutdown

    worker_ready.connect(on_worker_ready, dispatch_uid="day0.workers.pools.ready", weak=False)
    worker_shutdown.connect(
        on_worker_shutdown, dispatch_uid="day0.workers.pools.shutdown", weak=False
    )


__all__ = [
    "connect_worker_signals",
    "consumer_queue_names",
    "describe_this_worker",
    "host_memory_bytes",
    "on_worker_ready",
    "on_worker_shutdown",
]
