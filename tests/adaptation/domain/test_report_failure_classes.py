"""The reports count what a success is, as they say: a full job that succeeded (every stage
the readiness levels require), partial jobs apart; and an infrastructure failure and a release
failure of the same stage are counted separately, with no exception's name on the page."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from adaptation.domain.reports import error_excerpt, is_full_job
from adaptation.models import StageRun
from tests import dom
from tests.factories import cpu_pool, make_release
from tests.report_runs import job_with_runs

pytestmark = pytest.mark.django_db

REPORT = reverse("adaptation:report")
CSV = reverse("adaptation:report_csv")
FULL = ["fetch", "analyze"]  # every stage `fetch_analyze_readiness` requires


@pytest.fixture
def jobs(fetch_analyze_readiness, h200) -> dict:
    """On cpu: a full job that succeeded, a full job failed by the infrastructure (analyze ran
    past its time budget), a full job failed by the release (analyze: unknown architecture)
    and a newer partial job (fetch only) that succeeded; on h200 a partial job that failed."""
    now = datetime.now(UTC) - timedelta(days=1)
    cpu = cpu_pool()

    def release(name: str):
        return make_release(repo_id=f"org/{name}", published_at=now, discovered_at=now)

    ok = {"fetch": ("succeeded", now), "analyze": ("succeeded", now + timedelta(minutes=1))}
    failed = {"fetch": ("succeeded", now), "analyze": ("failed", now + timedelta(minutes=1))}
    made = {
        "ok": job_with_runs(release("ok"), stages=FULL, outcomes=ok, pool=cpu),
        "infra": job_with_runs(
            release("infra"),
            stages=FULL,
            outcomes=failed,
            errors={"analyze": "analyze ran past its time budget of 180 s and was stopped"},
            pool=cpu,
        ),
        "release": job_with_runs(
            release("release"),
            stages=FULL,
            outcomes=failed,
            errors={"analyze": "Unknown architecture FooForCausalLM"},
            pool=cpu,
        ),
    }
    StageRun.objects.filter(job=made["infra"], stage="analyze").update(
        failure_class="infrastructure"
    )
    StageRun.objects.filter(job=made["release"], stage="analyze").update(failure_class="release")
    partial_release = make_release(repo_id="org/partial", published_at=now, discovered_at=now)
    made["partial"] = job_with_runs(
        partial_release, stages=["fetch"], outcomes={"fetch": ("succeeded", now)}, pool=cpu
    )
    made["partial_failed"] = job_with_runs(
        partial_release,
        stages=["fetch"],
        outcomes={"fetch": ("failed", now)},
        errors={"fetch": "SoftTimeLimitExceeded()"},
        pool=h200,
    )
    StageRun.objects.filter(job=made["partial_failed"]).update(failure_class="infrastructure")
    return made


def cells(html: str, table: str) -> dict[str, dict[str, str]]:
    """The summary table `table`'s rows by their data key, each {data-col: text}."""
    rows = {}
    for row in dom.find_all(html, f"table#{table} tr[data-pool], table#{table} tr[data-class]"):
        key = row.get("data-pool") or row["data-class"]
        numbers = row.select('td[class="num"]')
        rows[key] = {cell.get("data-col", "value"): cell.text for cell in numbers}
    return rows


def test_a_success_is_a_full_job_that_succeeded_and_the_page_says_so(client, cast, jobs):
    client.force_login(cast.mona)
    html = client.get(REPORT).content.decode()
    pools = cells(html, "pool-success")
    # cpu: 4 jobs; the partial one counts neither way: 1 success of 3 finished full jobs.
    assert pools["cpu"] == {
        "jobs": "4",
        "succeeded": "1",
        "failed_infrastructure": "1",
        "failed_release": "1",
        "partial": "1",
        "success_rate": "33.3%",
    }
    # h200's only job is partial: no rate rather than 0 %.
    assert pools["h200"]["partial"] == "1"
    assert pools["h200"]["success_rate"] == "no full job finished"
    definition = html.split('id="success-definition">', 1)[1].split("</p>", 1)[0]
    assert "A <strong>success</strong> is a full job that succeeded" in definition
    assert "(fetch, analyze)" in definition
    assert "partial jobs" in definition


def test_infra_and_release_failures_are_counted_apart(client, cast, jobs):
    client.force_login(cast.mona)
    html = client.get(REPORT).content.decode()
    by_class = cells(html, "failures-by-class")
    assert by_class["infrastructure"]["value"] == "2"  # analyze's time budget, fetch's limit
    assert by_class["release"]["value"] == "1"
    infra_row = html.split(f'id="report-row-{jobs["infra"].release_id}"', 1)[1].split("</tr>")[0]
    release_row = html.split(f'id="report-row-{jobs["release"].release_id}"', 1)[1].split("</tr>")[
        0
    ]
    assert 'data-class="infrastructure"' in infra_row and 'data-class="release"' not in infra_row
    assert 'data-class="release"' in release_row
    assert "SoftTimeLimitExceeded" not in html  # the older error reads as words
    table = {
        row["repo_id"]: row for row in csv.DictReader(io.StringIO(client.get(CSV).content.decode()))
    }
    assert table["org/infra"]["failure_reasons"].endswith("(infrastructure)")
    assert table["org/release"]["failure_reasons"] == (
        "analyze: Unknown architecture FooForCausalLM (release)"
    )


def test_the_weekly_figures_carry_the_classes_and_partial_jobs(jobs):
    from adaptation.domain.reports import release_report
    from adaptation.selectors.reports import ReportQuery, report_rows

    summary = release_report(report_rows(ReportQuery.last_days(3))).summary.as_dict()
    assert summary["failures_by_class"] == {"infrastructure": 2, "release": 1}
    cpu = next(rate for rate in summary["success_by_pool"] if rate["pool"] == "cpu")
    assert (cpu["succeeded"], cpu["failed"], cpu["partial"]) == (1, 2, 1)
    assert (cpu["failed_infrastructure"], cpu["failed_release"]) == (1, 1)


def test_error_excerpts_name_no_exception():
    assert error_excerpt("SoftTimeLimitExceeded()", "") == (
        "ran past its time budget (a time limit of the host, not the release)"
    )
    assert error_excerpt("Traceback (most recent call last):\n ...", "...\nKeyError: 'x'") == "'x'"
    assert error_excerpt("nothing fits the pool", "") == "nothing fits the pool"


def test_a_full_job_runs_every_required_stage(fetch_analyze_readiness):
    assert is_full_job(["fetch", "analyze", "release_notes"])
    assert not is_full_job(["fetch"])
