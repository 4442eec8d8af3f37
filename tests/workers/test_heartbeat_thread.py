"""The whole way, in a worker's own heartbeat thread: it registers with its pool's engine
version read from the environment's dist-info, and a `pip install` of a new version there is
a stack upgrade at a later beat, without the worker restarting."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from adaptation.models import AcceleratorPool, StackChange, SuiteRun, SuiteTrigger
from tests.factories import cpu_pool
from tests.workers.environments import fake_engine_env, install, site_packages_of
from workers import pools, stack


def wait_until(predicate, timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.django_db(transaction=True)
def test_a_worker_reports_an_engine_upgrade_at_its_next_beat(settings, tmp_path, monkeypatch):
    settings.DAY0_WORKER_HEARTBEAT_S = 1
    stack.clear_caches()
    started = []

    def suite_start(*, pool, trigger, suite="standard", **kwargs):
        # Jobs are not the point here (and would be enqueued for real in this test).
        started.append(trigger)
        return SuiteRun.objects.create(suite=suite, pool=pool, trigger=trigger, stack=pool.stack)

    monkeypatch.setattr("adaptation.services.suites.suite_start", suite_start)
    python = fake_engine_env(tmp_path / "env", vllm="0.32.0", torch="2.13.0+cpu")
    pool = cpu_pool()
    AcceleratorPool.objects.filter(pk=pool.pk).update(
        engine={"kind": "vllm", "python": str(python)}
    )
    consumer = SimpleNamespace(
        hostname="cpu@stack-test",
        task_consumer=SimpleNamespace(queues=[SimpleNamespace(name="pool.cpu")]),
    )

    def vllm_of_pool() -> str | None:
        return (AcceleratorPool.objects.get(pk=pool.pk).stack.get("engine") or {}).get("vllm")

    pools.on_worker_ready(sender=consumer)
    try:
        assert wait_until(lambda: vllm_of_pool() == "0.32.0")
        install(site_packages_of(tmp_path / "env"), "vllm", "0.33.1")
        assert wait_until(lambda: vllm_of_pool() == "0.33.1")
        time.sleep(2.5)  # two more beats with the same stack
    finally:
        pools.on_worker_shutdown(sender=SimpleNamespace(hostname="cpu@stack-test"))
        stack.clear_caches()

    first, upgrade = StackChange.objects.filter(pool=pool).order_by("id")  # and no more
    assert first.previous == {} and first.suite_run is None
    assert first.worker_name == "cpu@stack-test"
    assert upgrade.previous["engine"]["vllm"] == "0.32.0"
    assert upgrade.current["engine"] == {"vllm": "0.33.1", "torch": "2.13.0+cpu"}
    assert upgrade.suite_run is not None and started == [SuiteTrigger.STACK_UPGRADE]
