"""Release day in real Chromium at 1400 and 1024 px: the board keeps a running full
job in sight beside a newer partial one without lowering readiness; a release page with five
jobs stays under 6,000 px, writes no "ms" figure above 100,000, draws no empty chart, and its
chart titles fit their charts."""

from __future__ import annotations

import copy
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from adaptation.models import AcceleratorPool, StageRun
from engine.architecture import analyze_config
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from tests.browser.test_plan_panel import log_in
from tests.conftest import load_realconfig
from tests.factories import make_job, make_release
from tests.serve_results import FAILED_AT_LAUNCH, served

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (1400, 1024)
REPO = "meta-llama/Llama-3.1-8B"
STAGES = ("fetch", "analyze", "plan", "serve")

# Every "<number> ms" the page writes, its own text and its charts' SVG text alike.
MS_FIGURES = r"""() => {
  const texts = [document.body.innerText,
                 ...[...document.querySelectorAll('svg text')].map(t => t.textContent)];
  const found = [];
  for (const text of texts) {
    for (const m of text.matchAll(/(\d[\d,]*(?:\.\d+)?)\s*ms\b/g)) {
      found.push(parseFloat(m[1].replace(/,/g, '')));
    }
  }
  return found;
}"""

# Each chart div: whether plotly drew it, its traces with at least one point, and any title
# (the figure's or a cell's) that sticks out of the chart's box.
CHARTS = r"""() => [...document.querySelectorAll('div.chart')].map(div => {
  const box = div.getBoundingClientRect();
  const traces = (div.data || []).filter(t =>
    [...(t.x || []), ...(t.y || [])].some(v => v !== null && v !== undefined));
  const titles = [...div.querySelectorAll('.gtitle, .annotation-text')]
    .map(t => ({text: t.textContent, rect: t.getBoundingClientRect()}))
    .filter(t => t.rect.width > 0)
    .filter(t => t.rect.left < box.left - 1 || t.rect.right > box.right + 1)
    .map(t => t.text);
  return {id: div.id, drawn: div.classList.contains('js-plotly-plot'),
          points: traces.length, overflowing: titles};
})"""


def pools():
    AcceleratorPool.objects.get_or_create(
        name="cpu", defaults={"backend": "cpu", "queue": "pool.cpu"}
    )
    return AcceleratorPool.objects.create(
        name="h200x2", backend="cuda", device="cuda:0", accelerator="h200", devices_per_node=2
    )


def five_jobs():
    """Llama-3.1-8B planned on two H200s and served, five times: the newest job and four
    older ones, one of them failed at the engine's launch (an infrastructure failure). The
    plan predicts a prefill of hours (a slow pool), which no page may write in ms."""
    pool = pools()
    analysis = analyze_config(load_realconfig("meta-llama__Llama-3.1-8B")).to_dict()
    plan = plan_release(analysis, PoolLayout("h200", 2), release=REPO).to_dict()
    slow = copy.deepcopy(plan)
    for point in slow["predicted"].get("prefill") or []:
        point["ttft_s"] = point["ttft_s"] * 5000
    release = make_release(repo_id=REPO)
    jobs = []
    for index in range(5):
        failed = index == 1
        job = make_job(
            release=release,
            pool=pool,
            stages=STAGES,
            statuses={
                "fetch": "succeeded",
                "analyze": "succeeded",
                "plan": "succeeded",
                "serve": "failed" if failed else "succeeded",
            },
            results={
                "analyze": analysis,
                "plan": slow,
                "serve": copy.deepcopy(FAILED_AT_LAUNCH) if failed else served(),
            },
            errors={"serve": "the engine did not start: port in use"} if failed else None,
            created_at=timezone.now() + timedelta(seconds=index),
        )
        if failed:
            StageRun.objects.filter(job=job, stage="serve").update(failure_class="infrastructure")
        jobs.append(job)
    return release, jobs


