"""The release notes in real Chromium: in print media the notes page hides navigation,
buttons and forms, and the printable page prints to a PDF with each major section on its own
page. The PDF and a screenshot go to var/test/artifacts/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adaptation.roles import ENGINEER, role_grant
from tests.adaptation.services.test_release_notes_store import finished_job
from tests.helpers import run_queued_stages

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "test" / "artifacts"
USERNAME, PASSWORD = "noter", "print-the-notes"
# The generated document's major sections: each one after the first starts a printed page.
SECTIONS = (
    "Configuration",
    "Multi-device validation",
    "Performance recommendations",
    "Precision",
    "Operator coverage",
    "Stability",
    "Known limitations",
    "What was not validated",
)


def test_the_notes_print_cleanly(live_server, page, django_user_model):
    from playwright.sync_api import expect

    job = run_queued_stages(finished_job())
    user = django_user_model.objects.create_user(username=USERNAME, password=PASSWORD)
    role_grant(user=user, role=ENGINEER)
    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill(USERNAME)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/")

    page.goto(f"{live_server.url}/releases/{job.release_id}/notes/?pool={job.pool.name}")
    expect(page.locator("#notes-additions-save")).to_be_visible()
    expect(page.locator(".site-header nav")).to_be_visible()
    page.emulate_media(media="print")
    for hidden in (".site-header", "#notes-print", "#notes-additions-edit", "#notes-versions"):
        expect(page.locator(hidden)).to_be_hidden()
    expect(page.get_by_role("heading", name="Configuration", level=2)).to_be_visible()

    page.goto(f"{live_server.url}/releases/{job.release_id}/notes/print/?pool={job.pool.name}")
    for title in SECTIONS:
        expect(page.get_by_role("heading", name=title, level=2)).to_be_visible()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "release-notes-print.png"), full_page=True)
    pdf = page.pdf(format="A4", path=str(ARTIFACTS / "release-notes.pdf"))
    pages = len(re.findall(rb"/Type\s*/Page(?!s)", pdf))
    assert pages >= len(SECTIONS)  # a page per major section (the first shares the title's)
