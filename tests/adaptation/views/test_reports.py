"""The managers' reports: /reports/ figures checked against values computed here from the rows
the test writes, the CSV against the page, the readiness board's cells, the pools and period
filters, a constant number of queries whatever the number of releases, and who may read them."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import numpy
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from adaptation.models import KnownLimitation, StageRun
from tests import dom
from tests.factories import cpu_pool, make_release
from tests.report_runs import job_with_runs

pytestmark = pytest.mark.django_db

REPORT = reverse("adaptation:report")
READINESS = reverse("adaptation:report_readiness")
CSV = reverse("adaptation:report_csv")
STAGES = ["fetch", "analyze"]
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/work/main/workers/runner.py", line 88, in execute_stage_run\n'
    "    result = definition.run(ctx)\n"
    "engine.contract.StageFailed: config.json: num_experts_per_tok must be a positive "
    "integer, got 0"
)
# What each release of the sample is, in words the test computes its expectations from:
# (name, published after BASE, discovered after BASE, {pool: (outcome, ready after BASE)}).
H = timedelta(hours=1)
D = timedelta(days=1)


def ready(at: datetime) -> dict:
    return {"fetch": ("succeeded", at - timedelta(minutes=3)), "analyze": ("succeeded", at)}


@pytest.fixture
def base() -> datetime:
    """Ten days ago at midnight UTC: every sample release falls in the default period."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - 10 * D


@pytest.fixture
def sample(base, h200, fetch_analyze_readiness) -> dict:
    """Five releases of the period on two pools, and one older release."""
    cpu = cpu_pool()
    r1 = make_release(
        repo_id="org/ready-5h", published_at=base, discovered_at=base + timedelta(minutes=10)
    )
    job_with_runs(r1, stages=STAGES, outcomes=ready(base + 5 * H), pool=cpu)

    r2 = make_release(
        repo_id="org/ready-20h-h200-30h-cpu",
        published_at=base + D,
        discovered_at=base + D + 0.5 * H,
    )
    job_with_runs(
        r2,
        stages=STAGES,
        outcomes=ready(base + D + 30 * H),
        pool=cpu,
        created_at=base + D + 0.5 * H,
    )
    job_with_runs(
        r2,
        stages=STAGES,
        outcomes=ready(base + D + 20 * H),
        pool=h200,
        created_at=base + D + 0.6 * H,
    )

    r3 = make_release(
        repo_id="org/no-publication-time", published_at=None, discovered_at=base + 2 * D
    )
    job_with_runs(r3, stages=STAGES, outcomes=ready(base + 2 * D + 3 * H), pool=cpu)

    r4 = make_release(
        repo_id="org/failed-analyze", published_at=base + 3 * D, discovered_at=base + 3 * D + H
    )
    failed = job_with_runs(
        r4,
        stages=STAGES,
        outcomes={
            "fetch": ("succeeded", base + 3 * D + 2 * H),
            "analyze": ("failed", base + 3 * D + 2.1 * H),
        },
        errors={"analyze": "Unknown architecture FooForCausalLM\nmore"},
        pool=cpu,
    )
    StageRun.objects.create(
        job=failed,
        stage="analyze",
        position=1,
        attempt=2,
        status="failed",
        finished_at=base + 3 * D + 3 * H,
        error=TRACEBACK,
    )
    from adaptation.services.jobs import job_refresh_status

    job_refresh_status(job=failed)
    KnownLimitation.objects.create(release=r4, pool=cpu, title="Missing operator", severity="major")
    KnownLimitation.objects.create(release=r4, pool=None, title="MTP not served", severity="minor")
    KnownLimitation.objects.create(release=r4, pool=cpu, title="Old", status="resolved")

    r5 = make_release(
        repo_id="org/failed-fetch-h200", published_at=base + 4 * D, discovered_at=base + 4 * D
    )
    job_with_runs(
        r5,
        stages=STAGES,
        outcomes={"fetch": ("failed", base + 4 * D + H)},
        errors={"fetch": "config.json: line 3 column 5: Expecting ',' delimiter"},
        pool=h200,
        created_at=base + 4 * D,
    )
    job_with_runs(
        r5,
        stages=STAGES,
        outcomes={"fetch": ("running", None)},
        pool=cpu,
        created_at=base + 4 * D + H,
    )
    KnownLimitation.objects.create(release=r5, pool=h200, title="No FP8", severity="blocker")

    old = make_release(
        repo_id="org/too-old", published_at=base - 40 * D, discovered_at=base - 40 * D
    )
    job_with_runs(old, stages=STAGES, outcomes=ready(base - 40 * D + H), pool=cpu)
    return {"r1": r1, "r2": r2, "r3": r3, "r4": r4, "r5": r5, "old": old}


