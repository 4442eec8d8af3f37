"""Re-running a stage from the release page."""

from __future__ import annotations

import pytest
from django.urls import reverse

from adaptation.models import StageRun
from tests.factories import make_job

pytestmark = pytest.mark.django_db


def rerun_url(job, stage: str) -> str:
    return reverse("adaptation:stage_rerun", args=[job.pk, stage])


def attempts(job) -> list[tuple[str, int, str]]:
    return list(
        StageRun.objects.filter(job=job)
        .order_by("position", "attempt")
        .values_list("stage", "attempt", "status")
    )


def test_rerun_creates_new_attempts_of_the_stage_and_those_after_it(
    logged_in_client, django_capture_on_commit_callbacks
):
    job = make_job(statuses={"fetch": "succeeded", "analyze": "failed"}, errors={"analyze": "x"})

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = logged_in_client.post(rerun_url(job, "fetch"), follow=True)

    assert response.redirect_chain[-1][0] == reverse(
        "adaptation:release_detail", args=[job.release_id]
    )
    assert attempts(job) == [
        ("fetch", 1, "succeeded"),
        ("fetch", 2, "queued"),
        ("analyze", 1, "failed"),
        ("analyze", 2, "pending"),
    ]
    assert len(callbacks) == 1  # one send to the pool's queue, after commit
    html = response.content.decode()
    assert f"of job {job.pk} queued again (attempt 2)" in html
    job.refresh_from_db()
    assert job.status == "running"


def test_rerun_of_a_later_stage_keeps_earlier_stages(logged_in_client):
    job = make_job(statuses={"fetch": "succeeded", "analyze": "failed"})
    logged_in_client.post(rerun_url(job, "analyze"))
    assert attempts(job) == [
        ("fetch", 1, "succeeded"),
        ("analyze", 1, "failed"),
        ("analyze", 2, "queued"),
    ]


def test_rerun_refused_while_running(logged_in_client):
    job = make_job(statuses={"fetch": "succeeded", "analyze": "running"})

    response = logged_in_client.post(rerun_url(job, "fetch"), follow=True)

    assert response.status_code == 200
    assert f"Job {job.pk} is still running (analyze); wait for it." in response.content.decode()
    assert StageRun.objects.filter(job=job).count() == 2


def test_rerun_of_unknown_stage_is_refused(logged_in_client):
    job = make_job(statuses={"fetch": "failed"})
    response = logged_in_client.post(rerun_url(job, "nope"), follow=True)
    assert f"Job {job.pk} has no stage &#x27;nope&#x27;" in response.content.decode()
    assert StageRun.objects.filter(job=job).count() == 2


def test_rerun_needs_post_and_login(client, logged_in_client):
    job = make_job(statuses={"fetch": "failed"})
    assert logged_in_client.get(rerun_url(job, "fetch")).status_code == 405
    client.logout()
    response = client.post(rerun_url(job, "fetch"))
    assert response.status_code == 302 and response.url.startswith(reverse("login"))
    assert StageRun.objects.filter(job=job).count() == 2


def test_rerun_of_missing_job_is_404(logged_in_client):
    assert (
        logged_in_client.post(reverse("adaptation:stage_rerun", args=[999999, "fetch"])).status_code
        == 404
    )
