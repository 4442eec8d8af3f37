"""What a Celery worker tells day0 about itself: its host, the devices torch sees, and a
heartbeat while it runs.

`connect_worker_signals()` is called from `day0web.celery` when a worker process starts
(`worker_init`), so only workers register; the web process never imports torch through
here. On `worker_ready` a daemon thread registers the worker (`worker_register`)
and then beats every `DAY0_WORKER_HEARTBEAT_S` seconds; on `worker_shutdown` the thread
stops and the worker is marked stopped. A failure to register or beat is logged and tried
again at the next beat: it never stops the worker.

The registration and every beat carry the stack the worker serves with (`workers.stack`:
torch, the accelerator driver, each of its pools' serving-engine versions); the app keeps
each pool's stack and records its changes (`adaptation.services.stacks`).
"""

from __future__ import annotations

import importlib
import logging
import os
import platform
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from django.conf import settings
from django.db import connection

from engine.catalog import physical_memory_bytes
from workers.stack import worker_stack

logger = logging.getLogger(__name__)

# Torch backends a worker may run on, in the order tried: (the attribute of `torch`, the
# optional package that registers it when it is not built in). Each is a module exposing
# is_available, device_count and get_device_name / get_device_properties, as torch.cuda does.
ACCELERATOR_BACKENDS: tuple[tuple[str, str | None], ...] = (
    ("cuda", None),  # NVIDIA, and AMD through ROCm builds of torch
    ("xpu", None),  # Intel GPUs
    ("hpu", "habana_frameworks.torch.hpu"),  # Intel Gaudi
    ("npu", "torch_npu"),  # Huawei Ascend
    ("mlu", "torch_mlu"),  # Cambricon MLU
)


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


def _backend_module(
    torch: Any, name: str, extension: str | None, import_module: Callable[[str], ModuleType]
) -> Any:
    """`torch.<name>` once its optional `extension` package is imported (importing it
    registers the backend; where it does not, the package's own module if it is the
    backend's), or None when absent. A missing or broken extension is no error: skipped."""
    module = getattr(torch, name, None)
    if module is not None or not extension:
        return module
    try:
        imported = import_module(extension)
    except Exception:  # ImportError, or a plugin failing to load: not this machine's
        logger.debug("torch backend %s: %s not importable", name, extension, exc_info=True)
        return None
    module = getattr(torch, name, None)
    if module is None and callable(getattr(imported, "device_count", None)):
        module = imported
    return module


def _device(module: Any, backend: str, index: int) -> dict[str, Any]:
    """One device as a backend module reports it: its name and total memory in bytes
    (None when the backend does not say)."""
    props = None
    if callable(getattr(module, "get_device_properties", None)):
        try:
            props = module.get_device_properties(index)
        except Exception:
            props = None
    name = getattr(props, "name", None)
    if not name and callable(getattr(module, "get_device_name", None)):
        try:
            name = module.get_device_name(index)
        except Exception:
            name = None
    memory = getattr(props, "total_memory", None)
    memory = int(memory) if isinstance(memory, int | float) and memory > 0 else None
    return {"index": index, "name": str(name or backend), "memory_bytes": memory, "type": backend}


def _accelerator_devices(
    torch: Any, import_module: Callable[[str], ModuleType] = importlib.import_module
) -> tuple[str, list[dict[str, Any]]]:
    """The first torch backend of `ACCELERATOR_BACKENDS` with a device ("cuda", "xpu",
    "hpu", "npu", "mlu") and its devices as torch reports them (memory in bytes); ("cpu",
    []) when none is available. A backend whose optional package is missing, or whose module
    raises, is skipped: describing the worker never fails."""
    for backend, extension in ACCELERATOR_BACKENDS:
        module = _backend_module(torch, backend, extension, import_module)
        if module is None or not callable(getattr(module, "device_count", None)):
            continue
        try:
            available = getattr(module, "is_available", lambda: True)()
            count = int(module.device_count()) if available else 0
        except Exception:
            logger.warning("torch backend %s failed to report its devices", backend, exc_info=True)
            continue
        if count > 0:
            return backend, [_device(module, backend, index) for index in range(count)]
    return "cpu", []