def figure(html: str, name: str) -> str:
    """The data-value of the summary figure `name`."""
    return dom.attr(html, f"#summary-{name}", "data-value")


def page_rows(html: str) -> dict[int, dict[str, str]]:
    """The report table's rows by release id: each `data-col` cell's data-value (or text)."""
    return {
        int(row["id"].removeprefix("report-row-")): {
            cell["data-col"]: cell.get("data-value", cell.text)
            for cell in row.select("td[data-col]")
        }
        for row in dom.find_all(html, 'tr[id^="report-row-"]')
    }


def test_summary_figures_match_the_rows_written(client, cast, sample, base):
    client.force_login(cast.mona)
    response = client.get(REPORT)
    assert response.status_code == 200
    html = response.content.decode()

    # Expected, computed here from the sample's own times (hours from publication, else
    # discovery, to the first ready job on any pool).
    day0_h = {"r1": 5.0, "r2": 20.0, "r3": 3.0}  # r4 failed, r5 failed/running: not ready
    seen = 5
    within = sum(1 for value in day0_h.values() if value <= 24)
    assert figure(html, "releases-seen") == str(seen)
    assert figure(html, "ready") == "3"
    assert float(figure(html, "within-24h")) == round(100 * within / seen, 1) == 60.0
    assert float(figure(html, "median")) == round(numpy.percentile(list(day0_h.values()), 50), 2)
    assert float(figure(html, "p90")) == round(numpy.percentile(list(day0_h.values()), 90), 2)
    assert float(figure(html, "p90")) == 17.0
    # Failures by stage: every failed attempt (analyze twice for r4, fetch once for r5).
    failures = {
        count.parent["data-stage"]: count.text
        for count in dom.find_all(html, 'tr[data-stage] > th[scope="row"] + td.num')
    }
    assert failures == {"analyze": "2", "fetch": "1"}
    # Success rate per pool: cpu 3 succeeded, 1 failed (1 running left out); h200 1 and 1.
    rates = {
        row["data-pool"]: dom.attr(row, "[data-value]", "data-value")
        for row in dom.find_all(html, "tr[data-pool]")
    }
    assert rates == {"cpu": str(round(100 * 3 / 4, 1)), "h200": "50.0"}
    # The old release is outside the default 30 days.
    assert "org/too-old" not in html


