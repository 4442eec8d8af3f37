"""The suite matrix in real Chromium: an engineer starts the standard suite from the pools
page, its jobs' cheap stages run (in this process, as a worker would), and the matrix shows
each entry by stage with cells linked to the stages; a second run after a stack change links
to the first. At 1400 and 1024 px the table renders without overflowing the page, and the
stage headers wrap within their columns: none overlaps another or is cut."""

from __future__ import annotations

import re

import pytest

from adaptation.models import AdaptationJob, SuiteRun, SuiteTrigger
from adaptation.presenters.stages import stage_title
from adaptation.roles import ENGINEER, role_grant
from adaptation.services.suites import suite_start
from engine.registry import stage_names
from engine.suites import suite_load
from tests.factories import cpu_pool
from tests.helpers import run_queued_stages

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

USERNAME, PASSWORD = "eli", "matrix-of-releases"
FAST = ["fetch", "analyze", "plan"]
TITLES = ["Fetch & parse", "Architecture analysis", "Plan the split (predicted)"]


def run_jobs(run: SuiteRun) -> None:
    for job in AdaptationJob.objects.filter(suite_run=run).order_by("pk"):
        run_queued_stages(job)


def fits(page) -> dict[str, int]:
    """The page's and the matrix wrapper's widths: what would overflow shows here."""
    return page.evaluate(
        """() => {
            const scroll = document.querySelector('.suite-scroll');
            return {
                page: document.documentElement.scrollWidth,
                viewport: window.innerWidth,
                table: scroll.scrollWidth,
                wrapper: scroll.clientWidth,
            };
        }"""
    )


def headers(page) -> list[dict]:
    """Each header cell of the matrix: its box, its text's box (a range over its contents:
    where the text is drawn, overflow included) and its scroll and client widths."""
    return page.evaluate(
        """() => [...document.querySelectorAll('#suite-matrix thead th')].map((th) => {
            const range = document.createRange();
            range.selectNodeContents(th);
            const box = th.getBoundingClientRect();
            const text = range.getBoundingClientRect();
            return {
                label: th.textContent.trim(),
                cell: [box.left, box.top, box.right, box.bottom],
                text: [text.left, text.top, text.right, text.bottom],
                scrollWidth: th.scrollWidth,
                clientWidth: th.clientWidth,
            };
        })"""
    )


def overlap(a: list[float], b: list[float]) -> bool:
    """Whether two [left, top, right, bottom] boxes share more than an edge (0.5 px)."""
    return min(a[2], b[2]) - max(a[0], b[0]) > 0.5 and min(a[3], b[3]) - max(a[1], b[1]) > 0.5


def assert_headers_readable(page, width: int) -> None:
    """No header cell, nor the text drawn in it, overlaps another; each header's text stays
    inside its cell, none cut."""
    cells = headers(page)
    for i, one in enumerate(cells):
        assert one["scrollWidth"] <= one["clientWidth"], (width, one)
        left, top, right, bottom = one["cell"]
        t_left, t_top, t_right, t_bottom = one["text"]
        assert left - 0.5 <= t_left and t_right <= right + 0.5, (width, one)
        assert top - 0.5 <= t_top and t_bottom <= bottom + 0.5, (width, one)
        for other in cells[i + 1 :]:
            assert not overlap(one["cell"], other["cell"]), (width, one, other)
            assert not overlap(one["text"], other["text"]), (width, one, other)