def reads_at_a_glance(page, *, width: int, jobs, failed, failure: str, name: str) -> int:
    """The checks of a release page with five jobs (`jobs`, oldest first) at `width` px: the
    newest job drawn in full and the others a line each, under 6,000 px, no paragraph twice,
    no "ms" figure above 100,000, every chart drawn with points and its titles inside it,
    nothing past the right edge; then `failed`'s panels a click away, saying `failure`.
    Returns the page's height (px)."""
    page.locator("#job-history").wait_for()
    page.wait_for_function(
        "() => [...document.querySelectorAll('div.chart')]"
        ".every(d => d.classList.contains('js-plotly-plot'))"
    )
    page.screenshot(path=f"/tmp/day0-release-{name}-{width}.png", full_page=True)

    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < 6000, f"{height} px tall at {width} px"
    # The newest job drawn in full, the other four a line each with a link.
    assert page.locator("article.job").count() == 1
    assert page.locator(f"#job-{jobs[-1].pk}").count() == 1
    assert page.locator("table.job-history tbody tr").count() == 5
    assert (
        page.locator(f"#history-link-{jobs[0].pk}")
        .get_attribute("href")
        .endswith(f"?job={jobs[0].pk}")
    )
    # No paragraph twice.
    paragraphs = [
        re.sub(r"\s+", " ", text).strip()
        for text in page.locator("main p").all_inner_texts()
        if len(text.strip()) > 40
    ]
    repeated = {text for text in paragraphs if paragraphs.count(text) > 1}
    assert not repeated, repeated

    figures = page.evaluate(MS_FIGURES)
    assert figures, "the page writes some times in ms"
    assert max(figures) <= 100_000, sorted(figures)[-3:]

    charts = page.evaluate(CHARTS)
    assert charts, "the page draws charts"
    for chart in charts:
        assert chart["drawn"], f"{chart['id']} was not drawn"
        assert chart["points"] > 0, f"{chart['id']} is an empty chart"
        assert not chart["overflowing"], f"{chart['id']} at {width} px: {chart['overflowing']}"
    assert page.evaluate("document.documentElement.scrollWidth") <= width

    # An older job's panels are a click away, and say whose fault its failure was.
    page.locator(f"#history-link-{failed.pk}").click()
    page.locator(f"#job-{failed.pk}").wait_for()
    assert failure in page.locator(f"#job-{failed.pk}").inner_text()
    return height


