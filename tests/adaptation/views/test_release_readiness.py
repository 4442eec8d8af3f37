"""The release page's readiness per pool: which job earned the level, what a newer job that
did not (cancelled, still running) is shown as, and the words below the first level."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests import dom
from tests.factories import make_job, make_release

pytestmark = pytest.mark.django_db


def readiness_row(html: str, pool: str) -> str:
    """The raw HTML of the readiness table's row for `pool` on the release page."""
    table = dom.find(html, "table.readiness-table#readiness-per-pool")
    return dom.find(table, f'tr[data-pool="{pool}"]').inner_html


def earned_by(row: str) -> dom.Element:
    """The row's cell naming the job that earned the level."""
    return dom.find(row, 'td[class="earned-by"]')


def release_page(client, release) -> str:
    return client.get(reverse("adaptation:release_detail", args=[release.pk])).content.decode()


@pytest.mark.usefixtures("fetch_analyze_readiness")
@pytest.mark.parametrize(
    ("newer_statuses", "newer_words"),
    [
        # Cancelled before it ran anything, or after fetch (its fetch then reads as the newest).
        ({"fetch": "cancelled", "analyze": "cancelled"}, "was cancelled"),
        ({"fetch": "succeeded", "analyze": "cancelled"}, "was cancelled"),
        ({"fetch": "succeeded", "analyze": "running"}, "is running"),
        ({}, "is waiting to start"),
    ],
)
def test_a_newer_job_that_did_not_end_by_itself_leaves_the_level_to_the_job_that_earned_it(
    logged_in_client, newer_statuses, newer_words
):
    release = make_release()
    earned = make_job(release=release, statuses={"fetch": "succeeded", "analyze": "succeeded"})
    newer = make_job(
        release=release,
        statuses=newer_statuses,
        trigger="manual",
        created_at=timezone.now() + timedelta(seconds=5),
    )

    row = readiness_row(release_page(logged_in_client, release), "cpu")

    assert dom.text(row).startswith("cpu Complete")
    # The job column names the job that earned Complete, and the newer one only as what it is.
    job = earned_by(row)
    assert job.text == f"Job {earned.pk} Succeeded · job #{newer.pk} {newer_words}"
    links = [a["href"] for a in job.select("a[href]")]
    assert f"#job-{earned.pk}" in links
    assert f"#history-job-{newer.pk}" in links
    assert f'id="history-job-{newer.pk}"' in release_page(logged_in_client, release)


@pytest.mark.usefixtures("fetch_analyze_readiness")
def test_a_newer_job_that_ran_and_failed_is_the_level_s_job(logged_in_client):
    """A newer job that ended by itself is the pool's news: it lowers the level and earns it."""
    release = make_release()
    make_job(release=release, statuses={"fetch": "succeeded", "analyze": "succeeded"})
    newer = make_job(
        release=release,
        statuses={"fetch": "succeeded", "analyze": "failed"},
        created_at=timezone.now() + timedelta(seconds=5),
    )

    row = readiness_row(release_page(logged_in_client, release), "cpu")

    assert earned_by(row).text == f"Job {newer.pk} Failed"
    assert dom.text(row).startswith("cpu Not yet rated Architecture analysis")


@pytest.mark.usefixtures("fetch_analyze_readiness")
def test_a_cancelled_first_job_is_the_only_one_to_name(logged_in_client):
    release = make_release()
    only = make_job(release=release, statuses={"fetch": "succeeded", "analyze": "cancelled"})

    row = readiness_row(release_page(logged_in_client, release), "cpu")

    assert earned_by(row).text == f"Job {only.pk} Cancelled"


def test_below_the_first_level_the_level_says_not_yet_rated(logged_in_client):
    release = make_release()
    make_job(release=release, statuses={"fetch": "succeeded", "analyze": "failed"})

    page = release_page(logged_in_client, release)
    board = logged_in_client.get(reverse("adaptation:board")).content.decode()

    for html in (readiness_row(page, "cpu"), board):
        level = dom.find(html, 'span[class="level level-none"]')
        assert level.text == "Not yet rated"
        assert "experimental" in level.get("title", "")
    assert "None yet" not in page and "None yet" not in board
