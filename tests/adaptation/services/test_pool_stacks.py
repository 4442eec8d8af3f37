"""Pools' software stacks from their workers' registrations and heartbeats
(adaptation.services.stacks): the first report recorded and starting nothing, a changed
version a stack upgrade that starts the standard suite, the same report twice nothing, a
rolling upgrade moving the pool once, and two beats at once recording one change."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from adaptation.models import AcceleratorPool, StackChange, SuiteRun, SuiteTrigger
from adaptation.services import stacks
from adaptation.services.suites import suite_start
from adaptation.services.workers import worker_heartbeat, worker_register, worker_stop
from tests.factories import cpu_pool

pytestmark = pytest.mark.django_db


def worker_stack(vllm: str = "0.32.0", *, torch: str = "2.13.0+cpu") -> dict[str, Any]:
    """What `workers.stack.worker_stack` reports on a cpu host serving the cpu pool."""
    return {
        "torch": torch,
        "driver": None,
        "engines": {"cpu": {"vllm": vllm, "torch": "2.13.0+cpu"}},
    }


def pool_stack(vllm: str = "0.32.0", *, torch: str = "2.13.0+cpu") -> dict[str, Any]:
    return {"torch": torch, "driver": None, "engine": {"vllm": vllm, "torch": "2.13.0+cpu"}}


def register(name: str, stack: dict[str, Any], *, queues=("pool.cpu",)) -> None:
    description = {
        "hostname": name.partition("@")[2],
        "queues": list(queues),
        "backend": "cpu",
        "devices": [],
        "software": {"torch": stack["torch"], "python": "3.11.7", "celery": "5.7.0"},
        "stack": stack,
    }
    worker_register(name=name, description=description)


def test_the_first_report_is_recorded_and_starts_nothing():
    pool = cpu_pool()

    register("cpu@a", worker_stack())

    pool.refresh_from_db()
    assert pool.stack == pool_stack()
    [change] = StackChange.objects.filter(pool=pool)
    assert change.previous == {} and change.current == pool_stack()
    assert change.worker_name == "cpu@a"
    assert change.suite_run is None
    assert not SuiteRun.objects.exists()


def test_the_same_report_again_is_no_change():
    pool = cpu_pool()
    register("cpu@a", worker_stack())

    for _ in range(3):
        assert worker_heartbeat(name="cpu@a", stack=worker_stack()) is True

    assert StackChange.objects.filter(pool=pool).count() == 1


def test_a_heartbeat_with_a_new_engine_version_is_a_stack_upgrade_that_runs_the_suite(cast):
    pool = cpu_pool()
    register("cpu@a", worker_stack("0.32.0"))
    earlier = suite_start(pool=pool, trigger=SuiteTrigger.MANUAL, requested_by=cast.mona)

    assert worker_heartbeat(name="cpu@a", stack=worker_stack("0.33.1")) is True

    pool.refresh_from_db()
    assert pool.stack == pool_stack("0.33.1")
    change = StackChange.objects.filter(pool=pool).order_by("-id").first()
    assert change.previous == pool_stack("0.32.0")
    assert change.current == pool_stack("0.33.1")
    run = change.suite_run
    assert run is not None and run.trigger == SuiteTrigger.STACK_UPGRADE
    assert run.suite == "standard" and run.pool == pool
    assert run.previous == earlier  # the matrix compares it with the run before the upgrade
    assert run.stack == pool_stack("0.33.1")  # the stack it ran on
    assert run.jobs.count() == earlier.jobs.count() > 0
    assert StackChange.objects.filter(pool=pool).count() == 2
    # The worker's row keeps what it reported beside its python and celery versions.
    from adaptation.models import Worker

    software = Worker.objects.get(name="cpu@a").software
    assert software["engines"] == {"cpu": {"vllm": "0.33.1", "torch": "2.13.0+cpu"}}
    assert software["python"] == "3.11.7"


def test_a_torch_or_driver_change_is_an_upgrade_too(monkeypatch):
    started = []
    monkeypatch.setattr(
        "adaptation.services.suites.suite_start",
        lambda **kwargs: started.append(kwargs) or None,
    )
    pool = cpu_pool()
    register("gpu@a", worker_stack())
    worker_heartbeat(name="gpu@a", stack=worker_stack(torch="2.14.0+cpu"))
    cuda = {**worker_stack(torch="2.14.0+cpu"), "driver": {"cuda": "12.8", "nvidia": "570.1"}}
    worker_heartbeat(name="gpu@a", stack=cuda)

    changes = list(StackChange.objects.filter(pool=pool).order_by("id"))
    assert [c.current["torch"] for c in changes] == ["2.13.0+cpu", "2.14.0+cpu", "2.14.0+cpu"]
    assert changes[2].previous["driver"] is None
    assert changes[2].current["driver"] == {"cuda": "12.8", "nvidia": "570.1"}
    assert [s["trigger"] for s in started] == [SuiteTrigger.STACK_UPGRADE] * 2
    assert all(s["pool"].pk == pool.pk and s["suite"] == "standard" for s in started)


def test_a_suite_that_refuses_to_start_leaves_the_upgrade_recorded(monkeypatch):
    pool = cpu_pool()
    register("cpu@a", worker_stack("0.32.0"))
    AcceleratorPool.objects.filter(pk=pool.pk).update(enabled=False)  # suite_start refuses

    worker_heartbeat(name="cpu@a", stack=worker_stack("0.33.1"))

    change = StackChange.objects.filter(pool=pool).order_by("-id").first()
    assert change.current == pool_stack("0.33.1") and change.previous == pool_stack("0.32.0")
    assert change.suite_run is None
    assert not SuiteRun.objects.exists()


def test_a_rolling_upgrade_moves_the_pool_once_and_does_not_flap(monkeypatch):
    """The pool's stack is its newest live worker's: the upgraded worker started last
    moves it once; the old worker's beats beside it change nothing; when the upgraded
    worker stops, the old one speaks again and the pool is back on its stack."""
    monkeypatch.setattr("adaptation.services.suites.suite_start", lambda **kwargs: None)
    pool = cpu_pool()
    register("cpu@old", worker_stack("0.32.0"))
    register("cpu@new", worker_stack("0.33.1"))  # started later

    for _ in range(3):
        worker_heartbeat(name="cpu@old", stack=worker_stack("0.32.0"))
        worker_heartbeat(name="cpu@new", stack=worker_stack("0.33.1"))

    pool.refresh_from_db()
    assert pool.stack == pool_stack("0.33.1")
    assert [c.current["engine"]["vllm"] for c in StackChange.objects.order_by("id")] == [
        "0.32.0",
        "0.33.1",
    ]

    worker_stop(name="cpu@new")
    worker_heartbeat(name="cpu@old", stack=worker_stack("0.32.0"))

    pool.refresh_from_db()
    assert pool.stack == pool_stack("0.32.0")
    last = StackChange.objects.order_by("-id").first()
    assert (last.worker_name, last.previous, last.current) == (
        "cpu@old",
        pool_stack("0.33.1"),
        pool_stack("0.32.0"),
    )


def test_a_stale_newer_worker_does_not_hold_the_pool(settings):
    pool = cpu_pool()
    register("cpu@old", worker_stack("0.32.0"))
    register("cpu@new", worker_stack("0.32.0"))
    from adaptation.models import Worker

    Worker.objects.filter(name="cpu@new").update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=settings.DAY0_WORKER_STALE_S + 5)
    )
    stacks.pool_stack_report(pool=pool, worker_name="cpu@old", stack=pool_stack("0.34.0"))

    pool.refresh_from_db()
    assert pool.stack == pool_stack("0.34.0")


def test_a_worker_reports_each_of_its_pools_its_own_engine():
    cpu = cpu_pool()
    other = AcceleratorPool.objects.create(name="cpu-b", backend="cpu", queue="pool.cpu-b")
    stack = {
        "torch": "2.13.0+cpu",
        "driver": None,
        "engines": {"cpu": {"vllm": "0.32.0", "torch": "2.13.0+cpu"}, "cpu-b": {}},
    }
    register("cpu@a", stack, queues=("pool.cpu", "pool.cpu-b"))

    cpu.refresh_from_db()
    other.refresh_from_db()
    assert cpu.stack["engine"] == {"vllm": "0.32.0", "torch": "2.13.0+cpu"}
    assert other.stack == {"torch": "2.13.0+cpu", "driver": None, "engine": {}}


def test_a_heartbeat_without_a_stack_only_says_the_worker_is_alive():
    pool = cpu_pool()
    register("cpu@a", worker_stack())

    assert worker_heartbeat(name="cpu@a") is True
    assert worker_heartbeat(name="nobody@nowhere", stack=worker_stack("9")) is False

    assert StackChange.objects.filter(pool=pool).count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_beats_at_once_record_one_change():
    """Two reports of the same new stack at the same moment (no live worker speaks for the
    pool, so both may): the pool's row lock lets one record it; the other finds it done."""
    pool = cpu_pool()
    barrier = threading.Barrier(2)
    results: list[Any] = []

    def report(name: str) -> None:
        try:
            barrier.wait(timeout=10)
            results.append(
                stacks.pool_stack_report(
                    pool=AcceleratorPool.objects.get(pk=pool.pk),
                    worker_name=name,
                    stack=pool_stack("0.40.0"),
                )
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=report, args=(f"cpu@{n}",)) for n in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert len(results) == 2
    assert sum(1 for result in results if result is not None) == 1
    assert StackChange.objects.filter(pool=pool).count() == 1
