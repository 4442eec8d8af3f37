"""Workers registering and beating, a pool's live inventory, and when a plan can start."""

from __future__ import annotations

import html
from datetime import timedelta

import pytest
from django.template.loader import render_to_string
from django.utils import timezone

from adaptation.catalog import pool_layout
from adaptation.models import AcceleratorPool, AdaptationJob, StageRun, Worker
from adaptation.presenters.pools import DeviceWarning, device_warning_text, device_warnings
from adaptation.selectors import inventory
from adaptation.selectors.workers import live_workers, pools_without_live_worker
from adaptation.services.errors import ServiceError
from adaptation.services.workers import worker_heartbeat, worker_register, worker_stop
from tests.factories import cpu_pool, make_job
from tests.worker_rows import GIB, cuda_devices, make_worker

pytestmark = pytest.mark.django_db


def gpu_pool(**fields) -> AcceleratorPool:
    defaults = {"name": "h200", "backend": "cuda", "device": "cuda:0", "accelerator": "h200"}
    return AcceleratorPool.objects.create(**{**defaults, **fields})


def set_times(job: AdaptationJob, stage: str, **times) -> None:
    StageRun.objects.filter(job=job, stage=stage).update(**times)


def pool_inventory(**arguments) -> inventory.PoolInventory:
    return inventory.pool_inventory(layout_of=pool_layout, **arguments)


def plan_start_estimate(**arguments) -> inventory.StartEstimate:
    return inventory.plan_start_estimate(layout_of=pool_layout, **arguments)


def said(template: str, **context) -> str:
    """What the pages say from `template` rendered with `context`, as plain text."""
    return " ".join(html.unescape(render_to_string(template, context)).split())


def reason(answer: inventory.StartEstimate) -> str:
    """Why the plan can or cannot start now, as the plan panel says it."""
    return said("adaptation/partials/start_reason.html", start=answer)


def basis(answer: inventory.StartEstimate) -> str:
    """How its start was estimated, as the plan panel says it."""
    return said("adaptation/partials/start_basis.html", start=answer)


def devices_counted(declared: bool) -> str:
    """How the pools page and the plan panel say a pool's devices were counted."""
    return said("adaptation/partials/devices_counted.html", declared=declared)


def warnings(inv: inventory.PoolInventory) -> list[str]:
    """The pool's device warnings as the pools page (and the API) words them."""
    return [device_warning_text(warning) for warning in device_warnings(inv)]


# --- services -------------------------------------------------------------------------------

DESCRIPTION = {
    "hostname": "gpu-node-7",
    "pid": 4242,
    "queues": ["pool.h200"],
    "backend": "cuda",
    "devices": cuda_devices(8),
    "cpu_cores": 192,
    "memory_bytes": 2048 * GIB,
    "software": {"torch": "2.13.0", "python": "3.11.7", "celery": "5.7.0"},
    "unknown_key": "ignored",
}


def test_worker_register_records_what_the_worker_described():
    worker = worker_register(name="h200@gpu-node-7", description=DESCRIPTION)
    worker.refresh_from_db()
    assert worker.hostname == "gpu-node-7" and worker.pid == 4242
    assert worker.queues == ["pool.h200"]
    assert worker.backend == "cuda"
    assert len(worker.devices) == 8 and worker.devices[0]["memory_bytes"] == 141 * GIB
    assert worker.cpu_cores == 192 and worker.memory_bytes == 2048 * GIB
    assert worker.software["torch"] == "2.13.0"
    assert worker.stopped_at is None


def test_worker_restarted_under_the_same_name_takes_over_its_row():
    first = worker_register(name="cpu@a", description={"queues": ["pool.cpu"]})
    assert worker_stop(name="cpu@a") is True
    assert worker_stop(name="cpu@a") is False  # already stopped
    assert worker_heartbeat(name="cpu@a") is False  # stopped: register again

    again = worker_register(name="cpu@a", description={"queues": ["day0", "pool.cpu"]})

    assert again.pk == first.pk and Worker.objects.count() == 1
    again.refresh_from_db()
    assert again.stopped_at is None
    assert again.started_at > first.started_at
    assert again.queues == ["day0", "pool.cpu"]
    assert again.hostname == "a"  # from the node name when the description has none


