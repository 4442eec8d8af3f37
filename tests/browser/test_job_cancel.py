"""Cancelling a job from the release page in Chromium: the button sits in a closed
disclosure, stays open through the job panel's live refresh, and cancels only once clicked."""

from __future__ import annotations

import re

import pytest

from adaptation.models import AdaptationJob
from adaptation.roles import ENGINEER, role_grant
from tests.factories import make_job

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

USERNAME, PASSWORD = "eli-browser", "cancel-with-care"


def test_cancel_asks_first_and_survives_the_live_refresh(live_server, page, django_user_model):
    from playwright.sync_api import expect

    user = django_user_model.objects.create_user(username=USERNAME, password=PASSWORD)
    role_grant(user=user, role=ENGINEER)
    job = make_job(statuses={"fetch": "succeeded", "analyze": "running"})
    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill(USERNAME)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/")
    page.goto(f"{live_server.url}/releases/{job.release_id}/")

    confirm = page.locator(f"#cancel-{job.pk}")
    expect(confirm).to_be_hidden()  # one click does not cancel: the button is folded
    page.locator(f"#cancel-open-{job.pk}").click()
    expect(confirm).to_be_visible()
    expect(confirm).to_have_text(f"Yes, cancel job #{job.pk}")
    expect(page.locator(f"#cancel-what-{job.pk}")).to_contain_text("can be re-run later")
    # The panel refreshes itself while the job runs: the open confirmation stays open.
    with page.expect_response(lambda r: r.request.headers.get("hx-request") == "true"):
        pass
    expect(confirm).to_be_visible()
    job.refresh_from_db()
    assert job.status == "running"

    confirm.click()
    expect(page.get_by_text(re.compile(rf"Job {job.pk} cancelled"))).to_be_visible()
    assert AdaptationJob.objects.get(pk=job.pk).status == "cancelled"
    expect(page.locator(f"#cancel-{job.pk}")).to_have_count(0)
