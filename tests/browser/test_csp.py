"""day0's Content-Security-Policy in real Chromium: the board (htmx refreshing it), a release
page with performance and stability charts, the reports page, the pools page, the printable
release notes, the API reference and the admin's accelerator kinds load with no violation of
the policy, plotly draws the charts, htmx swaps, and the stylesheets that replaced inline
styles apply. And static/plotly.css and plotly-maplibre.css hold what the installed plotly.js
would otherwise add inline (`manage.py plotly_css --check`)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from adaptation.models import ReleaseNotes
from adaptation.roles import ADMIN, role_grant
from tests.factories import cpu_pool, make_job, make_release
from tests.performance_rows import DENSE, measured_job
from tests.report_runs import job_with_runs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
USERNAME, PASSWORD = "ada", "content-security-policy"

# Before any page script: record the policy's violation events and htmx's swaps.
RECORDER = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__violations.push(`${event.effectiveDirective} blocked ${event.blockedURI || "inline"}`);
});
window.__swaps = 0;
document.addEventListener("htmx:afterSettle", () => { window.__swaps += 1; });
"""


def drawn(page, chart_id: str) -> int:
    """How many traces plotly drew into the element `chart_id` (it waits for the drawing)."""
    page.locator(f"#{chart_id} svg.main-svg").first.wait_for()
    return page.evaluate("(id) => document.getElementById(id).data.length", chart_id)


def style(page, selector: str, prop: str) -> str:
    return page.evaluate(
        "([s, p]) => getComputedStyle(document.querySelector(s)).getPropertyValue(p)",
        [selector, prop],
    )


@pytest.mark.usefixtures("fetch_analyze_readiness")
def test_pages_load_under_the_policy_with_charts_and_htmx(live_server, page, django_user_model):
    job = measured_job(DENSE)  # performance and stability charts on its release page
    now = datetime.now(UTC)
    job_with_runs(  # a ready release for the reports chart
        make_release(published_at=now - 5 * timedelta(hours=1)),
        stages=["fetch", "analyze"],
        outcomes={
            "fetch": ("succeeded", now - 2 * timedelta(hours=1)),
            "analyze": ("succeeded", now - timedelta(hours=1)),
        },
        pool=cpu_pool(),
    )
    make_job(statuses={"fetch": "running"})  # the board refreshes while a stage runs
    ReleaseNotes.objects.create(
        release=job.release, pool=job.pool, job=job, version=1, markdown="# Notes\n\nText."
    )
    user = django_user_model.objects.create_user(username=USERNAME, password=PASSWORD)
    role_grant(user=user, role=ADMIN)  # every page, the admin site included

    console: list[str] = []
    page.on("console", lambda message: console.append(f"{page.url}: {message.text}"))
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"{page.url}: {exc}"))
    page.context.add_init_script(RECORDER)
    page.set_default_timeout(60_000)  # the release page renders many panels
    violations: list[str] = []

    def visit(path: str) -> None:
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("load")

    def settle() -> None:
        violations.extend(f"{page.url}: {v}" for v in page.evaluate("window.__violations"))

    visit("/accounts/login/")
    page.get_by_label("Username").fill(USERNAME)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/")
    # The board: htmx (from static files) refreshes it by itself.
    page.wait_for_function("() => window.__swaps >= 1", timeout=30_000)
    settle()

    visit(f"/releases/{job.release_id}/")
    stem = f"performance-job-{job.pk}"
    assert drawn(page, f"{stem}-throughput-chart") > 0
    assert drawn(page, f"{stem}-latency-chart") > 0
    assert drawn(page, f"stability-job-{job.pk}-memory-chart") > 0
    # plotly.css, which plotly.js would have added inline, applies: its modebar rules.
    assert style(page, f"#{stem}-throughput-chart .modebar", "position") == "absolute"
    settle()

    visit("/reports/")
    assert drawn(page, "day0-report-chart") > 0
    settle()

    visit("/pools/")
    assert style(page, ".pool", "border-top-left-radius") == "6px"  # static/pools.css
    page.wait_for_function("() => window.__swaps >= 1", timeout=30_000)  # htmx refreshes it
    settle()

    visit(f"/releases/{job.release_id}/notes/print/")
    assert style(page, "body", "padding-top") == "24px"  # the inline style, under the nonce
    settle()

    visit("/api/docs/")
    page.locator("#swagger-ui .info .title").wait_for()  # Swagger UI started from ?script
    settle()

    visit("/admin/adaptation/acceleratorkind/")
    assert style(page, "#shipped-catalog", "margin-bottom") == "56px"  # admin_catalog.css
    settle()

    reported = [line for line in console if "Content Security Policy" in line]
    assert not reported, "\n".join(reported)
    assert not violations, "\n".join(violations)
    assert not errors, "\n".join(errors)


def test_the_plotly_stylesheets_match_the_installed_plotly_js():
    # A process of its own: the command drives its own Playwright.
    done = subprocess.run(
        [sys.executable, "manage.py", "plotly_css", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "up to date" in done.stdout
