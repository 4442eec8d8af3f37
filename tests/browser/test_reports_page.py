"""The managers' report in real Chromium: a manager signs in, opens /reports/, reads the
summary figures (checked against values computed here from the database), sees plotly draw
the time-to-Day-0 chart, and prints the page to PDF. The screenshot and the PDF go to
var/test/artifacts/."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy
import pytest

from adaptation.models import AcceleratorPool, AdaptationJob, ModelRelease, StageRun
from adaptation.roles import MANAGER, role_grant
from tests.factories import cpu_pool, make_release
from tests.report_runs import job_with_runs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "test" / "artifacts"
USERNAME, PASSWORD = "mona", "how-fast-did-we-adapt"
H = timedelta(hours=1)


def sample_releases() -> None:
    """Twelve releases of the last days on two pools: most ready within hours, a few after a
    day, some failed, one without a publication time."""
    cpu = cpu_pool()
    h200 = AcceleratorPool.objects.create(
        name="h200", backend="manifest", accelerator="h200", queue="pool.h200"
    )
    now = datetime.now(UTC).replace(microsecond=0)
    for n in range(12):
        published = None if n == 5 else now - (n + 2) * 24 * H
        discovered = (published or now - 7 * 24 * H) + (n + 1) * 5 * timedelta(minutes=1)
        release = make_release(
            repo_id=f"org/model-{n:02d}", published_at=published, discovered_at=discovered
        )
        start = discovered + timedelta(minutes=2)
        if n % 4 == 3:  # failed at analyze on cpu
            job_with_runs(
                release,
                stages=["fetch", "analyze"],
                outcomes={"fetch": ("succeeded", start), "analyze": ("failed", start + H)},
                errors={"analyze": "config.json: num_experts_per_tok must be a positive integer"},
                pool=cpu,
            )
            continue
        took = (n + 1) * 3.5 * H  # 3.5 h to 42 h
        job_with_runs(
            release,
            stages=["fetch", "analyze"],
            outcomes={
                "fetch": ("succeeded", start),
                "analyze": ("succeeded", (published or discovered) + took),
            },
            pool=h200 if n % 3 == 0 else cpu,
        )


def expected_figures() -> dict[str, str]:
    """The summary figures computed here from the rows, as the page prints them."""
    since = datetime.now(UTC).date() - timedelta(days=29)
    releases = ModelRelease.objects.filter(discovered_at__date__gte=since)
    hours = []
    for release in releases:
        readies = [
            job.ready_at for job in AdaptationJob.objects.filter(release=release) if job.ready_at
        ]
        if readies:
            start = release.published_at or release.discovered_at
            hours.append((min(readies) - start).total_seconds() / 3600)
    within = sum(1 for value in hours if value <= 24)
    return {
        "releases-seen": str(releases.count()),
        "ready": str(len(hours)),
        "within-24h": f"{round(100 * within / releases.count(), 1)}%",
        "median": as_duration(round(float(numpy.percentile(hours, 50)), 2)),
        "p90": as_duration(round(float(numpy.percentile(hours, 90)), 2)),
    }


def as_duration(hours: float) -> str:
    """Hours (the summary keeps them to 2 decimals) as the page writes a duration: "21 h 00 m",
    "5 m 24 s", "1 d 06 h"."""
    seconds = int(hours * 3600)
    days, rest = divmod(seconds, 86400)
    whole_hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {whole_hours:02d} h"
    if whole_hours:
        return f"{whole_hours} h {minutes:02d} m"
    return f"{minutes} m {secs:02d} s"


@pytest.mark.usefixtures("fetch_analyze_readiness")
def test_report_page_figures_chart_and_pdf(live_server, page, django_user_model):
    from playwright.sync_api import expect

    sample_releases()
    user = django_user_model.objects.create_user(username=USERNAME, password=PASSWORD)
    role_grant(user=user, role=MANAGER)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    page.goto(f"{live_server.url}/accounts/login/?next=/reports/")
    page.get_by_label("Username").fill(USERNAME)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/reports/")
    expect(page.get_by_role("heading", name="Day-0 report", level=1)).to_be_visible()
    expect(page.get_by_role("link", name="Reports")).to_have_attribute("aria-current", "page")

    expected = expected_figures()
    assert expected["releases-seen"] == "12"
    for name, value in expected.items():
        expect(page.locator(f"#summary-{name}")).to_contain_text(value)
    failures = page.locator("#failures-by-stage tbody tr[data-stage='analyze'] td")
    assert failures.inner_text() == str(
        StageRun.objects.filter(stage="analyze", status="failed").count()
    )
    rows = page.locator("#report-table tbody tr")
    assert rows.count() == 12
    expect(page.locator("#report-table")).to_contain_text("num_experts_per_tok")

    # plotly drew the chart from the embedded figure: one point per ready release.
    page.locator("#day0-report-chart svg.main-svg").first.wait_for()
    points = page.evaluate(
        "() => document.getElementById('day0-report-chart').data"
        ".reduce((n, trace) => n + trace.y.length, 0)"
    )
    assert points == int(expected["ready"])
    assert errors == []

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "reports.png"), full_page=True)
    page.emulate_media(media="print")
    pdf = ARTIFACTS / "reports.pdf"
    page.pdf(path=str(pdf), format="A4", landscape=True, print_background=True)
    assert pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 10_000
    # Printing leaves the form and the navigation out.
    assert page.locator("form.report-options").is_hidden()