def test_suite_matrix_page(live_server, page, django_user_model):
    from playwright.sync_api import expect

    pool = cpu_pool()  # a transactional test's flush removed the migration's row
    pool.stack = {"torch": "2.5.1+cpu"}
    pool.save(update_fields=["stack"])
    eli = django_user_model.objects.create_user(username=USERNAME, password=PASSWORD)
    role_grant(user=eli, role=ENGINEER)
    entries = suite_load("standard").entries

    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill(USERNAME)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("link", name="Pools").click()
    page.locator("#suite-run-cpu").click()  # the pools page's button: every stage
    expect(page.locator("#suite-matrix")).to_be_visible()
    first = SuiteRun.objects.get()
    assert page.url.endswith(f"/suite-runs/{first.pk}/")
    expect(page.locator(".message-success")).to_contain_text(f"Suite run {first.pk} started")
    # Nothing ran yet: each entry's first stage is queued, the rest pending.
    expect(page.locator("#suite-matrix tbody tr")).to_have_count(len(entries))
    expect(page.locator('td[data-stage="fetch"][data-state="queued"]')).to_have_count(len(entries))

    # The second run, after a stack upgrade, runs the cheap stages to their end.
    pool.stack = {"torch": "2.6.0+cpu"}
    pool.save(update_fields=["stack"])
    second = suite_start(pool=pool, trigger=SuiteTrigger.STACK_UPGRADE, stages=FAST)
    run_jobs(second)
    assert second.previous_id == first.pk

    for width in (1400, 1024):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{live_server.url}/pools/cpu/suites/standard/")
        matrix = page.locator("#suite-matrix")
        expect(matrix).to_be_visible()
        expect(page.get_by_role("heading", name="Run " + str(second.pk))).to_be_visible()
        expect(matrix.locator("thead th")).to_have_text(["Family shape · release", *TITLES])
        expect(matrix.locator("tbody tr")).to_have_count(len(entries))
        expect(page.locator("#suite-previous")).to_have_text(f"run {first.pk}")
        expect(page.get_by_role("link", name="Pools")).to_have_attribute("aria-current", "page")
        expect(page.locator(".suite-facts")).to_contain_text("torch 2.5.1+cpu → 2.6.0+cpu")
        expect(page.locator(".suite-facts")).to_contain_text("stack upgrade")
        widths = fits(page)
        assert widths["page"] <= widths["viewport"], (width, widths)
        assert widths["table"] <= widths["wrapper"], (width, widths)
        assert_headers_readable(page, width)

    kimi = AdaptationJob.objects.get(suite_run=second, suite_entry="mla-moe-kimi")
    row = page.locator("#entry-mla-moe-kimi")
    expect(row.locator("th")).to_contain_text("MLA + MoE · quantized checkpoint")
    expect(row.locator("th")).to_contain_text("moonshotai/Kimi-K2-Instruct")
    plan = row.locator('td[data-stage="plan"]')
    expect(plan).to_have_attribute("data-state", "failed")
    expect(plan.locator(".failure-release")).to_have_text("release")
    for stage in FAST:
        link = row.locator(f'td[data-stage="{stage}"] a')
        expect(link).to_have_attribute(
            "href", f"/releases/{kimi.release_id}/#job-{kimi.pk}-stage-{stage}"
        )
    # Every ran cell links to its job's stage.
    links = page.locator("#suite-matrix td.suite-cell a")
    expect(links).to_have_count(len(entries) * len(FAST))
    page.screenshot(path="/tmp/day0-suite-matrix.png", full_page=True)

    plan.locator("a").click()
    expect(page).to_have_url(re.compile(rf"/releases/{kimi.release_id}/#job-{kimi.pk}-stage-plan$"))
    expect(page.locator(f"#job-{kimi.pk}-stage-plan")).to_be_attached()

    # The first run has every stage: its ten headers wrap within their columns; at 1024 px
    # the table scrolls inside its wrapper, the page itself does not.
    all_titles = [stage_title(name) for name in stage_names()]
    for width in (1400, 1024):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{live_server.url}/suite-runs/{first.pk}/")
        expect(page.locator("#suite-matrix thead th")).to_have_text(
            ["Family shape · release", *all_titles]
        )
        assert_headers_readable(page, width)
        widths = fits(page)
        assert widths["page"] <= widths["viewport"], (width, widths)
        if width == 1400:
            assert widths["table"] <= widths["wrapper"], (width, widths)
        page.screenshot(path=f"/tmp/day0-suite-matrix-all-stages-{width}.png", full_page=True)

    # The first run's page links forward nowhere but lists both runs.
    page.goto(f"{live_server.url}/suite-runs/{first.pk}/")
    history = page.locator(".suite-history")
    expect(history.get_by_role("link", name=f"run {second.pk}")).to_be_visible()
    expect(page.locator(".suite-facts")).to_contain_text("the first run of this suite on cpu")
