"""The pools page in real Chromium: a pool without a live worker says so, one with a live
worker lists it, from the nav."""

from __future__ import annotations

import pytest

from adaptation.models import AcceleratorPool, StageRun
from adaptation.roles import MANAGER, role_grant
from tests.factories import cpu_pool, make_job
from tests.worker_rows import cuda_devices, make_worker

POOLS_SCREENSHOT = "/tmp/day0-pools.png"

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_pools_page_shows_the_no_live_worker_badge(live_server, page, django_user_model):
    from playwright.sync_api import expect

    cpu_pool()  # a transactional test's flush removed the migration's row
    make_job(statuses={"fetch": "queued"})
    h200 = AcceleratorPool.objects.create(
        name="h200", backend="cuda", device="cuda:0", accelerator="h200"
    )
    make_worker(
        name="h200@gpu-node-7", queues=("pool.h200",), backend="cuda", devices=cuda_devices(8)
    )
    make_worker(name="h200@laptop", queues=("pool.h200",))  # a cpu machine on the h200 queue
    AcceleratorPool.objects.create(
        name="gaudi3", backend="manifest", accelerator="gaudi3", devices_per_node=8, nodes=2
    )
    make_worker(name="manifest@box", queues=("pool.gaudi3",))
    running = make_job(pool=h200, statuses={"fetch": "running"})
    StageRun.objects.filter(job=running).update(worker_host="h200@gpu-node-7")
    ada = django_user_model.objects.create_user(username="ada", password="correct horse battery")
    role_grant(user=ada, role=MANAGER)  # pages need a role to read

    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill("ada")
    page.get_by_label("Password").fill("correct horse battery")
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("link", name="Pools").click()

    pool = page.locator("#pool-cpu")
    expect(pool.locator(".no-live-worker")).to_have_text("No live worker")
    expect(pool).to_contain_text("jobs for this pool wait until one starts")
    expect(page.get_by_role("link", name="Pools")).to_have_attribute("aria-current", "page")
    live = page.locator("#pool-h200")
    expect(live).to_contain_text("2 live workers")
    expect(live.locator(".device-warning")).to_have_text(
        ["worker h200@laptop runs on cpu, not cuda: its 1 device is not counted"]
    )
    expect(live.locator(".pool-devices")).to_contain_text("8 reported")
    manifest = page.locator("#pool-gaudi3")
    expect(manifest.locator(".pool-devices")).to_contain_text(
        "16 declared (manifest pool: its accelerators are not attached to a worker here)"
    )
    expect(live.locator(".no-live-worker")).to_have_count(0)
    expect(live.get_by_role("link", name=running.release.repo_id)).to_be_visible()
    page.screenshot(path=POOLS_SCREENSHOT, full_page=True)