def test_rows_say_status_times_failures_and_limitations(client, cast, sample, base):
    client.force_login(cast.mona)
    html = client.get(REPORT).content.decode()
    rows = page_rows(html)
    r1, r2, r3, r4, r5 = (sample[k] for k in ("r1", "r2", "r3", "r4", "r5"))
    assert list(rows) == [r5.pk, r4.pk, r3.pk, r2.pk, r1.pk]  # newest discovered first
    assert rows[r1.pk]["time_to_detect_h"] == str(round(1 / 6, 2))
    assert rows[r1.pk]["time_to_day0_h"] == "5.0"
    assert rows[r2.pk]["time_to_day0_h"] == "20.0"  # h200 was ready first
    assert rows[r2.pk]["status"] == "succeeded"
    assert rows[r3.pk]["time_to_detect_h"] == ""  # no publication time
    assert rows[r3.pk]["time_to_day0_h"] == "3.0"
    assert "from discovery" in html.split(f'id="report-row-{r3.pk}"')[1].split("</tr>")[0]
    assert rows[r4.pk]["status"] == "failed"
    assert rows[r4.pk]["time_to_day0_h"] == ""
    # The newest failure's reason: a traceback's last line, without the exception's name.
    assert rows[r4.pk]["failed_stages"] == (
        "analyze \u00d72 (cpu): config.json: num_experts_per_tok must be a positive integer, got 0"
    )
    assert rows[r4.pk]["open_limitations"] == "2"  # the resolved one is not counted
    assert rows[r5.pk]["status"] == "running"  # its newest job, on cpu
    assert rows[r5.pk]["failed_stages"] == (
        "fetch (h200): config.json: line 3 column 5: Expecting ',' delimiter"
    )
    assert rows[r5.pk]["open_limitations"] == "1"
    # The chart: one point per ready release, as plotly JSON (no chart JS in the page).
    assert '<script id="day0-report-figure" type="application/json">' in html
    assert '<div id="day0-report-chart"' in html


def test_csv_has_the_numbers_of_the_page(client, cast, sample):
    client.force_login(cast.eli)
    html = client.get(REPORT).content.decode()
    response = client.get(CSV)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    table = list(csv.DictReader(io.StringIO(response.content.decode())))
    page = page_rows(html)
    assert [int(row["release_id"]) for row in table] == list(page)
    for row in table:
        cells = page[int(row["release_id"])]
        assert row["time_to_detect_h"] == cells["time_to_detect_h"]
        assert row["time_to_day0_h"] == cells["time_to_day0_h"]
        assert row["open_limitations"] == cells["open_limitations"]
        assert row["status"] in cells["status"]
    # The summary from the CSV alone gives the page's figures.
    hours = sorted(float(row["time_to_day0_h"]) for row in table if row["time_to_day0_h"])
    within = sum(1 for row in table if row["within_24h"] == "yes")
    assert float(figure(html, "within-24h")) == round(100 * within / len(table), 1)
    assert abs(float(figure(html, "median")) - numpy.percentile(hours, 50)) < 0.01
    r4 = next(row for row in table if row["repo_id"] == "org/failed-analyze")
    assert r4["failed_stages"] == "analyze x2"
    assert r4["failure_reasons"].startswith("analyze: config.json: num_experts_per_tok")
    assert r4["day0_basis"] == "publication"


def test_pools_and_period_filter(client, cast, sample, base):
    client.force_login(cast.mona)
    only_cpu = client.get(REPORT, {"pools": "cpu"}).content.decode()
    rows = page_rows(only_cpu)
    assert rows[sample["r2"].pk]["time_to_day0_h"] == "30.0"  # cpu's own Day 0
    assert rows[sample["r5"].pk]["failed_stages"] == "—"  # the h200 failure is not counted
    assert figure(only_cpu, "releases-seen") == "5"
    assert float(figure(only_cpu, "within-24h")) == 40.0  # r1 and r3
    only_h200 = client.get(REPORT, {"pools": "h200"}).content.decode()
    assert set(page_rows(only_h200)) == {sample["r2"].pk, sample["r5"].pk}
    period = {
        "date_from": (base + 2 * D).date().isoformat(),
        "date_to": (base + 3 * D).date().isoformat(),
    }
    within_period = client.get(REPORT, period).content.decode()
    assert set(page_rows(within_period)) == {sample["r3"].pk, sample["r4"].pk}
    csv_text = client.get(CSV, period).content.decode()
    assert {row["repo_id"] for row in csv.DictReader(io.StringIO(csv_text))} == {
        "org/no-publication-time",
        "org/failed-analyze",
    }
    # The CSV link keeps the parameters.
    assert "date_from=" in within_period and "releases.csv?date_from=" in within_period