def describe_this_worker(
    queues: list[str], engines: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """What this process runs on, as plain JSON-able values: hostname, pid, queues, backend
    ("cuda", "xpu", "hpu", "npu", "mlu" or "cpu", as torch reports), devices ([{"index",
    "name", "memory_bytes", "type"}]; on a host without accelerator, the host itself as one
    "cpu" device with its memory), cpu_cores (`os.cpu_count()`), memory_bytes (physical
    memory, bytes; None where the OS cannot say), software versions (torch, python,
    celery) and the stack it serves with (`workers.stack.worker_stack`: torch, the
    accelerator driver, and the serving engine of each pool of `engines`, pool name -> its
    engine as `workers.runner.pool_engine` gives it).

    Imports torch (a few seconds the first time): call it in a worker, not in the web
    process.
    """
    import celery
    import torch

    memory = physical_memory_bytes()
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
        "stack": worker_stack(torch, backend, engines or {}),
    }


def this_worker_stack(backend: str, engines: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The stack this worker serves with now (`workers.stack.worker_stack`), for a heartbeat:
    `backend` as `describe_this_worker` found it (devices are not listed again)."""
    import torch

    return worker_stack(torch, backend, engines)


def pool_engines(queues: list[str]) -> dict[str, dict[str, Any]]:
    """Pool name -> the serving engine the serve stage runs for it
    (`workers.runner.pool_engine`), for each pool whose queue is among `queues`: one query."""
    from adaptation.models import AcceleratorPool
    from workers.runner import pool_engine

    return {
        pool.name: pool_engine(pool)
        for pool in AcceleratorPool.objects.filter(queue__in=list(queues)).only(
            "name", "queue", "engine"
        )
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
        self.backend = "cpu"  # as the registration found it
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
        from adaptation.services.workers import worker_register, worker_stop

        try:
            description = describe_this_worker(self.queues, pool_engines(self.queues))
            self.backend = description["backend"]
            worker_register(name=self.name, description=description)
            if self._stop.is_set():  # shut down while registering: do not look live after it
                worker_stop(name=self.name)
        except Exception:
            logger.warning("Worker %s could not register; retrying", self.name, exc_info=True)
            connection.close()
            return False
        logger.info("Worker %s registered for queues %s", self.name, ", ".join(self.queues))
        return True

    def _beat(self) -> bool:
        from adaptation.services.workers import worker_heartbeat

        stack: dict[str, Any] | None = None
        try:
            stack = this_worker_stack(self.backend, pool_engines(self.queues))
        except Exception:  # the beat still says the worker is alive
            logger.warning("Worker %s could not read its stack", self.name, exc_info=True)
            connection.close()
        try:
            return worker_heartbeat(name=self.name, stack=stack)
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
    """`worker_ready`: stop the serving engines a killed worker left behind (their owner
    process is gone: `reap_orphans`), then start registering and beating for the consumer's
    node. Never raises."""
    try:
        from engine.stages.serve.process import reap_orphans

        killed = reap_orphans()
        if killed:
            logger.warning("Stopped %d engine process(es) a lost worker left behind", len(killed))
    except Exception:
        logger.warning("Could not look for engines a lost worker left behind", exc_info=True)
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
    from adaptation.services.workers import worker_stop

    name = str(getattr(sender, "hostname", "") or "")
    announcer = _announcers.pop(name, None)
    if announcer is not None:
        announcer.stop()
    if not name:
        return
    try:
        worker_stop(name=name)
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
    "on_worker_ready",
    "on_worker_shutdown",
    "pool_engines",
    "this_worker_stack",
]
