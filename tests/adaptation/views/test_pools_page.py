"""The pools page (workers, devices, what runs, the queue), and queued stages that say they
wait for a worker on the board and the release page."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from adaptation.models import AcceleratorPool, StageRun
from tests import dom
from tests.adaptation.views.test_board import cell_text
from tests.factories import cpu_pool, make_job, make_release
from tests.worker_rows import GIB, cuda_devices, make_worker

pytestmark = pytest.mark.django_db

POOLS = reverse("adaptation:pool_list")
WAITING_CPU = "waiting: no live worker for pool cpu (queue pool.cpu)"


def pool_section(html: str, name: str) -> str:
    """The markup of the pools page's section for pool `name`."""
    return dom.find(html, f"section.pool#pool-{name}").html


def worker_row(html: str, name: str) -> str:
    """The markup of the row of worker `name` (its class starts with "worker")."""
    return dom.find(html, f'tr[class^="worker"][data-worker="{name}"]').html


def test_pools_page_requires_login(client):
    response = client.get(POOLS)
    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


def test_a_pool_without_live_worker_says_its_jobs_wait(logged_in_client, settings):
    settings.DAY0_WORKER_STALE_S = 60
    cpu_pool()
    make_worker(name="cpu@gone", stopped=True, heartbeat_age_s=400)
    make_job(statuses={"fetch": "queued"})

    html = logged_in_client.get(POOLS).content.decode()

    section = pool_section(html, "cpu")
    assert '<span class="badge status-failed no-live-worker">No live worker</span>' in section
    assert "jobs for this pool wait until one starts (1 stage waiting)" in dom.text(section)
    row = worker_row(section, "cpu@gone")
    assert "worker-inactive" in row and "stopped" in dom.text(row)
    assert 'data-live-workers="0"' in section


def test_live_worker_shows_devices_heartbeat_and_what_it_runs(logged_in_client):
    pool = AcceleratorPool.objects.create(
        name="h200", backend="cuda", device="cuda:0", accelerator="h200", nodes=2
    )
    now = timezone.now()
    make_worker(
        name="h200@gpu-node-7",
        hostname="gpu-node-7",
        queues=("pool.h200",),
        backend="cuda",
        devices=cuda_devices(2),
        cpu_cores=192,
        memory_bytes=2048 * GIB,
        heartbeat_age_s=4,
        now=now,
    )
    release = make_release(repo_id="deepseek-ai/DeepSeek-V3")
    job = make_job(release=release, pool=pool, statuses={"fetch": "running"})
    StageRun.objects.filter(job=job).update(worker_host="h200@gpu-node-7")
    for age in (30, 200):
        queued = make_job(pool=pool, statuses={"fetch": "queued"})
        StageRun.objects.filter(job=queued, stage="fetch").update(
            queued_at=now - timedelta(seconds=age)
        )

    html = logged_in_client.get(POOLS).content.decode()

    section = pool_section(html, "h200")
    assert "No live worker" not in section
    assert "1 live worker" in dom.text(section)
    assert "h200: 8 per node \N{MULTIPLICATION SIGN} 2 nodes" in dom.text(section)
    row = worker_row(section, "h200@gpu-node-7")
    row_text = dom.text(row)
    assert "2 \N{MULTIPLICATION SIGN} NVIDIA H200 · 141.0 GiB" in row_text
    assert "192" in row_text and "2,048.0 GiB" in row_text
    assert re.search(r"\b[45] s ago\b", row_text)
    assert f'href="{reverse("adaptation:release_detail", args=[release.pk])}"' in row
    assert "deepseek-ai/DeepSeek-V3 · fetch" in row_text
    assert "2 reported · 1 held · 1 free" in dom.text(section)
    assert re.search(
        r"2 stages queued; oldest waiting 3 m 2\d s · 2 jobs waiting", dom.text(section)
    )


def test_cpu_pool_describes_the_machine_its_worker_measured(logged_in_client):
    cpu_pool()
    make_worker(name="cpu@box", cpu_cores=96, memory_bytes=512 * GIB)
    section = dom.text(pool_section(logged_in_client.get(POOLS).content.decode(), "cpu"))
    assert "cpu: 1 per node \N{MULTIPLICATION SIGN} 1 node" in section
    assert "the machine its worker runs on: 96 cores, 512.0 GiB (cpu@box, measured at start)" in (
        section
    )


