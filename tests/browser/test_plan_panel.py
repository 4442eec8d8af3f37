"""The release page's distributed plan panel and the compare-pools page in real Chromium:
plotly draws the memory chart, the copy buttons copy, the comparison table renders."""

from __future__ import annotations

import pytest

from adaptation.models import AcceleratorPool
from tests.conftest import load_realconfig
from tests.factories import make_job, make_release
from workers.catalog import load_catalog
from workers.stages.architecture import analyze_config
from workers.stages.plan import PoolLayout, plan_release

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

REPO = "deepseek-ai/DeepSeek-V3"
USERNAME, PASSWORD = "planner", "plan-the-pools"


def log_in(page, live_server, django_user_model) -> None:
    django_user_model.objects.create_user(username=USERNAME, password=PASSWORD)
    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill(USERNAME)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/")


def planned_release():
    """DeepSeek-V3 analysed and planned by the engine on one node of eight H200s."""
    AcceleratorPool.objects.get_or_create(
        name="cpu", defaults={"backend": "cpu", "queue": "pool.cpu"}
    )
    pool = AcceleratorPool.objects.create(
        name="h200x8", backend="cuda", device="cuda:0", accelerator="h200", devices_per_node=8
    )
    analysis = analyze_config(load_realconfig("deepseek-ai__DeepSeek-V3")).to_dict()
    plan = plan_release(analysis, PoolLayout("h200", 8), release=REPO).to_dict()
    release = make_release(repo_id=REPO)
    job = make_job(
        release=release,
        pool=pool,
        stages=("fetch", "analyze", "plan"),
        statuses={"fetch": "succeeded", "analyze": "succeeded", "plan": "succeeded"},
        results={"analyze": analysis, "plan": plan},
    )
    return release, job, plan


def test_plan_panel_draws_its_charts_and_copies_the_launch_command(
    live_server, browser, django_user_model
):
    from playwright.sync_api import expect

    release, job, plan = planned_release()
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    context.set_default_timeout(10_000)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        log_in(page, live_server, django_user_model)
        page.goto(f"{live_server.url}/releases/{release.pk}/")

        stem = f"plan-job-{job.pk}"
        memory = page.locator(f"#{stem}-memory-chart")
        expect(memory.locator("svg.main-svg").first).to_be_visible()
        expect(memory.locator(".legendtext", has_text="weights (predicted)")).to_have_count(1)
        expect(memory.locator(".gtitle")).to_have_text("Memory per device (predicted)")
        for name in ("decode", "prefill", "scaling"):
            expect(page.locator(f"#{stem}-{name}-chart svg.main-svg").first).to_be_visible()
        page.locator(f"#{stem}").screenshot(path="/tmp/day0-plan-panel.png")

        button = page.locator(f'button[data-copy-target="{stem}-artifact-vllm"]')
        expect(button).to_have_text("Copy")
        button.click()
        expect(button).to_have_text("Copied")
        assert page.evaluate("navigator.clipboard.readText()") == plan["artifacts"]["vllm"]
        expect(button).to_have_text("Copy")  # back after a moment
        assert not errors, errors
    finally:
        context.close()


def test_compare_pools_page_renders_its_table(live_server, page, django_user_model):
    from playwright.sync_api import expect

    release, _job, _plan = planned_release()
    log_in(page, live_server, django_user_model)
    page.goto(f"{live_server.url}/releases/{release.pk}/")
    page.locator("#compare-pools-link").click()
    page.wait_for_url(f"{live_server.url}/releases/{release.pk}/compare-pools/")

    rows = page.locator("#compare-pools-table tbody tr")
    expect(rows).to_have_count(len(load_catalog().kinds()) + 2)  # + the cpu and h200x8 pools
    expect(rows.first).to_have_class("fits best")
    h100 = page.locator('#compare-pools-table tr[data-name="h100"]')
    expect(h100.locator("td.verdict")).to_have_text("needs 2 nodes (16 devices)")
    expect(page.locator("#compare-pools-chart svg.main-svg").first).to_be_visible()

    page.get_by_label("Context (tokens)").fill("8192")
    page.get_by_label("Serving dtype").select_option("fp8")
    page.get_by_role("button", name="Plan again").click()
    page.wait_for_url(
        f"{live_server.url}/releases/{release.pk}/compare-pools/?context=8192&concurrency=&dtype=fp8"
    )
    expect(page.locator(".provenance")).to_contain_text("8,192 tokens of context")
    page.screenshot(path="/tmp/day0-compare-pools.png", full_page=True)
