"""What a worker says about itself, and its registration and heartbeat thread."""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from adaptation import services
from adaptation.models import Worker
from workers import pools


def test_describe_this_worker_on_this_cpu_machine():
    description = pools.describe_this_worker(["day0", "pool.cpu"])

    assert description["queues"] == ["day0", "pool.cpu"]
    assert description["pid"] == os.getpid()
    assert description["hostname"]
    assert description["cpu_cores"] == os.cpu_count()
    assert description["memory_bytes"] > 0
    assert description["memory_bytes"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert description["backend"] in ("cpu", "cuda", "xpu")
    import torch

    if not torch.cuda.is_available():
        assert description["backend"] == "cpu"
        [device] = description["devices"]
        assert device["type"] == "cpu" and device["index"] == 0
        assert device["memory_bytes"] == description["memory_bytes"]
        assert device["name"]
    assert description["software"]["torch"] == torch.__version__
    assert set(description["software"]) == {"torch", "python", "celery"}


def test_cuda_devices_are_read_from_torch():
    """What torch.cuda reports becomes the device list: name and total memory in bytes."""

    class FakeCuda:
        @staticmethod
        def is_available() -> bool:
            return True

        @staticmethod
        def device_count() -> int:
            return 2

        @staticmethod
        def get_device_properties(index: int):
            return SimpleNamespace(name="NVIDIA H200", total_memory=150_119_997_440 + index)

    backend, devices = pools._accelerator_devices(SimpleNamespace(cuda=FakeCuda()))
    assert backend == "cuda"
    assert devices == [
        {"index": 0, "name": "NVIDIA H200", "memory_bytes": 150_119_997_440, "type": "cuda"},
        {"index": 1, "name": "NVIDIA H200", "memory_bytes": 150_119_997_441, "type": "cuda"},
    ]


def test_consumer_queue_names_come_from_the_task_consumer():
    consumer = SimpleNamespace(
        task_consumer=SimpleNamespace(
            queues=[SimpleNamespace(name="day0"), SimpleNamespace(name="pool.cpu")]
        ),
        app=None,
    )
    assert pools.consumer_queue_names(consumer) == ["day0", "pool.cpu"]


def test_consumer_queue_names_fall_back_to_the_apps_consume_from():
    queues = {"pool.h200": SimpleNamespace(name="pool.h200")}
    app = SimpleNamespace(amqp=SimpleNamespace(queues=SimpleNamespace(consume_from=queues)))
    consumer = SimpleNamespace(task_consumer=None, app=app)
    assert pools.consumer_queue_names(consumer) == ["pool.h200"]


def wait_until(predicate, timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.django_db(transaction=True)
def test_ready_registers_and_beats_then_shutdown_marks_stopped(settings):
    settings.DAY0_WORKER_HEARTBEAT_S = 1
    consumer = SimpleNamespace(
        hostname="cpu@test-host",
        task_consumer=SimpleNamespace(queues=[SimpleNamespace(name="pool.cpu")]),
    )
    pools.on_worker_ready(sender=consumer)
    try:
        assert wait_until(lambda: Worker.objects.filter(name="cpu@test-host").exists())
        worker = Worker.objects.get(name="cpu@test-host")
        assert worker.queues == ["pool.cpu"]
        assert worker.cpu_cores == os.cpu_count()
        first_beat = worker.last_heartbeat_at
        assert wait_until(
            lambda: Worker.objects.get(name="cpu@test-host").last_heartbeat_at > first_beat
        )
    finally:
        pools.on_worker_shutdown(sender=SimpleNamespace(hostname="cpu@test-host"))
    worker = Worker.objects.get(name="cpu@test-host")
    assert worker.stopped_at is not None
    assert timezone.now() - worker.stopped_at < timedelta(seconds=10)
    assert "cpu@test-host" not in pools._announcers


@pytest.mark.django_db(transaction=True)
def test_a_failed_registration_is_logged_and_tried_again(settings, monkeypatch, caplog):
    settings.DAY0_WORKER_HEARTBEAT_S = 1
    real_register = services.worker_register
    calls = []

    def flaky_register(**kwargs):
        calls.append(kwargs["name"])
        if len(calls) == 1:
            raise RuntimeError("database is locked")
        return real_register(**kwargs)

    monkeypatch.setattr(services, "worker_register", flaky_register)
    consumer = SimpleNamespace(
        hostname="cpu@flaky", task_consumer=SimpleNamespace(queues=[SimpleNamespace(name="q")])
    )
    with caplog.at_level(logging.WARNING, logger="workers.pools"):
        pools.on_worker_ready(sender=consumer)  # never raises
        try:
            assert wait_until(lambda: Worker.objects.filter(name="cpu@flaky").exists())
        finally:
            pools.on_worker_shutdown(sender=SimpleNamespace(hostname="cpu@flaky"))
    assert len(calls) >= 2
    assert "Worker cpu@flaky could not register; retrying" in caplog.text


def test_a_broken_sender_never_stops_the_worker(caplog):
    with caplog.at_level(logging.WARNING, logger="workers.pools"):
        pools.on_worker_ready(sender=object())  # no hostname, no consumer
    assert "Could not start announcing this worker" in caplog.text


def test_signals_connect_once():
    from celery.signals import worker_ready, worker_shutdown

    try:
        pools.connect_worker_signals()
        pools.connect_worker_signals()
        for signal in (worker_ready, worker_shutdown):
            ours = [key for key, _ in signal.receivers if "day0.workers.pools" in str(key)]
            assert len(ours) == 1
    finally:  # this test process is no worker
        worker_ready.disconnect(dispatch_uid="day0.workers.pools.ready")
        worker_shutdown.disconnect(dispatch_uid="day0.workers.pools.shutdown")


def test_run_stage_records_the_celery_node_name(monkeypatch):
    """The task hands its worker's node name ("cpu@box") to the runner, which stores it on
    the run: the pools page matches what each worker runs on it."""
    from workers import tasks
    from workers.runner import StageOutcome

    seen = {}

    def fake_execute(stage_run_id, **kwargs):
        seen.update(kwargs, stage_run_id=stage_run_id)
        return StageOutcome(status="succeeded")

    monkeypatch.setattr(tasks, "execute_stage_run", fake_execute)
    tasks.run_stage.push_request(id="task-1", hostname="cpu@box", retries=0)
    try:
        assert tasks.run_stage.run(7) == "succeeded"
    finally:
        tasks.run_stage.pop_request()
    assert seen == {
        "stage_run_id": 7,
        "task_id": "task-1",
        "final_try": False,
        "worker_host": "cpu@box",
    }

    tasks.run_stage.push_request(id="task-2", hostname=None, retries=0)
    try:
        tasks.run_stage.run(8)
    finally:
        tasks.run_stage.pop_request()
    assert seen["worker_host"] == socket.gethostname()