@pytest.mark.parametrize(
    "params",
    [
        {"date_from": "2025-02-30"},
        {"date_from": "2025-03-02", "date_to": "2025-03-01"},
        {"pools": "no-such-pool"},
        {"date_to": "9999-12-31"},  # the period's end (a day later) would overflow
        {"date_from": "9999-12-30", "date_to": "9999-12-31"},
    ],
)
def test_bad_parameters_answer_400(client, cast, params):
    client.force_login(cast.mona)
    assert client.get(REPORT, params).status_code == 400
    assert client.get(READINESS, params).status_code == 400
    assert client.get(CSV, params).status_code == 400


def test_readiness_board_cells_link_to_the_job(client, cast, sample):
    client.force_login(cast.mona)
    response = client.get(READINESS)
    assert response.status_code == 200
    html = response.content.decode()
    r2, r4, r5 = sample["r2"], sample["r4"], sample["r5"]
    row = dom.find(html, f"tr#readiness-row-{r2.pk}")
    cells = {
        cell["data-pool"]: cell["data-level"] for cell in row.select("[data-pool][data-level]")
    }
    assert cells == {"cpu": "complete", "h200": "complete"}
    h200_job = r2.jobs.get(pool__name="h200")
    assert f"/releases/{r2.pk}/#job-{h200_job.pk}" in [a["href"] for a in row.select("a[href]")]
    for hours in ("20.0", "30.0"):
        said = [cell.text for cell in row.select(f'[data-value="{hours}"]')]
        assert any(words.startswith(f"Day 0 after {hours} h") for words in said), said
    failed = dom.find(html, f"tr#readiness-row-{r4.pk}").inner_html
    assert 'data-pool="cpu" data-level="none"' in failed
    assert "needs Architecture analysis" in failed and "not ready" in failed
    assert 'data-pool="h200"><span class="muted">no job</span>' in failed
    r5_row = dom.find(html, f"tr#readiness-row-{r5.pk}").inner_html
    assert 'data-pool="h200" data-level="none"' in r5_row and "needs Fetch &amp; parse" in r5_row
    assert "org/too-old" not in html


def add_releases(count: int, base: datetime, h200) -> None:
    """`count` releases with a ready cpu job, a failed h200 job and an open limitation."""
    for n in range(count):
        release = make_release(published_at=base + n * H, discovered_at=base + n * H + H)
        job_with_runs(release, stages=STAGES, outcomes=ready(base + n * H + 3 * H), pool=cpu_pool())
        job_with_runs(
            release,
            stages=STAGES,
            outcomes={"fetch": ("failed", base + n * H + 2 * H)},
            errors={"fetch": "boom"},
            pool=h200,
        )
        KnownLimitation.objects.create(release=release, pool=h200, title="x", severity="major")


@pytest.mark.parametrize("url", [REPORT, READINESS, CSV])
def test_queries_do_not_grow_with_the_releases(client, cast, base, h200, url):
    client.force_login(cast.mona)
    add_releases(3, base, h200)
    client.get(url)  # warm: the session and permission caches are the same on both sides
    with CaptureQueriesContext(connection) as three:
        assert client.get(url).status_code == 200
    add_releases(27, base + 3 * D, h200)
    with CaptureQueriesContext(connection) as thirty:
        response = client.get(url)
        assert response.status_code == 200
    assert response.content.decode().count("org/model-") >= 30
    assert len(thirty) == len(three), [q["sql"][:120] for q in thirty.captured_queries]


def test_who_may_read_reports(client, cast):
    for url in (REPORT, READINESS, CSV):
        anonymous = client.get(url)
        assert anonymous.status_code == 302 and anonymous.url.startswith(reverse("login"))
        for name, status in (("nina", 403), ("mona", 200), ("eli", 200), ("ada", 200)):
            client.force_login(getattr(cast, name))
            assert client.get(url).status_code == status, (url, name)
            client.logout()
    client.force_login(cast.mona)
    assert f'href="{REPORT}"' in client.get(REPORT).content.decode()  # the nav link
    # Read-only: reports offer no form that changes anything.
    assert 'method="post"' not in client.get(REPORT).content.decode().split("<main>")[1]
