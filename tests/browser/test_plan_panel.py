"""The release page's distributed plan panel and the compare-pools page in real Chromium:
plotly draws the memory chart, the copy buttons copy, the comparison table renders."""

from __future__ import annotations

import pytest

from adaptation.models import AcceleratorPool
from adaptation.roles import MANAGER, role_grant
from engine.architecture import analyze_config
from engine.catalog import load_catalog
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from tests.conftest import load_realconfig
from tests.factories import make_job, make_release

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

REPO = "deepseek-ai/DeepSeek-V3"
USERNAME, PASSWORD = "planner", "plan-the-pools"


def log_in(page, live_server, django_user_model) -> None:
    user = django_user_model.objects.create_user(username=USERNAME, password=PASSWORD)
    role_grant(user=user, role=MANAGER)  # pages need a role to read
    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill(USERNAME)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/")


def planned_release(*, then: dict | None = None, errors: dict | None = None):
    """DeepSeek-V3 analysed and planned by the engine on one node of eight H200s; `then`
    ({stage: (status, result)}) adds later stages to its job, `errors` their errors."""
    AcceleratorPool.objects.get_or_create(
        name="cpu", defaults={"backend": "cpu", "queue": "pool.cpu"}
    )
    pool = AcceleratorPool.objects.create(
        name="h200x8", backend="cuda", device="cuda:0", accelerator="h200", devices_per_node=8
    )
    analysis = analyze_config(load_realconfig("deepseek-ai__DeepSeek-V3")).to_dict()
    plan = plan_release(analysis, PoolLayout("h200", 8), release=REPO).to_dict()
    then = then or {}
    release = make_release(repo_id=REPO)
    job = make_job(
        release=release,
        pool=pool,
        stages=("fetch", "analyze", "plan", *then),
        statuses={"fetch": "succeeded", "analyze": "succeeded", "plan": "succeeded"}
        | {stage: status for stage, (status, _result) in then.items()},
        results={"analyze": analysis, "plan": plan}
        | {stage: result for stage, (_status, result) in then.items()},
        errors=errors,
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
        # The scaling chart and the deployment commands are folded under one summary.
        page.locator(f"#{stem}-more summary").click()
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
    expect(rows.first).to_have_class("fits most-per-device")
    expect(page.locator(".mark-fewest-devices")).to_have_count(1)
    expect(page.locator('tr[data-name="mi300x"] .mark-fewest-devices')).to_be_visible()
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


def test_compare_pools_table_fits_a_1400_px_window(live_server, browser, django_user_model):
    """Every column of the comparison on screen at 1400 px: no sideways scrolling, the long
    failure reasons folded, the dtype short (its full label on hover)."""
    from playwright.sync_api import expect

    release, _job, _plan = planned_release()
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(10_000)
    try:
        page = context.new_page()
        log_in(page, live_server, django_user_model)
        page.goto(f"{live_server.url}/releases/{release.pk}/compare-pools/")
        table = page.locator("#compare-pools-table")
        expect(table).to_be_visible()
        widths = page.evaluate(
            """() => {
                const table = document.querySelector('#compare-pools-table');
                const scroll = table.closest('.table-scroll');
                const cells = [...table.querySelectorAll('thead th')];
                return {
                    viewport: document.documentElement.clientWidth,
                    page: document.documentElement.scrollWidth,
                    scroll: scroll.scrollWidth,
                    box: scroll.clientWidth,
                    right: Math.max(...cells.map(c => c.getBoundingClientRect().right)),
                };
            }"""
        )
        assert widths["scroll"] <= widths["box"], widths  # nothing scrolled out of the box
        assert widths["page"] <= widths["viewport"], widths
        assert widths["right"] <= widths["viewport"], widths  # the last column on screen
        cpu = page.locator('#compare-pools-table tr[data-name="cpu"]')
        expect(cpu.locator("td.reason details")).not_to_have_attribute("open", "")
        expect(cpu.locator("td.reason .reason-text")).to_be_hidden()
        cpu.locator("td.reason summary").click()
        expect(cpu.locator("td.reason .reason-text")).to_contain_text("does not fit 1 x cpu")
        h200 = page.locator('#compare-pools-table tr[data-name="h200"] td.dtype')
        expect(h200).to_have_text("fp8 (checkpoint)")
        expect(h200).to_have_attribute("title", "checkpoint (fp8 e4m3 (128x128 blocks))")
        cpu.locator("td.reason summary").click()  # folded again for the picture
        page.screenshot(path="/tmp/day0-compare-pools-1400.png", full_page=True)
    finally:
        context.close()
