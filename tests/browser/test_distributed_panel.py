"""The release page's "Multi-device validation" panel in real Chromium: the measured scaling
point drawn on the plan's scaling chart, the per-rank table on screen at 1400 px, a killed
rank's log shown as text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.browser.test_plan_panel import log_in, planned_release

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DATA = Path(__file__).resolve().parent.parent / "data" / "distributed"


def validated_release(distributed: dict, *, status: str = "succeeded", error: str = ""):
    """DeepSeek-V3 planned on one node of eight H200s, its split validated by the stored
    `distributed` result."""
    release, job, _plan = planned_release(
        then={"distributed": (status, distributed)},
        errors={"distributed": error} if error else None,
    )
    return release, job


def test_measured_point_is_drawn_and_the_rank_table_fits(live_server, browser, django_user_model):
    from playwright.sync_api import expect

    result = json.loads((DATA / "pass.json").read_text())
    release, job = validated_release(result)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(10_000)
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        log_in(page, live_server, django_user_model)
        page.goto(f"{live_server.url}/releases/{release.pk}/")

        page.locator(f"#plan-job-{job.pk}-more summary").click()  # the scaling chart's fold
        chart = page.locator(f"#plan-job-{job.pk}-scaling-chart")
        expect(chart.locator("svg.main-svg").first).to_be_visible()
        expect(
            chart.locator(
                ".legendtext",
                has_text="scaling efficiency measured on the twin (TP=2 EP=2 vs TP=1)",
            )
        ).to_have_count(1)
        # One marker in the measured trace, drawn on the right-hand (efficiency) axis.
        expect(chart.locator(".scatterlayer .trace").nth(2).locator("path.point")).to_have_count(1)

        panel = page.locator(f"#distributed-job-{job.pk}")
        expect(panel).to_be_visible()
        expect(panel.locator(".stability-verdict")).to_contain_text("Passed")
        # Every rank passed, so their table is folded under a line that says so.
        ranks = panel.locator(f"#distributed-job-{job.pk}-ranks")
        expect(ranks.locator("summary")).to_contain_text("2 ranks, each within its tolerance")
        expect(ranks.locator("table.distributed-ranks")).to_be_hidden()
        ranks.locator("summary").click()
        expect(panel.locator("table.distributed-ranks tbody tr")).to_have_count(2)
        widths = page.evaluate(
            """(id) => {
                const table = document.querySelector(`#${id} table.distributed-ranks`);
                const scroll = table.closest('.table-scroll');
                return {
                    viewport: document.documentElement.clientWidth,
                    page: document.documentElement.scrollWidth,
                    scroll: scroll.scrollWidth,
                    box: scroll.clientWidth,
                };
            }""",
            f"distributed-job-{job.pk}",
        )
        assert widths["scroll"] <= widths["box"], widths
        assert widths["page"] <= widths["viewport"], widths
        panel.screenshot(path="/tmp/day0-distributed-panel.png")
        chart.screenshot(path="/tmp/day0-distributed-scaling.png")
        assert not errors, errors
    finally:
        context.close()


def test_a_killed_ranks_log_is_shown_as_text(live_server, page, django_user_model):
    from playwright.sync_api import expect

    stored = json.loads((DATA / "crash.json").read_text())
    result = stored["result"]
    result["rank_logs"][1]["excerpt"] += "\n<b id='injected'>not markup</b>"
    release, job = validated_release(result, status="failed", error=stored["reason"])
    log_in(page, live_server, django_user_model)
    page.goto(f"{live_server.url}/releases/{release.pk}/")

    log = page.locator(f"#distributed-job-{job.pk}-failed-log")
    expect(log).to_be_visible()
    expect(log).to_contain_text("[rank 1] injected: killing this rank with SIGKILL")
    expect(log).to_contain_text("<b id='injected'>not markup</b>")
    expect(page.locator("#injected")).to_have_count(0)
    expect(page.locator(f"#distributed-job-{job.pk} .plan-failure .verdict")).to_have_text(
        "Failed on rank 1 (TP=2)"
    )
    page.locator(f"#distributed-job-{job.pk}").screenshot(path="/tmp/day0-distributed-crash.png")