def test_unknown_accelerator_kind_is_shown_not_raised(logged_in_client):
    AcceleratorPool.objects.create(name="mystery", backend="cuda", accelerator="tpu-v9")
    response = logged_in_client.get(POOLS)
    assert response.status_code == 200
    assert "tpu-v9" in dom.text(pool_section(response.content.decode(), "mystery"))


def test_htmx_poll_gets_only_the_live_part(logged_in_client):
    cpu_pool()
    response = logged_in_client.get(POOLS, headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="pools-live"')
    assert "<html" not in html
    assert f'hx-get="{POOLS}"' in html and 'hx-trigger="every 5s"' in html
    assert "HX-Request" in response.headers["Vary"]


def test_nav_links_to_the_pools_page(logged_in_client):
    html = logged_in_client.get(POOLS).content.decode()
    assert f'<a href="{POOLS}" aria-current="page">Pools</a>' in html


# --- queued stages wait visibly -------------------------------------------------------------


def test_board_says_a_queued_stage_waits_for_a_worker(logged_in_client, settings):
    settings.DAY0_WORKER_STALE_S = 60
    job = make_job(statuses={"fetch": "queued"})
    StageRun.objects.filter(job=job).update(started_at=None)  # queued: not started yet
    make_worker(name="cpu@stale", heartbeat_age_s=120)

    html = logged_in_client.get(reverse("adaptation:board")).content.decode()
    assert cell_text(html, job.release.pk, "fetch") == WAITING_CPU

    make_worker(name="cpu@live")
    html = logged_in_client.get(reverse("adaptation:board")).content.decode()
    assert cell_text(html, job.release.pk, "fetch") == "Queued"


def test_release_page_says_a_queued_stage_waits_for_a_worker(logged_in_client):
    job = make_job(statuses={"fetch": "queued"})
    url = reverse("adaptation:release_detail", args=[job.release.pk])

    html = logged_in_client.get(url).content.decode()
    run = StageRun.objects.get(job=job, stage="fetch")
    assert WAITING_CPU in dom.text(html, f"tbody#run-{run.pk}")

    make_worker(name="cpu@live")
    html = logged_in_client.get(url).content.decode()
    block = dom.find(html, f"tbody#run-{run.pk}")
    assert WAITING_CPU not in block.html and "Queued" in block.text


def test_board_asks_for_live_workers_once_per_page(logged_in_client):
    """Marking queued stages costs the same few queries for one release or twenty."""
    make_job(statuses={"fetch": "queued"})
    with CaptureQueriesContext(connection) as one:
        logged_in_client.get(reverse("adaptation:board"))
    for _ in range(19):
        make_job(statuses={"fetch": "queued"})
    with CaptureQueriesContext(connection) as twenty:
        logged_in_client.get(reverse("adaptation:board"))
    worker_queries = [q for q in twenty.captured_queries if '"adaptation_worker"' in q["sql"]]
    assert len(worker_queries) == 1
    assert len(twenty.captured_queries) == len(one.captured_queries)


def test_a_manifest_pool_shows_its_declared_devices(logged_in_client, settings):
    """Its worker is not on the accelerator: the page counts the pool's layout, labelled
    declared, and still says when no worker takes its jobs."""
    settings.DAY0_WORKER_STALE_S = 60
    AcceleratorPool.objects.create(
        name="ascend", backend="manifest", accelerator="ascend-910b", devices_per_node=8, nodes=2
    )
    make_worker(name="manifest@gone", queues=("pool.ascend",), heartbeat_age_s=300)

    section = dom.text(pool_section(logged_in_client.get(POOLS).content.decode(), "ascend"))

    assert (
        "16 declared (manifest pool: its accelerators are not attached to a worker here) "
        "· 0 held · 16 free"
    ) in section
    assert "No live worker" in section and "jobs for this pool wait until one starts" in section


def test_a_backend_pool_warns_when_its_workers_and_layout_disagree(logged_in_client):
    AcceleratorPool.objects.create(name="h200", backend="cuda", device="cuda:0", accelerator="h200")
    make_worker(name="h200@gpu", queues=("pool.h200",), devices=cuda_devices(1))
    make_worker(name="h200@laptop", queues=("pool.h200",))  # a cpu machine on the queue

    html = pool_section(logged_in_client.get(POOLS).content.decode(), "h200")

    warnings = dom.texts(html, 'li[class="device-warning"]')
    assert warnings == [
        "worker h200@laptop runs on cpu, not cuda: its 1 device is not counted",
        "layout says 8 per node x 1 node; live workers report 1",
    ]
    assert "1 reported · 0 held · 1 free" in dom.text(html)