@pytest.mark.parametrize("width", WIDTHS)
def test_release_page_with_five_jobs_reads_at_a_glance(
    live_server, browser, django_user_model, width
):
    release, jobs = five_jobs()
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(15_000)
    try:
        page = context.new_page()
        log_in(page, live_server, django_user_model)
        page.goto(f"{live_server.url}/releases/{release.pk}/")
        page.locator(f"#plan-job-{jobs[-1].pk}").wait_for()
        page.locator(f"#plan-job-{jobs[-1].pk}").screenshot(path=f"/tmp/day0-plan-{width}.png")
        page.locator(f"#serve-job-{jobs[-1].pk}").screenshot(path=f"/tmp/day0-serve-{width}.png")
        reads_at_a_glance(
            page,
            width=width,
            jobs=jobs,
            failed=jobs[1],
            failure="infrastructure failure",
            name="5-jobs",
        )
    finally:
        context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_release_page_with_five_jobs_that_ran_every_stage_reads_at_a_glance(
    live_server, browser, django_user_model, width
):
    """Five jobs of every registered stage (`tests.full_jobs`): the newest passed them all,
    an older one failed its precision run (the release's fault), another could not start
    vLLM (the host's)."""
    from tests.full_jobs import FULL_STAGES, five_full_jobs

    release, jobs = five_full_jobs()
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(15_000)
    try:
        page = context.new_page()
        log_in(page, live_server, django_user_model)
        page.goto(f"{live_server.url}/releases/{release.pk}/")
        # Every stage's panel is drawn, from the newest job.
        newest = jobs[-1].pk
        for panel in (
            "analysis",
            "validation",
            f"plan-job-{newest}",
            f"distributed-job-{newest}",
            f"serve-job-{newest}",
            f"performance-job-{newest}",
            f"stability-job-{newest}",
            "release-notes",
        ):
            assert page.locator(f"#{panel}").count() == 1, panel
        assert page.locator("#panel-gaps").count() == 0
        assert len(FULL_STAGES) == page.locator(f"#job-{newest} section.stage-block").count()
        # The folds hold every figure: the performance charts are drawn in theirs.
        assert page.locator(f"#performance-job-{newest}-throughput-chart.js-plotly-plot").count()
        reads_at_a_glance(
            page,
            width=width,
            jobs=jobs,
            failed=jobs[3],
            failure="infrastructure failure",
            name="5-full-jobs",
        )
        # The precision failure shows first on its job's page: the failed stage's attempt
        # above the folded rest, the skipped stages naming it once instead of its reason.
        page.goto(f"{live_server.url}/releases/{release.pk}/?job={jobs[1].pk}")
        failed = page.locator(f"#job-{jobs[1].pk}-stage-precision")
        assert failed.is_visible()
        assert "release failure" in failed.inner_text()
        assert page.locator("#precision-drift-fold").get_attribute("open") is not None
        skipped = page.locator(f"#performance-job-{jobs[1].pk}-skipped")
        assert "the precision stage failed" in skipped.inner_text()
        reason = failed.locator("pre.error").inner_text().strip()
        assert page.locator("main").inner_text().count(reason.splitlines()[0]) == 1
    finally:
        context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_board_keeps_a_running_full_job_beside_a_newer_partial_one(
    live_server, browser, django_user_model, settings, width
):
    from playwright.sync_api import expect

    settings.DAY0_READINESS = {
        "experimental": ["fetch", "analyze"],
        "functional": ["plan"],
        "complete": ["serve"],
    }
    pool = pools()
    release = make_release(repo_id=REPO)
    full = make_job(
        release=release,
        pool=pool,
        stages=STAGES,
        statuses={
            "fetch": "succeeded",
            "analyze": "succeeded",
            "plan": "succeeded",
            "serve": "running",
        },
    )
    partial = make_job(
        release=release,
        pool=pool,
        stages=("fetch", "analyze"),
        statuses={"fetch": "succeeded", "analyze": "succeeded"},
        trigger="webhook",
        created_at=timezone.now() + timedelta(seconds=5),
    )
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(15_000)
    try:
        page = context.new_page()
        log_in(page, live_server, django_user_model)
        row = page.locator(f"#release-row-{release.pk}")
        expect(row).to_be_visible()
        page.screenshot(path=f"/tmp/day0-board-partial-{width}.png", full_page=True)

        # The running full job is named and its running stage shows, from that job.
        expect(row.locator(f"#running-job-{full.pk}")).to_be_visible()
        serve = row.locator("td[data-stage='serve']")
        expect(serve).to_contain_text("Running")
        expect(serve).to_contain_text(f"job {full.pk}")
        expect(row.locator("td[data-stage='plan']")).to_contain_text("Succeeded")
        # The partial job's own stages are its (newest), and readiness stays Functional.
        assert f"job {partial.pk}" not in row.locator("td[data-stage='analyze']").inner_text()
        readiness = row.locator("td.clock .readiness[data-pool='h200x2'] .level")
        expect(readiness).to_have_text("Functional")
        # The row's cells are on the page, not past its right edge.
        right = page.evaluate(
            f"document.querySelector('#release-row-{release.pk} td[data-stage=\"serve\"]')"
            ".getBoundingClientRect().right"
        )
        scroll = page.evaluate(
            "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        )
        assert right <= scroll
    finally:
        context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_performance_and_stability_charts_are_never_empty_and_their_titles_fit(
    live_server, browser, django_user_model, width
):
    from tests.performance_rows import DENSE, measured_job

    job = measured_job(DENSE)
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(15_000)
    try:
        page = context.new_page()
        log_in(page, live_server, django_user_model)
        page.goto(f"{live_server.url}/releases/{job.release_id}/")
        page.locator(f"#performance-job-{job.pk}-throughput-chart svg.main-svg").first.wait_for()
        page.wait_for_function(
            "() => [...document.querySelectorAll('div.chart')]"
            ".every(d => d.classList.contains('js-plotly-plot'))"
        )
        page.screenshot(path=f"/tmp/day0-release-performance-{width}.png", full_page=True)
        charts = page.evaluate(CHARTS)
        assert len(charts) >= 2
        for chart in charts:
            assert chart["points"] > 0, f"{chart['id']} is an empty chart"
            assert not chart["overflowing"], f"{chart['id']} at {width} px: {chart['overflowing']}"
        figures = page.evaluate(MS_FIGURES)
        assert not figures or max(figures) <= 100_000, sorted(figures)[-3:]
    finally:
        context.close()
