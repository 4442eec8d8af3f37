"""Release day on a busy board: a partial job never hides a full one nor lowers
readiness; the release page draws the newest job in full and folds the others into a history;
a failed stage says whose fault it is; Re-run only where one can run; times in human units."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from adaptation.models import StageRun
from engine import formatting
from tests import dom
from tests.adaptation.views.test_board import BOARD, cell_text, clock_text
from tests.factories import make_job, make_release

FULL = ("fetch", "analyze", "operators", "plan")


@pytest.fixture
def three_stage_readiness(settings) -> None:
    settings.DAY0_READINESS = {
        "experimental": ["fetch", "analyze"],
        "functional": ["operators"],
        "complete": ["plan"],
    }


def full_and_partial(release):
    """A full job that ran fetch, analyze and operators and now runs plan, and a newer partial
    job (a webhook's two stages) that succeeded."""
    full = make_job(
        release=release,
        stages=FULL,
        statuses={
            "fetch": "succeeded",
            "analyze": "succeeded",
            "operators": "succeeded",
            "plan": "running",
        },
    )
    partial = make_job(
        release=release,
        stages=("fetch", "analyze"),
        statuses={"fetch": "succeeded", "analyze": "succeeded"},
        trigger="webhook",
        created_at=timezone.now() + timedelta(seconds=5),
    )
    return full, partial


@pytest.mark.django_db
@pytest.mark.usefixtures("three_stage_readiness")
def test_a_newer_partial_job_neither_hides_a_running_full_job_nor_lowers_readiness(
    logged_in_client,
):
    release = make_release()
    full, partial = full_and_partial(release)

    html = logged_in_client.get(BOARD).content.decode()

    # Every running job is named, with a link to its panels; the finished partial one is not.
    assert f'id="running-job-{full.pk}"' in html
    assert f'id="running-job-{partial.pk}"' not in html
    # The full job's stages the partial one did not run stay on the board, from the full job.
    assert "Running" in cell_text(html, release.pk, "plan")
    assert f"job {full.pk}" in cell_text(html, release.pk, "operators")
    # Fetch and analyze: the newer job ran them, so they are its (no "job N" note).
    assert f"job {full.pk}" not in cell_text(html, release.pk, "analyze")
    # Functional, as the full job left it: the two-stage job does not pull it to experimental.
    assert "cpu Functional · needs Plan the split (predicted)" in clock_text(html, release.pk)


@pytest.mark.django_db
@pytest.mark.usefixtures("three_stage_readiness")
def test_a_newer_job_that_ran_a_stage_and_failed_it_lowers_readiness(logged_in_client):
    release = make_release()
    make_job(
        release=release,
        stages=FULL,
        statuses=dict.fromkeys(FULL, "succeeded"),
    )
    make_job(
        release=release,
        stages=("fetch", "analyze", "operators"),
        statuses={"fetch": "succeeded", "analyze": "succeeded", "operators": "failed"},
        created_at=timezone.now() + timedelta(seconds=5),
    )
    html = logged_in_client.get(BOARD).content.decode()
    assert "cpu Experimental · needs Operator coverage" in clock_text(html, release.pk)


@pytest.mark.django_db
def test_infrastructure_and_release_failures_are_shown_apart(logged_in_client):
    infra = make_job(
        release=make_release(repo_id="org/infra"),
        statuses={"fetch": "succeeded", "analyze": "failed"},
        errors={"analyze": "the worker was lost"},
    )
    release_fault = make_job(
        release=make_release(repo_id="org/release"),
        statuses={"fetch": "succeeded", "analyze": "failed"},
        errors={"analyze": "num_experts_per_tok must be positive"},
    )
    StageRun.objects.filter(job=infra, stage="analyze").update(failure_class="infrastructure")
    StageRun.objects.filter(job=release_fault, stage="analyze").update(failure_class="release")

    board = logged_in_client.get(BOARD).content.decode()
    infra_cell = dom.find(board, f"tr#release-row-{infra.release_id}").html
    release_cell = dom.find(board, f"tr#release-row-{release_fault.release_id}").html
    assert 'class="stage-cell status-failed failure-infrastructure"' in infra_cell
    assert ">infra</span>" in infra_cell and ">release</span>" not in infra_cell
    assert 'class="stage-cell status-failed failure-release"' in release_cell
    assert ">release</span>" in release_cell and ">infra</span>" not in release_cell

    page = logged_in_client.get(
        reverse("adaptation:release_detail", args=[infra.release_id])
    ).content.decode()
    assert f'id="job-{infra.pk}-stage-analyze-class"' in page
    assert "infrastructure failure</span>" in page and "release failure</span>" not in page


@pytest.mark.django_db
def test_the_release_page_shows_the_newest_job_and_folds_the_others(logged_in_client):
    release = make_release()
    jobs = [
        make_job(
            release=release,
            statuses={"fetch": "succeeded", "analyze": "succeeded"},
            created_at=timezone.now() + timedelta(seconds=index),
        )
        for index in range(5)
    ]
    newest, oldest = jobs[-1], jobs[0]
    url = reverse("adaptation:release_detail", args=[release.pk])

    html = logged_in_client.get(url).content.decode()

    # One stage timeline (the newest job's); every job a line of the history, with a link.
    assert [a["id"] for a in dom.find_all(html, 'article[class="job"]')] == [f"job-{newest.pk}"]
    assert [tr["id"] for tr in dom.find_all(html, 'tr[id^="history-job-"]')] == [
        f"history-job-{job.pk}" for job in reversed(jobs)
    ]
    assert f'href="{url}?job={oldest.pk}"' in html

    # ?job= draws that job instead.
    older = logged_in_client.get(f"{url}?job={oldest.pk}").content.decode()
    assert [a["id"] for a in dom.find_all(older, 'article[class="job"]')] == [f"job-{oldest.pk}"]
    assert f"The panels below are job {oldest.pk}" in older


@pytest.mark.django_db
def test_rerun_shows_only_where_a_rerun_can_run(logged_in_client):
    job = make_job(
        stages=("fetch", "analyze", "operators"),
        statuses={"fetch": "succeeded", "analyze": "failed", "operators": "skipped"},
        errors={"analyze": "boom"},
    )
    html = logged_in_client.get(
        reverse("adaptation:release_detail", args=[job.release_id])
    ).content.decode()
    assert f'id="rerun-{job.pk}-fetch"' in html
    assert f'id="rerun-{job.pk}-analyze"' in html
    assert f'id="rerun-{job.pk}-operators"' not in html  # skipped: its earlier stage failed


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0164, "16.4 ms"),
        (0.25, "250 ms"),
        (17.7, "17.7 s"),
        (754, "12.6 min"),
        (17702.796, "4.92 h"),
    ],
)
def test_times_are_written_in_human_units(seconds, text):
    assert formatting.ms(seconds) == text


@pytest.mark.django_db
def test_a_stage_no_job_holds_is_named_in_one_line_not_a_panel(logged_in_client):
    release = make_release()
    make_job(release=release, statuses={"fetch": "succeeded", "analyze": "succeeded"})
    page = logged_in_client.get(reverse("adaptation:release_detail", args=[release.pk]))
    html = page.content.decode()
    # The analysis and the plan (its "not planned yet" links to Compare pools) stay.
    assert [panel.name for panel in page.context["panels"]] == ["analyze", "plan"]
    gaps = dom.text(html, "p.rest-summary#panel-gaps")
    assert "Run the split (measured)" in gaps and "Operator coverage" in gaps
    assert html.count("Not run yet") == 0
