"""The weekly summary's line: the regressions detected in the period (on the chosen pools,
whatever the release's discovery date), in the report page's summary, the weekly payload
and its Slack line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from adaptation.domain.reports import release_report
from adaptation.models import AcceleratorPool, Regression
from adaptation.notifications.events import weekly_summary_payload
from adaptation.notifications.formats import weekly_summary_text
from adaptation.selectors.reports import ReportQuery, report_rows
from tests.factories import make_job, make_release

pytestmark = pytest.mark.django_db

MONDAY = datetime(2025, 7, 14, 8, 0, tzinfo=UTC)
WEEK = ReportQuery(date_from=datetime(2025, 7, 7).date(), date_to=datetime(2025, 7, 13).date())


def regression(job, metric: str, at: datetime) -> Regression:
    return Regression.objects.create(
        job=job,
        metric=metric,
        unit="s",
        value=9.0,
        baseline_median=3.0,
        baseline_low=2.9,
        baseline_high=3.1,
        baseline_jobs=[1, 2],
        scope="release",
        margin=0.1,
        worse_by=2.0,
        detected_at=at,
    )


@pytest.fixture
def detected():
    """Three regressions of two cpu jobs in the week (of a release discovered a month
    before), one the Monday after it, one on another pool in the week."""
    old = make_release(discovered_at=MONDAY - timedelta(days=40))
    in_week = MONDAY - timedelta(days=3)
    first, second = make_job(release=old), make_job(release=old)
    regression(first, "duration_s:worker:fetch", in_week)
    regression(first, "duration_s:worker:analyze", in_week)
    regression(second, "duration_s:worker:fetch", in_week + timedelta(hours=1))
    regression(make_job(release=old), "duration_s:worker:analyze", MONDAY)
    h200 = AcceleratorPool.objects.create(name="h200", backend="cuda", queue="pool.h200")
    regression(make_job(release=old, pool=h200), "duration_s:worker:fetch", in_week)


def test_the_summary_counts_the_regressions_detected_in_the_period(detected):
    summary = release_report(report_rows(WEEK)).summary
    assert (summary.regressions_detected, summary.jobs_regressed) == (4, 3)
    cpu = ReportQuery(date_from=WEEK.date_from, date_to=WEEK.date_to, pools=("cpu",))
    summary = release_report(report_rows(cpu)).summary
    assert (summary.regressions_detected, summary.jobs_regressed) == (3, 2)

    payload = weekly_summary_payload(summary=summary.as_dict(), query=cpu, now=MONDAY)
    assert payload["data"]["regressions_detected"] == 3
    assert payload["data"]["jobs_regressed"] == 2
    assert weekly_summary_text(payload["data"]).endswith("; *3* regressions detected (in 2 jobs)")


def test_the_reports_page_shows_the_line(detected, client, cast):
    client.force_login(cast.mona)
    response = client.get("/reports/?date_from=2025-07-07&date_to=2025-07-13")
    assert response.status_code == 200
    page = response.content.decode()
    assert (
        '<dd id="summary-regressions" data-value="4" data-jobs="3">4 '
        '<span class="muted">(in 3 jobs)</span></dd>'
    ) in page
