"""End to end: a real Celery worker announces itself (host, queues, devices), keeps its
heartbeat, records its node name on the stages it runs, and is marked stopped when it
shuts down."""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from adaptation.models import HubKind, StageRun, StageStatus, Worker
from adaptation.selectors.workers import live_workers
from adaptation.services.jobs import job_create
from tests.conftest import REALCONFIGS_DIR
from tests.e2e.conftest import wait_for
from tests.factories import cpu_pool, make_release

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def fast_worker_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker process (which copies this environment) beats every second, not 15 s.
    Listed before `celery_worker_process` so it is set when the worker starts."""
    monkeypatch.setenv("DAY0_WORKER_HEARTBEAT_S", "1")


def this_worker() -> Worker | None:
    return Worker.objects.filter(name__startswith=f"e2e-{os.getpid()}@").first()


def test_worker_registers_beats_runs_and_stops(
    fast_worker_heartbeat, celery_worker_process, tmp_path
):
    worker_process = celery_worker_process
    wait_for(
        lambda: this_worker() is not None,
        timeout_s=60,
        worker=worker_process,
        what="the worker's registration",
    )
    worker = this_worker()
    assert sorted(worker.queues) == ["day0", "pool.cpu"]
    assert worker.pid == worker_process.pid
    assert worker.stopped_at is None
    assert worker.backend == "cpu"
    assert worker.cpu_cores == os.cpu_count()  # the same machine as this test
    assert worker.memory_bytes > 0
    assert [d["type"] for d in worker.devices] == ["cpu"]
    assert timezone.now() - worker.last_heartbeat_at < timedelta(
        seconds=settings.DAY0_WORKER_STALE_S
    )
    pool = cpu_pool()
    assert worker in live_workers(pool)

    first_beat = worker.last_heartbeat_at
    wait_for(
        lambda: this_worker().last_heartbeat_at > first_beat,
        timeout_s=20,
        worker=worker_process,
        what="a heartbeat after registration",
    )

    # A stage it runs records its Celery node name: "what it runs now" matches on it.
    root = tmp_path / "hub"
    (root / "acme" / "llama-8b").mkdir(parents=True)
    (root / "acme" / "llama-8b" / "config.json").write_bytes(
        (REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json").read_bytes()
    )
    release = make_release(
        hub_kind=HubKind.MIRROR, hub_endpoint=str(root), repo_id="acme/llama-8b", revision="main"
    )
    job = job_create(release=release, pool=pool, trigger="manual", stages=["fetch"])
    run = StageRun.objects.get(job=job)
    wait_for(
        lambda: (
            StageRun.objects.get(pk=run.pk).status in (StageStatus.SUCCEEDED, StageStatus.FAILED)
        ),
        timeout_s=120,
        worker=worker_process,
        what="the fetch stage",
    )
    run.refresh_from_db()
    assert run.status == StageStatus.SUCCEEDED, run.error
    assert run.worker_host == worker.name

    # A warm shutdown marks it stopped; its pool then has no live worker.
    worker_process.send_signal(signal.SIGTERM)
    worker_process.wait(timeout=30)
    worker.refresh_from_db()
    assert worker.stopped_at is not None
    assert live_workers(pool) == []
