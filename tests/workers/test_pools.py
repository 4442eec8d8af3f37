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

from adaptation.models import Worker
from adaptation.services import workers as services_workers
from adaptation.services.workers import worker_register
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


class FakeBackend:
    """A torch backend module as torch.cuda, torch.hpu (habana_frameworks), torch.npu
    (torch_npu) and torch.mlu (torch_mlu) expose it: is_available, device_count and the
    device's name (from its properties, or `get_device_name` only)."""

    def __init__(self, count: int, name: str, memory: int | None = None, props: bool = True):
        self.count, self.name, self.memory = count, name, memory
        if not props:
            self.get_device_properties = None

    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def get_device_name(self, index: int) -> str:
        return self.name

    def get_device_properties(self, index: int):
        return SimpleNamespace(name=self.name, total_memory=self.memory)


def registering(torch: SimpleNamespace, **backends: FakeBackend):
    """An import function standing in for the optional packages: importing one registers
    its backend on `torch`, as `import torch_npu` adds `torch.npu`; any other is missing."""
    packages = {
        "habana_frameworks.torch.hpu": "hpu",
        "torch_npu": "npu",
        "torch_mlu": "mlu",
    }
    imported = []

    def import_module(name: str):
        imported.append(name)
        backend = packages.get(name)
        if backend not in backends:
            raise ModuleNotFoundError(f"No module named {name!r}")
        setattr(torch, backend, backends[backend])
        return SimpleNamespace()

    return import_module, imported


@pytest.mark.parametrize(
    ("backend", "package", "name"),
    [
        ("hpu", "habana_frameworks.torch.hpu", "GAUDI3"),
        ("npu", "torch_npu", "Ascend910B3"),
        ("mlu", "torch_mlu", "MLU370-X8"),
    ],
)
def test_devices_of_a_backend_registered_by_its_optional_package(backend, package, name):
    """Gaudi (hpu), Ascend (npu) and Cambricon (mlu) devices are found once their package
    is imported; cuda and xpu, built into torch, are tried first."""
    torch = SimpleNamespace(cuda=FakeBackend(0, "none"), xpu=None)
    import_module, imported = registering(
        torch, **{backend: FakeBackend(2, name, memory=64 * 2**30)}
    )

    found, devices = pools._accelerator_devices(torch, import_module)

    assert found == backend
    assert devices == [
        {"index": 0, "name": name, "memory_bytes": 64 * 2**30, "type": backend},
        {"index": 1, "name": name, "memory_bytes": 64 * 2**30, "type": backend},
    ]
    assert imported[-1] == package


def test_a_backend_that_only_names_its_devices_reports_no_memory():
    torch = SimpleNamespace(cuda=None, xpu=None)
    import_module, _ = registering(torch, npu=FakeBackend(1, "Ascend910B3", props=False))
    assert pools._accelerator_devices(torch, import_module) == (
        "npu",
        [{"index": 0, "name": "Ascend910B3", "memory_bytes": None, "type": "npu"}],
    )


def test_without_any_accelerator_package_the_worker_is_a_cpu_worker():
    """Missing optional packages are no error: each is tried, none is found."""
    torch = SimpleNamespace(cuda=FakeBackend(0, "none"))
    import_module, imported = registering(torch)
    assert pools._accelerator_devices(torch, import_module) == ("cpu", [])
    assert imported == ["habana_frameworks.torch.hpu", "torch_npu", "torch_mlu"]


def test_a_broken_backend_is_skipped_not_raised():
    class Broken(FakeBackend):
        def device_count(self) -> int:
            raise RuntimeError("driver version mismatch")

    def broken_import(name: str):
        raise OSError(f"{name}: libhccl.so not found")  # a plugin failing to load

    torch = SimpleNamespace(cuda=Broken(1, "x"), mlu=FakeBackend(1, "MLU370-X8", memory=2**35))
    assert pools._accelerator_devices(torch, broken_import) == (
        "mlu",
        [{"index": 0, "name": "MLU370-X8", "memory_bytes": 2**35, "type": "mlu"}],
    )


def test_the_worker_reads_host_memory_where_the_catalog_does():
    """One reading of the host's memory for the worker's description and the cpu kind."""
    from engine import catalog

    assert pools.physical_memory_bytes is catalog.physical_memory_bytes
    assert not hasattr(pools, "host_memory_bytes")
    assert catalog.physical_memory_bytes() == os.sysconf("SC_PAGE_SIZE") * os.sysconf(
        "SC_PHYS_PAGES"
    )


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
    real_register = worker_register
    calls = []

    def flaky_register(**kwargs):
        calls.append(kwargs["name"])
        if len(calls) == 1:
            raise RuntimeError("database is locked")
        return real_register(**kwargs)

    monkeypatch.setattr(services_workers, "worker_register", flaky_register)
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


def test_ready_stops_engines_a_killed_worker_left_behind(monkeypatch):
    import subprocess
    import sys

    from engine.stages.serve.process import OWNER_TAG

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, OWNER_TAG: gone}
    )
    monkeypatch.setattr(pools, "WorkerAnnouncer", lambda *a: SimpleNamespace(start=lambda: None))
    try:
        pools.on_worker_ready(sender=SimpleNamespace(hostname="cpu@reaper-test"))
        assert orphan.wait(timeout=10) == -9
    finally:
        orphan.kill()
        pools._announcers.pop("cpu@reaper-test", None)
