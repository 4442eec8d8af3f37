"""The pools page and the API show each pool's software stack, the live workers serving it
with another, and its latest stack changes with the suite run each started; the page asks
the same queries for one change or many."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from adaptation.models import AcceleratorPool, StackChange, SuiteRun, SuiteTrigger
from tests import dom
from tests.adaptation.api.conftest import results
from tests.factories import cpu_pool
from tests.worker_rows import cuda_devices, make_worker

pytestmark = pytest.mark.django_db

POOLS = reverse("adaptation:pool_list")


def stack_section(html: str, pool: str) -> str:
    """The markup of the pools page's stack block for `pool`."""
    return dom.find(html, f"div.pool-stack#pool-{pool}-stack").html


def cpu_stack(vllm: str) -> dict[str, Any]:
    return {"torch": "2.13.0+cpu", "driver": None, "engine": {"vllm": vllm, "torch": "2.13.0+cpu"}}


def software(vllm: str, pool: str = "cpu") -> dict[str, Any]:
    """A worker row's software once it reported its stack."""
    return {
        "torch": "2.13.0+cpu",
        "python": "3.11.7",
        "celery": "5.7.0",
        "driver": None,
        "engines": {pool: {"vllm": vllm, "torch": "2.13.0+cpu"}},
    }


def upgraded_cpu_pool() -> tuple[AcceleratorPool, SuiteRun]:
    """The cpu pool first reported on vLLM 0.32.0, then upgraded to 0.33.1 by cpu@new,
    which started a suite run; cpu@old, still live, serves with 0.32.0."""
    pool = cpu_pool()
    pool.stack = cpu_stack("0.33.1")
    pool.save(update_fields=["stack"])
    now = timezone.now()
    make_worker(name="cpu@old", software=software("0.32.0"), started_at=now - timedelta(hours=2))
    make_worker(name="cpu@new", software=software("0.33.1"), started_at=now - timedelta(hours=1))
    StackChange.objects.create(
        pool=pool,
        worker_name="cpu@old",
        detected_at=now - timedelta(hours=2),
        previous={},
        current=cpu_stack("0.32.0"),
    )
    run = SuiteRun.objects.create(
        suite="standard", pool=pool, trigger=SuiteTrigger.STACK_UPGRADE, stack=pool.stack
    )
    StackChange.objects.create(
        pool=pool,
        worker_name="cpu@new",
        detected_at=now - timedelta(hours=1),
        previous=cpu_stack("0.32.0"),
        current=cpu_stack("0.33.1"),
        suite_run=run,
    )
    return pool, run


def test_the_pools_page_shows_the_stack_the_differing_worker_and_the_changes(logged_in_client):
    _, run = upgraded_cpu_pool()

    html = logged_in_client.get(POOLS).content.decode()

    section = stack_section(html, "cpu")
    words = dom.text(section)
    assert (
        "Stack torch 2.13.0+cpu · no accelerator driver (a cpu host) · vllm 0.33.1, the "
        "engine's torch 2.13.0+cpu" in words
    )
    assert "cpu@old serves this pool with vllm 0.32.0 (the pool's: 0.33.1)" in words
    assert "cpu@new serves" not in words
    rows = dom.find_all(section, 'tr[class^="stack-change"]')
    assert len(rows) == 2  # newest first
    assert "cpu@new vllm 0.32.0 → 0.33.1" in dom.text(rows[0])
    links = {a.text: a["href"] for a in rows[0].select("a[href]")}
    assert links[f"run {run.pk}"] == reverse("adaptation:suite_run", args=[run.pk])
    assert "first reported: torch 2.13.0+cpu" in dom.text(rows[1])
    assert "none: a first report starts nothing" in dom.text(rows[1])


def test_a_pool_without_a_report_and_a_cuda_driver_are_worded(logged_in_client):
    cpu_pool()
    gpu = AcceleratorPool.objects.create(
        name="h200", backend="cuda", device="cuda:0", accelerator="h200"
    )
    gpu.stack = {
        "torch": "2.8.0+cu128",
        "driver": {"cuda": "12.8", "nvidia": "570.133.20"},
        "engine": {},
    }
    gpu.save(update_fields=["stack"])
    make_worker(name="gpu@a", queues=("pool.h200",), devices=cuda_devices(8))

    html = logged_in_client.get(POOLS).content.decode()

    assert "not reported yet" in dom.text(stack_section(html, "cpu"))
    assert (
        "torch 2.8.0+cu128 · CUDA 12.8, NVIDIA driver 570.133.20 · no serving engine"
        in dom.text(stack_section(html, "h200"))
    )


def test_the_page_asks_the_same_queries_for_one_change_or_many(logged_in_client):
    upgraded_cpu_pool()
    logged_in_client.get(POOLS)  # per-process caches warmed
    with CaptureQueriesContext(connection) as one_pool:
        logged_in_client.get(POOLS)

    for n in range(2, 5):
        other = AcceleratorPool.objects.create(name=f"cpu-{n}", backend="cpu")
        other.stack = cpu_stack(f"0.3{n}.0")
        other.save(update_fields=["stack"])
        make_worker(name=f"cpu@{n}", queues=(other.queue,), software=software("0.1", other.name))
        for k in range(6):
            StackChange.objects.create(
                pool=other, worker_name=f"cpu@{n}", previous=cpu_stack(str(k)),
                current=cpu_stack(str(k + 1)),
            )  # fmt: skip
    with CaptureQueriesContext(connection) as four_pools:
        html = logged_in_client.get(POOLS).content.decode()

    assert len(four_pools) == len(one_pool), [q["sql"] for q in four_pools.captured_queries]
    for n in range(2, 5):  # each pool lists its 3 latest changes only
        assert stack_section(html, f"cpu-{n}").count('<tr class="stack-change') == 3


def test_the_api_lists_each_pools_stack_and_its_workers_software(cast):
    pool, _ = upgraded_cpu_pool()

    [listed] = [p for p in results(cast.api("mona").get("/api/v1/pools/")) if p["name"] == "cpu"]

    assert listed["stack"] == cpu_stack("0.33.1")
    by_name = {worker["name"]: worker for worker in listed["workers"]}
    assert by_name["cpu@old"]["software"]["engines"]["cpu"]["vllm"] == "0.32.0"
    detail = cast.api("mona").get(f"/api/v1/pools/{pool.pk}/").json()
    assert detail["stack"] == cpu_stack("0.33.1")