def test_worker_heartbeat_moves_the_heartbeat_and_says_when_there_is_no_row():
    worker = worker_register(name="cpu@a", description={"queues": ["pool.cpu"]})
    Worker.objects.filter(pk=worker.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    assert worker_heartbeat(name="cpu@a") is True
    worker.refresh_from_db()
    assert timezone.now() - worker.last_heartbeat_at < timedelta(seconds=5)
    assert worker_heartbeat(name="nobody@nowhere") is False


def test_worker_register_refuses_a_blank_name():
    with pytest.raises(ServiceError):
        worker_register(name=" ", description={})


# --- inventory ------------------------------------------------------------------------------


def test_live_workers_are_those_on_the_queue_beating_recently(settings):
    settings.DAY0_WORKER_STALE_S = 60
    pool = cpu_pool()
    now = timezone.now()
    live = make_worker(name="cpu@live", heartbeat_age_s=59, now=now)
    make_worker(name="cpu@stale", heartbeat_age_s=61, now=now)
    make_worker(name="cpu@stopped", heartbeat_age_s=1, stopped=True, now=now)
    make_worker(name="gpu@other", queues=("pool.h200",), now=now)

    assert live_workers(pool, now=now) == [live]


def test_pool_inventory_lists_workers_devices_runs_and_queue(settings):
    settings.DAY0_WORKER_STALE_S = 60
    pool = gpu_pool()
    now = timezone.now()
    busy = make_worker(name="h200@a", queues=("pool.h200",), devices=cuda_devices(8), now=now)
    idle = make_worker(name="h200@b", queues=("pool.h200",), devices=cuda_devices(4), now=now)
    make_worker(name="h200@gone", queues=("pool.h200",), stopped=True, heartbeat_age_s=600)
    make_worker(name="h200@silent", queues=("pool.h200",), heartbeat_age_s=300, now=now)
    make_worker(name="h200@old", queues=("pool.h200",), stopped=True, heartbeat_age_s=3 * 86400)

    planned = make_job(
        pool=pool,
        stages=("fetch", "plan", "operators"),
        statuses={"fetch": "succeeded", "plan": "succeeded", "operators": "running"},
        results={"plan": {"devices": 4, "tp": 4}},
    )
    StageRun.objects.filter(job=planned, stage="operators").update(worker_host="h200@a")
    unplanned = make_job(pool=pool, statuses={"fetch": "running"})
    StageRun.objects.filter(job=unplanned, stage="fetch").update(worker_host="old-hostname")
    waiting = make_job(pool=pool, statuses={"fetch": "queued"})
    set_times(waiting, "fetch", queued_at=now - timedelta(seconds=90))
    second = make_job(pool=pool, statuses={"fetch": "queued"})
    set_times(second, "fetch", queued_at=now - timedelta(seconds=30))
    make_job(statuses={"fetch": "queued"})  # another pool's queue

    inv = pool_inventory(pool=pool, now=now)

    assert [s.worker.name for s in inv.live_workers] == ["h200@a", "h200@b"]
    assert [s.worker.name for s in inv.inactive_workers] == ["h200@silent", "h200@gone"]
    assert [s.state for s in inv.inactive_workers] == ["stale", "stopped"]
    by_name = {s.worker.name: s for s in inv.live_workers}
    assert [r.job_id for r in by_name["h200@a"].running] == [planned.pk]
    assert by_name["h200@b"].running == ()
    assert [r.job_id for r in inv.unmatched_running] == [unplanned.pk]
    assert inv.devices_reported == 12
    assert [(h.job.pk, h.devices, h.from_plan) for h in inv.holdings] == [
        (planned.pk, 4, True),
        (unplanned.pk, 1, False),
    ]
    assert inv.devices_held == 5 and inv.devices_free == 7
    assert [w.job.pk for w in inv.waiting] == [waiting.pk, second.pk]
    assert inv.queued_stage_runs == 2
    assert inv.oldest_wait_s == pytest.approx(90)
    assert (inv.layout.accelerator, inv.layout.devices_per_node, inv.layout.nodes) == (
        "h200",
        8,
        1,
    )
    assert busy in inv.machines and idle in inv.machines


def test_pool_inventory_keeps_a_catalog_error_instead_of_raising():
    pool = gpu_pool(name="mystery", accelerator="tpu-v9")
    inv = pool_inventory(pool=pool)
    assert inv.layout is None
    assert "tpu-v9" in inv.layout_error


def test_pools_without_live_worker(settings):
    settings.DAY0_WORKER_STALE_S = 60
    cpu = cpu_pool()
    gpu = gpu_pool()
    make_worker(queues=("day0", "pool.cpu"))
    make_worker(queues=("pool.h200",), heartbeat_age_s=120)

    idle = pools_without_live_worker()

    assert cpu.pk not in idle
    assert idle[gpu.pk] == gpu


# --- when can a plan start ------------------------------------------------------------------


def history(pool: AcceleratorPool, durations_s: list[float], *, now) -> None:
    """One finished job whose succeeded stages took `durations_s` seconds."""
    stages = ("fetch", "analyze", "operators", "precision")[: len(durations_s)]
    job = make_job(pool=pool, stages=stages, statuses=dict.fromkeys(stages, "succeeded"))
    job.created_at = now - timedelta(hours=1)
    job.save(update_fields=["created_at"])
    for stage, seconds in zip(stages, durations_s, strict=True):
        finished = now - timedelta(minutes=30)
        started = finished - timedelta(seconds=seconds)
        set_times(job, stage, started_at=started, finished_at=finished)


def created(job: AdaptationJob, at) -> AdaptationJob:
    AdaptationJob.objects.filter(pk=job.pk).update(created_at=at)
    job.refresh_from_db()
    return job


def test_estimate_waits_for_running_and_earlier_jobs_by_median_stage_duration(settings):
    """One cpu device; a running job 10 s into the first of its two stages, one job waiting
    ahead with two stages; the median of 20, 30 and 100 s is 30 s. The running job frees
    the device after (30 - 10) + 30 = 50 s, the waiting one holds it for 2 x 30 = 60 s:
    the plan starts in 110 s."""
    settings.DAY0_WORKER_STALE_S = 60
    pool = cpu_pool()
    now = timezone.now()
    make_worker(now=now)
    history(pool, [20, 30, 100], now=now)
    running = make_job(pool=pool, statuses={"fetch": "running"})
    created(running, now - timedelta(minutes=3))
    set_times(running, "fetch", started_at=now - timedelta(seconds=10))
    ahead = created(make_job(pool=pool, statuses={"fetch": "queued"}), now - timedelta(minutes=2))

    answer = plan_start_estimate(pool=pool, devices=1, now=now)

    assert answer.can_start_now is False
    assert answer.devices_needed == 1
    assert answer.devices_reported == 1
    assert answer.devices_held == 1
    assert answer.devices_free == 0
    assert answer.queue_position == 1
    assert answer.median_stage_s == 30.0
    assert answer.history_stages == 3
    assert answer.estimated_wait_s == 110.0
    assert answer.estimated_start_at.isoformat() == (now + timedelta(seconds=110)).isoformat()
    assert basis(answer).startswith("estimate")
    assert "30.0 s over its last 3 succeeded stages" in basis(answer)
    assert reason(answer) == (
        "waits: 1 job waiting ahead of it; 0 of 1 device free, 1 held by 1 running job"
    )

    # The waiting job's own plan: it is first in the queue; only the running job is ahead.
    own = plan_start_estimate(pool=pool, devices=1, job=ahead, now=now)
    assert own.queue_position == 0
    assert own.estimated_wait_s == 50.0


def test_estimate_uses_the_running_jobs_plan_devices(settings):
    """8 devices reported; a running job holds the 4 its plan chose, 1 s into its last
    stage; the stages so far took 3 s each (median 3 s)."""
    settings.DAY0_WORKER_STALE_S = 60
    pool = gpu_pool()
    now = timezone.now()
    make_worker(queues=("pool.h200",), devices=cuda_devices(8), now=now)
    job = make_job(
        pool=pool,
        stages=("fetch", "plan", "operators"),
        statuses={"fetch": "succeeded", "plan": "succeeded", "operators": "running"},
        results={"plan": {"devices": 4}},
    )
    set_times(job, "operators", started_at=now - timedelta(seconds=1))

    fits = plan_start_estimate(pool=pool, devices=4, now=now)
    assert fits.can_start_now is True
    assert (fits.devices_held, fits.devices_free) == (4, 4)
    assert fits.estimated_start_at.isoformat() == now.isoformat()
    assert reason(fits) == "4 of 8 devices free and no job waiting ahead: it can start now"

    whole = plan_start_estimate(pool=pool, devices=8, now=now)
    assert whole.can_start_now is False and whole.queue_position == 0
    assert whole.median_stage_s == 3.0 and whole.history_stages == 2
    assert whole.estimated_wait_s == 2.0  # 3 s median - 1 s so far, no stage after it

    # Its own plan does not wait for itself.
    own = plan_start_estimate(pool=pool, devices=8, job=job, now=now)
    assert own.can_start_now is True and own.devices_held == 0


def test_estimate_says_when_the_pool_is_too_small(settings):
    pool = gpu_pool()
    make_worker(queues=("pool.h200",), devices=cuda_devices(8))
    answer = plan_start_estimate(pool=pool, devices=16)
    assert answer.can_start_now is False
    assert answer.estimated_start_at is None
    assert reason(answer) == (
        "needs 16 devices, live workers report 8: the pool is too small as it is now"
    )


def test_estimate_without_a_live_worker(settings):
    settings.DAY0_WORKER_STALE_S = 60
    pool = cpu_pool()
    make_worker(heartbeat_age_s=120)
    answer = plan_start_estimate(pool=pool, devices=1)
    assert answer.can_start_now is False
    assert answer.devices_reported == 0
    assert answer.estimated_start_at is None
    assert reason(answer) == (
        "no live worker on pool cpu (queue pool.cpu): jobs wait until one starts"
    )
    assert basis(answer).startswith("no estimate")


def test_estimate_without_history_invents_no_number():
    pool = cpu_pool()
    make_worker()
    make_job(pool=pool, statuses={"fetch": "running"})
    answer = plan_start_estimate(pool=pool, devices=1)
    assert answer.can_start_now is False
    assert answer.estimated_start_at is None and answer.estimated_wait_s is None
    assert basis(answer) == "no estimate: no finished stage on this pool yet"


def test_estimate_refuses_a_device_count_below_one():
    with pytest.raises(ValueError, match="positive integer"):
        plan_start_estimate(pool=cpu_pool(), devices=0)


# --- which devices count: backend pools, the cpu pool, manifest pools ----------------------


def manifest_pool(**fields) -> AcceleratorPool:
    defaults = {
        "name": "gaudi3",
        "backend": "manifest",
        "device": "cpu",
        "accelerator": "gaudi3",
        "devices_per_node": 8,
        "nodes": 2,
    }
    return AcceleratorPool.objects.create(**{**defaults, **fields})


def test_a_manifest_pools_devices_are_its_declared_layout_not_its_workers_cpu(settings):
    """A manifest pool's worker is not on the accelerator: the one cpu device torch sees
    there says nothing of the 8 x 2 Gaudi 3 the pool declares."""
    settings.DAY0_WORKER_STALE_S = 60
    pool = manifest_pool()
    now = timezone.now()
    make_worker(name="manifest@box", queues=("pool.gaudi3",), now=now)  # one cpu device

    inv = pool_inventory(pool=pool, now=now)

    assert inv.has_live_worker
    assert inv.declares_devices and inv.devices_declared == 16
    assert inv.devices_reported == 16 and inv.devices_free == 16
    assert devices_counted(inv.declares_devices) == (
        "declared (manifest pool: its accelerators are not attached to a worker here)"
    )
    assert warnings(inv) == []
    answer = plan_start_estimate(pool=pool, devices=16, now=now)
    assert answer.can_start_now is True and answer.devices_reported == 16
    assert devices_counted(answer.devices_declared) == devices_counted(inv.declares_devices)
    too_big = plan_start_estimate(pool=pool, devices=24, now=now)
    assert reason(too_big) == (
        "needs 24 devices, the pool declares 16: the pool is too small as it is now"
    )


def test_a_manifest_pool_without_a_live_worker_still_waits(settings):
    """Declared devices do not take jobs from the queue: without a live worker the plan
    waits, as on any pool."""
    settings.DAY0_WORKER_STALE_S = 60
    pool = manifest_pool()
    make_worker(queues=("pool.gaudi3",), heartbeat_age_s=120)

    inv = pool_inventory(pool=pool)
    answer = plan_start_estimate(pool=pool, devices=8)

    assert not inv.has_live_worker and inv.devices_reported == 16
    assert answer.can_start_now is False and answer.estimated_start_at is None
    assert reason(answer) == (
        "no live worker on pool gaudi3 (queue pool.gaudi3): jobs wait until one starts"
    )


def test_a_backend_pool_counts_only_workers_of_its_backend_and_says_so(settings):
    """A cpu-only worker listening on an h200 pool's queue reports its host, not an H200:
    its device does not count, and the pool says both that and that its layout declares
    more than the live workers report."""
    settings.DAY0_WORKER_STALE_S = 60
    pool = gpu_pool()  # h200: 8 per node (the catalog's), 1 node
    now = timezone.now()
    make_worker(name="h200@gpu", queues=("pool.h200",), devices=cuda_devices(1), now=now)
    make_worker(name="h200@laptop", queues=("pool.h200",), now=now)  # backend cpu

    inv = pool_inventory(pool=pool, now=now)

    assert [s.worker.name for s in inv.counted_workers] == ["h200@gpu"]
    assert inv.devices_reported == 1 and devices_counted(inv.declares_devices) == "reported"
    assert warnings(inv) == [
        "worker h200@laptop runs on cpu, not cuda: its 1 device is not counted",
        "layout says 8 per node x 1 node; live workers report 1",
    ]
    answer = plan_start_estimate(pool=pool, devices=2, now=now)
    assert reason(answer) == (
        "needs 2 devices, live workers report 1: the pool is too small as it is now"
    )


def test_a_warning_is_the_pages_words_and_the_api_reads_them_unescaped():
    """The API's text is the page's template rendered from the same warning as plain text:
    a worker's name the page must escape reaches the API as it is, not as HTML entities."""
    warning = DeviceWarning(
        kind="other-backend", pool_backend="cuda", worker="h200@r&d<1>", backend="", devices=2
    )
    assert device_warning_text(warning) == (
        "worker h200@r&d<1> runs on an unreported backend, not cuda: its 2 devices are not counted"
    )
    page = render_to_string("adaptation/partials/device_warning.txt", {"warning": warning})
    assert "worker h200@r&amp;d&lt;1&gt; runs on an unreported backend" in page


def test_a_pool_whose_workers_report_its_layout_has_no_warning(settings):
    settings.DAY0_WORKER_STALE_S = 60
    pool = gpu_pool(nodes=2)
    for node in ("a", "b"):
        make_worker(name=f"h200@{node}", queues=("pool.h200",), devices=cuda_devices(8))
    inv = pool_inventory(pool=pool)
    assert inv.devices_reported == 16 and warnings(inv) == []


def test_the_cpu_pool_counts_each_live_workers_machine_once(settings):
    """The cpu pool's device is its worker's whole machine, whatever accelerators that
    machine has: a GPU host serving pool.cpu is one device, not eight."""
    settings.DAY0_WORKER_STALE_S = 60
    pool = cpu_pool()
    make_worker(name="cpu@gpu-host", queues=("pool.cpu",), devices=cuda_devices(8))
    make_worker(name="cpu@box")
    inv = pool_inventory(pool=pool)
    assert inv.devices_reported == 2
    assert warnings(inv) == []
