"""What keeps the release page fast with many jobs: its query count does not grow
with the jobs (the results of jobs it does not draw in full are not read: reading one would
cost a query each), and a view after the first embeds stored figures instead of building them
with plotly."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests import dom
from tests.factories import make_release
from tests.performance_rows import DENSE, MOE, measured_job

pytestmark = pytest.mark.django_db


def embedded_figures(html: str) -> dict[str, str]:
    """Each chart's figure JSON as the page embeds it, by its `<script>`'s id."""
    scripts = dom.find_all(html, 'script[id$="-figure"][type="application/json"]')
    return {script["id"]: script.raw_text for script in scripts}


def page(client, release) -> tuple[str, int]:
    """The page's HTML and how many queries it took."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("adaptation:release_detail", args=[release.pk]))
    assert response.status_code == 200
    return response.content.decode(), len(queries.captured_queries)


def test_the_query_count_is_the_same_for_one_job_and_five(logged_in_client):
    one = make_release(repo_id="org/one-job")
    measured_job(DENSE, release=one)
    five = make_release(repo_id="org/five-jobs")
    for n in range(5):
        measured_job(
            DENSE if n % 2 == 0 else MOE, release=five, stability="" if n % 2 else "stability"
        )

    _, one_queries = page(logged_in_client, one)
    html, five_queries = page(logged_in_client, five)

    assert five_queries == one_queries
    # Each older job is a line of the history, not a second set of panels.
    assert html.count('id="history-job-') == 5


def test_a_second_view_embeds_the_stored_figures(logged_in_client, monkeypatch):
    cache.clear()
    job = measured_job(DENSE)
    first, _ = page(logged_in_client, job.release)
    figures = embedded_figures(first)
    assert len(figures) >= 5, list(figures)  # plan, performance and stability charts

    def no_plotly(*args, **kwargs):
        raise AssertionError("a figure was built again")

    monkeypatch.setattr(go, "Figure", no_plotly)
    second, _ = page(logged_in_client, job.release)

    assert embedded_figures(second) == figures
