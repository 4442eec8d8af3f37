"""Log in, watch the board refresh by itself, open a release: in real Chromium."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from adaptation.models import AcceleratorPool, StageRun
from adaptation.services.jobs import job_refresh_status
from tests.factories import make_job, make_release, make_watch
from tests.sample_results import DEEPSEEK_V3_ANALYSIS, FETCH_RESULT

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

BOARD_SCREENSHOT = "/tmp/day0-board.png"
RELEASE_SCREENSHOT = "/tmp/day0-release.png"
FAILED_SCREENSHOT = "/tmp/day0-release-failed.png"
FAILED_ERROR = (
    "Traceback (most recent call last):\n"
    '  File "/work/main/workers/runner.py", line 88, in execute_stage_run\n'
    "    result = definition.run(ctx)\n"
    "engine.contract.StageFailed: config.json: num_experts_per_tok must be a positive "
    "integer, got 0"
)


def demo_releases() -> dict[str, object]:
    """Three releases in the states a Day-0 board shows: adapted, failed, running."""
    # A transactional test flushes tables after it runs, migration rows included.
    AcceleratorPool.objects.get_or_create(
        name="cpu", defaults={"backend": "cpu", "queue": "pool.cpu"}
    )
    call_command("load_demo")
    make_watch(
        name="moonshotai-org",
        last_error=(
            "2025-07-11 09:00:00 UTC: the Hub answered 429 Too Many Requests (next try in 600 s)"
        ),
        consecutive_failures=1,
    )
    now = timezone.now()
    ready = make_release(
        repo_id="deepseek-ai/DeepSeek-V3",
        published_at=now - timedelta(hours=3),
        discovered_at=now - timedelta(hours=2, minutes=58),
        family="deepseek_v3",
        architecture="DeepseekV3ForCausalLM",
    )
    ready_job = make_job(
        release=ready,
        statuses={"fetch": "succeeded", "analyze": "succeeded"},
        results={"fetch": FETCH_RESULT, "analyze": DEEPSEEK_V3_ANALYSIS},
    )
    # Adapted 2 h 14 min after publication: the analyze stage finished then.
    for stage, minutes in (("fetch", 13), ("analyze", 14)):
        finished = ready.published_at + timedelta(hours=2, minutes=minutes)
        StageRun.objects.filter(job=ready_job, stage=stage).update(
            started_at=finished - timedelta(seconds=3), finished_at=finished
        )
    failed = make_release(
        repo_id="moonshotai/Kimi-K2-Instruct",
        published_at=now - timedelta(minutes=50),
        discovered_at=now - timedelta(minutes=45),
    )
    make_job(
        release=failed,
        statuses={"fetch": "succeeded", "analyze": "failed"},
        errors={"analyze": FAILED_ERROR},
    )
    running = make_release(
        repo_id="Qwen/Qwen3-235B-A22B-Instruct-2507",
        published_at=None,
        discovered_at=now - timedelta(minutes=1),
    )
    running_job = make_job(release=running, statuses={"fetch": "succeeded", "analyze": "running"})
    return {"ready": ready, "failed": failed, "running": running, "running_job": running_job}


@pytest.mark.usefixtures("fetch_analyze_readiness")
def test_board_live_refresh_and_release_page(live_server, page):
    from playwright.sync_api import expect

    asked = []
    page.on("request", lambda request: asked.append(request.url))

    rows = demo_releases()
    ready, failed, running = rows["ready"], rows["failed"], rows["running"]

    # Log in through the real form (the board redirects there).
    page.goto(f"{live_server.url}/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))
    page.get_by_label("Username").fill("demo")
    page.get_by_label("Password").fill("day0-demo")
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{live_server.url}/")
    expect(page.get_by_role("heading", name="Release board")).to_be_visible()

    def cell(release, stage: str):
        return page.locator(f"#release-row-{release.pk} td[data-stage='{stage}']")

    # Newest first, each stage's state in its cell.
    repos = page.locator("#board-table tbody th.release a").all_inner_texts()
    assert repos == [
        "Qwen/Qwen3-235B-A22B-Instruct-2507",
        "moonshotai/Kimi-K2-Instruct",
        "deepseek-ai/DeepSeek-V3",
    ]
    expect(cell(ready, "fetch")).to_contain_text("Succeeded")
    expect(cell(ready, "analyze")).to_contain_text("Succeeded")
    expect(cell(failed, "analyze")).to_contain_text("Failed")
    expect(page.locator("#hub-trouble")).to_contain_text("429 Too Many Requests")
    expect(cell(running, "analyze")).to_contain_text("Running")
    expect(page.locator(f"#release-row-{ready.pk} td.clock")).to_contain_text(
        "ready after 2 h 14 m"
    )
    expect(page.locator(f"#release-row-{running.pk} td.clock")).to_contain_text(
        "published time unknown"
    )
    expect(page.locator("#board-table caption")).to_contain_text("Live")
    page.screenshot(path=BOARD_SCREENSHOT, full_page=True)

    # The board refreshes itself: no reload (the marker survives), focus stays put.
    page.evaluate("window.__day0NoReload = 'still here'")
    page.locator(f"#release-link-{ready.pk}").focus()
    StageRun.objects.filter(job=rows["running_job"], stage="analyze").update(
        status="succeeded", finished_at=timezone.now(), result=DEEPSEEK_V3_ANALYSIS
    )
    job_refresh_status(job=rows["running_job"])
    expect(cell(running, "analyze")).to_contain_text("Succeeded", timeout=10_000)
    assert page.evaluate("window.__day0NoReload") == "still here"
    assert page.evaluate("document.activeElement.id") == f"release-link-{ready.pk}"
    # Nothing runs any more: the server slowed the refresh down to look for new releases.
    expect(page.locator("#board-table caption")).to_contain_text(
        "Checking for new releases every 20 s"
    )
    assert page.locator("#board-table").get_attribute("hx-trigger") == "every 20s"

    # Open a release and read its analysis.
    page.locator(f"#release-link-{ready.pk}").click()
    expect(page).to_have_url(f"{live_server.url}/releases/{ready.pk}/")
    expect(page.get_by_role("heading", name="deepseek-ai/DeepSeek-V3", level=1)).to_be_visible()
    size = page.get_by_role("table", name="Size and memory")
    expect(size.get_by_role("row", name=re.compile("^Total params"))).to_contain_text(
        "671.0 B params"
    )
    expect(size.get_by_role("row", name=re.compile("^KV cache per token"))).to_contain_text(
        "70,272 bytes/token"
    )
    expect(size.get_by_role("row", name=re.compile("^Checkpoint size"))).to_contain_text(
        "as published in the index"
    )
    # The analysis past model, size and shape is folded under a one-line summary.
    page.locator("#analysis-more summary").click()
    expect(page.get_by_role("table", name="Attention")).to_contain_text("MLA")
    expect(page.locator("#job-panel")).to_contain_text("Fetch")
    page.screenshot(path=RELEASE_SCREENSHOT, full_page=True)

    # A failed release shows its error in full and offers a re-run.
    page.get_by_role("link", name="Board").first.click()
    page.locator(f"#release-link-{failed.pk}").click()
    expect(page.locator("pre.error")).to_have_text(FAILED_ERROR)
    expect(
        page.get_by_role("button", name=re.compile("^Re-run Architecture analysis"))
    ).to_be_enabled()
    page.screenshot(path=FAILED_SCREENSHOT, full_page=True)

    # Log out through the header's POST form (real CSRF).
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(re.compile(r"/accounts/login/$"))
    # The linked SVG icon spares the browser a /favicon.ico request (which would redirect).
    assert not [url for url in asked if url.endswith("/favicon.ico")]
    assert [url for url in asked if url.endswith("/static/favicon.svg")]


def log_in(page, live_server) -> None:
    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill("demo")
    page.get_by_label("Password").fill("day0-demo")
    page.get_by_role("button", name="Log in").click()


def test_idle_board_shows_a_new_release_without_a_reload(live_server, browser, monkeypatch):
    """Nothing runs, the hub poll finds a release: it appears on the open board by itself,
    the page keeps its scroll position and focus."""
    from playwright.sync_api import expect

    monkeypatch.setattr("adaptation.views.board.BOARD_POLL_IDLE_S", 1)  # 20 s in production
    AcceleratorPool.objects.get_or_create(
        name="cpu", defaults={"backend": "cpu", "queue": "pool.cpu"}
    )
    call_command("load_demo")
    now = timezone.now()
    for n in range(25):
        make_job(
            release=make_release(
                repo_id=f"org/older-{n}", discovered_at=now - timedelta(hours=1, minutes=n)
            ),
            statuses={"fetch": "succeeded", "analyze": "succeeded"},
        )
    context = browser.new_context(viewport={"width": 1300, "height": 600})
    context.set_default_timeout(10_000)
    try:
        page = context.new_page()
        log_in(page, live_server)
        expect(page.locator("#board-table caption")).to_contain_text(
            "Checking for new releases every 1 s"
        )
        page.evaluate("window.__day0NoReload = 'still here'")
        page.mouse.wheel(0, 400)
        # Polled from here: wait_for_function evaluates its text with eval, which the page's
        # Content-Security-Policy (no 'unsafe-eval') refuses.
        for _ in range(50):
            if page.evaluate("window.scrollY") >= 300:
                break
            page.wait_for_timeout(100)
        assert page.evaluate("window.scrollY") >= 300
        link = page.get_by_role("link", name="org/older-10")
        link.focus()  # scrolls it into view if it was not
        scrolled = page.evaluate("window.scrollY")

        found = make_release(repo_id="openai/gpt-oss-120b", discovered_at=timezone.now())
        make_job(release=found)  # found by the hub poll, its job not started yet

        expect(page.locator(f"#release-row-{found.pk}")).to_contain_text("openai/gpt-oss-120b")
        expect(page.locator(f"#release-row-{found.pk} td.clock")).to_contain_text("not ready yet")
        assert page.evaluate("window.__day0NoReload") == "still here"
        assert page.evaluate("document.activeElement.textContent") == "org/older-10"
        assert abs(page.evaluate("window.scrollY") - scrolled) < 80
        page.screenshot(path="/tmp/day0-board-new-release.png", full_page=True)
    finally:
        context.close()


def test_board_fits_every_stage_at_1400_px(live_server, browser):
    """Every stage column on screen at 1400 px: the board table does not overflow its
    scroll box, and each short header keeps the stage's full title on hover."""
    from playwright.sync_api import expect

    from engine.registry import STAGES

    STAGE_ORDER = [stage.name for stage in STAGES]

    demo_releases()
    make_job(
        release=make_release(repo_id="moonshotai/Kimi-K2-Instruct-0905-long-name"),
        stages=STAGE_ORDER,
        statuses={name: "succeeded" for name in STAGE_ORDER[:-1]} | {STAGE_ORDER[-1]: "running"},
    )
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(10_000)
    try:
        page = context.new_page()
        log_in(page, live_server)
        expect(page.locator("#board-table")).to_be_visible()
        assert page.locator("#board-table thead th.stage-col").count() == len(STAGE_ORDER)
        widths = page.evaluate(
            """() => {
                const table = document.querySelector('#board-table');
                const scroll = table.closest('.table-scroll');
                const cells = [...table.querySelectorAll('thead th')];
                return {
                    viewport: document.documentElement.clientWidth,
                    page: document.documentElement.scrollWidth,
                    table: table.getBoundingClientRect().width,
                    scroll: scroll.scrollWidth,
                    box: scroll.clientWidth,
                    right: Math.max(...cells.map(c => c.getBoundingClientRect().right)),
                };
            }"""
        )
        page.screenshot(path="/tmp/day0-board-1400.png", full_page=True)
        assert widths["scroll"] <= widths["box"], widths  # nothing scrolled out of the box
        assert widths["page"] <= widths["viewport"], widths
        assert widths["right"] <= widths["viewport"], widths  # the last stage on screen
        last = page.locator("#board-table thead th.stage-col").last
        expect(last).to_have_attribute("title", re.compile(r"\S"))
    finally:
        context.close()
