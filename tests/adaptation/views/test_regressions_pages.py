"""Regressions on the pages: the release page's finding (metric, value and unit, baseline
spread and median, the jobs compared with, the scope) and the board's badge on the row of a
pool whose newest job regressed."""

from __future__ import annotations

import pytest

from tests import dom
from tests.factories import make_release

pytestmark = pytest.mark.django_db


@pytest.fixture
def regressed(perf_job):
    """A release whose third job's knee runs 80 tokens/s against 100, 104 and 98 before it."""
    release = make_release(family="llama")
    baseline = [perf_job(release, tokens_per_s=v) for v in (100.0, 104.0, 98.0)]
    return release, baseline, perf_job(release, tokens_per_s=80.0)


def test_the_release_page_says_what_regressed_against_what(logged_in_client, regressed):
    release, baseline, job = regressed
    response = logged_in_client.get(f"/releases/{release.pk}/")
    assert response.status_code == 200
    text = dom.text(response)
    assert f"Job {job.pk} on pool cpu: 1 figure regressed" in text
    newest_first = ", ".join(f"job {each.pk}" for each in reversed(baseline))
    assert (
        "decode tokens/s at the knee (lower is worse) the scaled twin, bfloat16, 32-token prompts "
        "80 tokens/s 100 tokens/s 98 tokens/s to 104 tokens/s 20.0% (margin 10.0%) "
        f"3 runs of the same release: {newest_first}"
    ) in text
    page = response.content.decode()
    for each in baseline:
        assert f'href="/releases/{release.pk}/?job={each.pk}#job-{each.pk}"' in page
    # Words and links are spaced in the HTML itself, not only in the text a reader extracts.
    assert f'of the same release: <a href="/releases/{release.pk}/?job=' in page
    assert f"job {baseline[-1].pk}</a>, <a href=" in page


def test_a_release_without_regressions_shows_no_finding(logged_in_client, perf_job):
    release = make_release()
    for tokens in (100.0, 101.0, 99.0):
        perf_job(release, tokens_per_s=tokens)
    page = logged_in_client.get(f"/releases/{release.pk}/").content.decode()
    assert '<div id="regressions">' in page  # the live poll's target
    assert "Regressions" not in dom.text(logged_in_client.get(f"/releases/{release.pk}/"))


def test_the_board_badges_the_pool_whose_newest_job_regressed(logged_in_client, regressed):
    release, _, job = regressed
    page = logged_in_client.get("/").content.decode()
    badge = dom.find(page, f'a[class="regressed"]#regressed-{release.pk}-cpu')
    assert badge.text == "Regressed"
    assert badge["href"] == f"/releases/{release.pk}/?job={job.pk}#regressions"
    assert badge["title"] == (
        f"Job {job.pk} on cpu: 1 regression against the last good runs: decode tokens/s at the "
        "knee (the scaled twin, bfloat16, 32-token prompts)"
    )


def test_a_newer_job_without_regressions_clears_the_badge(logged_in_client, regressed, perf_job):
    release, _, _ = regressed
    perf_job(release, tokens_per_s=101.0)
    assert 'class="regressed"' not in logged_in_client.get("/").content.decode()


def test_the_board_reads_regressions_in_one_query_whatever_their_number(logged_in_client, perf_job):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def regress_one_release() -> None:
        release = make_release()
        for tokens in (100.0, 101.0, 80.0):
            perf_job(release, tokens_per_s=tokens)

    regress_one_release()
    with CaptureQueriesContext(connection) as one:
        page = logged_in_client.get("/").content.decode()
    assert page.count('class="regressed"') == 1
    for _ in range(3):
        regress_one_release()
    with CaptureQueriesContext(connection) as four:
        page = logged_in_client.get("/").content.decode()
    assert page.count('class="regressed"') == 4
    assert len(four) == len(one), [query["sql"] for query in four.captured_queries]
    assert sum("adaptation_regression" in q["sql"] for q in four.captured_queries) == 1


def test_the_release_pages_live_poll_carries_the_finding(logged_in_client, regressed):
    release, _, job = regressed
    response = logged_in_client.get(f"/releases/{release.pk}/", headers={"HX-Request": "true"})
    page = response.content.decode()
    assert '<div id="regressions" hx-swap-oob="true">' in page
    assert f'id="regressions-job-{job.pk}"' in page
