"""The pools page on a busy day: the same number of queries for one active job or
twenty, each job's plan devices still counted, and what each worker runs still named."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from adaptation.models import AcceleratorPool, StageRun
from tests import dom
from tests.factories import make_job
from tests.worker_rows import cuda_devices, make_worker

pytestmark = pytest.mark.django_db

POOLS = reverse("adaptation:pool_list")


def planned_job(pool: AcceleratorPool, *, running: bool) -> None:
    """A job whose plan chose 2 devices, its operators stage running (on worker h200@a) or
    queued."""
    job = make_job(
        pool=pool,
        stages=("fetch", "plan", "operators"),
        statuses={
            "fetch": "succeeded",
            "plan": "succeeded",
            "operators": "running" if running else "queued",
        },
        results={"plan": {"devices": 2, "tp": 2}, "fetch": {"files": ["x"] * 500}},
    )
    StageRun.objects.filter(job=job, stage="operators").update(worker_host="h200@a")


def test_the_pools_page_asks_the_same_queries_for_one_active_job_or_twenty(logged_in_client):
    pool = AcceleratorPool.objects.create(
        name="h200", backend="cuda", device="cuda:0", accelerator="h200"
    )
    make_worker(name="h200@a", queues=("pool.h200",), devices=cuda_devices(8))
    planned_job(pool, running=True)
    logged_in_client.get(POOLS)  # per-process caches warmed
    with CaptureQueriesContext(connection) as one:
        first = dom.text(logged_in_client.get(POOLS))
    for n in range(19):
        planned_job(pool, running=n < 2)  # three running in all, seventeen waiting
    with CaptureQueriesContext(connection) as twenty:
        busy = dom.text(logged_in_client.get(POOLS))

    assert len(twenty) == len(one), [query["sql"] for query in twenty.captured_queries]
    # No query reads a stored result whole: only the plan's devices, in the database.
    selects = [q["sql"] for q in twenty.captured_queries if "adaptation_stagerun" in q["sql"]]
    whole = re.compile(r'"adaptation_stagerun"\."result"(,\s*"|\s+FROM)')  # a selected column
    assert selects and not [sql for sql in selects if whole.search(sql)], selects
    assert "8 reported · 2 held · 6 free" in first
    assert "8 reported · 6 held · 2 free" in busy  # each running job holds its plan's 2
    assert "17 jobs waiting" in busy
    assert busy.count("· operators (job") == 3  # what h200@a runs, each named
