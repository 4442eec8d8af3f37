"""The notes pages: the latest version with its history, an older version, the Markdown
download and the printable page (with its print stylesheet), people's additions (engineers
edit, managers read), safe rendering, and the release page's summary and link."""

from __future__ import annotations

import re

import pytest

from adaptation.models import KnownLimitation, ReleaseNotesAdditions, Severity
from adaptation.services.release_notes import (
    release_notes_additions_update,
    release_notes_regenerate,
)
from tests import dom
from tests.adaptation.services.test_release_notes_store import finished_job
from tests.factories import make_job, make_release
from tests.helpers import run_queued_stages

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(cast):
    """A finished gpt-oss-20b job with notes version 1 and 2, and an open limitation whose
    title tries to inject a script."""
    job = finished_job()
    KnownLimitation.objects.create(
        release=job.release,
        title='MXFP4 <script>alert("x")</script> on old drivers',
        body="Use `--dtype bfloat16`. <img src=x onerror=alert(1)> [x](javascript:alert(1))",
        severity=Severity.MAJOR,
        stage="operators",
    )
    job = run_queued_stages(job)
    release_notes_regenerate(job=job)
    return job


def notes_url(job, suffix="notes/", **params) -> str:
    query = "&".join(f"{k}={v}" for k, v in ({"pool": job.pool.name} | params).items())
    return f"/releases/{job.release_id}/{suffix}?{query}"


def test_the_notes_page_shows_the_latest_version_and_its_history(client, cast, job):
    client.force_login(cast.mona)
    html = client.get(notes_url(job)).content.decode()
    assert "Version <strong>2</strong> (the latest)" in html
    assert '<article class="notes-document" id="release-notes-document">' in html
    assert "<h1>Release notes: openai/gpt-oss-20b on pool h200x8</h1>" in html
    assert (
        '<code class="language-sh">vllm serve openai/gpt-oss-20b --tensor-parallel-size 1' in html
    )
    assert "<th>Figure</th>" in html  # Markdown tables render as tables
    assert f'href="?pool={job.pool.name}&amp;version=1">version 1</a>' in html
    assert f'href="?pool={job.pool.name}&amp;version=2">version 2</a>' in html
    assert "(regenerated)" in html and "(release_notes stage)" in html
    older = client.get(notes_url(job, version=1)).content.decode()
    assert "Version <strong>1</strong>, an older one" in older
    assert "the latest is version 2" in older


def test_the_pool_defaults_to_the_one_with_the_newest_notes(client, cast, job):
    client.force_login(cast.mona)
    html = client.get(f"/releases/{job.release_id}/notes/").content.decode()
    assert "on pool h200x8</h1>" in html


def test_notes_are_rendered_safely(client, cast, job):
    client.force_login(cast.mona)
    html = client.get(notes_url(job)).content.decode()
    assert "<script>" not in html.split("</header>", 1)[1]
    assert "&lt;script&gt;alert" in html
    assert "<img" not in html and 'href="javascript:' not in html  # shown as text, inert


def test_the_markdown_download_has_the_notes_and_then_the_additions(client, cast, job):
    release_notes_additions_update(
        release=job.release, pool=job.pool, body="Tested by hand on **driver 550**.", by=cast.eli
    )
    client.force_login(cast.mona)
    response = client.get(notes_url(job, suffix="notes.md"))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"] == (
        'attachment; filename="openai_gpt-oss-20b-h200x8-notes-v2.md"'
    )
    text = response.content.decode()
    assert text.startswith("# Release notes: openai/gpt-oss-20b on pool h200x8\n\n*Version 2,")
    generated, _, added = text.partition("\n## Additions\n")
    assert "## What was not validated" in generated
    assert "Tested by hand on **driver 550**." in added
    assert "last edited by eli" in added
    first = client.get(notes_url(job, suffix="notes.md", version=1)).content.decode()
    assert first.startswith("# Release notes: openai/gpt-oss-20b on pool h200x8\n\n*Version 1,")
    assert "Tested by hand" in first  # additions belong to every version


def test_the_printable_page_has_a_print_stylesheet_and_no_navigation(client, cast, job):
    release_notes_additions_update(
        release=job.release,
        pool=job.pool,
        body="See [the runbook](https://runbooks.example/gpt-oss).",
    )
    client.force_login(cast.mona)
    for url in (notes_url(job, suffix="notes/print/"), notes_url(job, print=1)):
        response = client.get(url)
        assert response.status_code == 200
        html = response.content.decode()
        # The inline stylesheet carries the nonce the response's Content-Security-Policy names.
        nonce = re.search(r"style-src [^;]*'nonce-([^']+)'", response["Content-Security-Policy"])
        opening = f'<style nonce="{nonce.group(1)}">'
        style = dom.find(html, f'style[nonce="{nonce.group(1)}"]').raw_text
        assert "@media print" in style
        assert ".notes-document h2 ~ h2 { break-before: page;" in style  # sections on new pages
        assert "break-inside: avoid" in style  # tables are not split
        assert 'a[href]:not([href^="#"])::after { content: " (" attr(href) ")"' in style
        assert "site-header" not in html.split(opening)[0] + html.split("</style>")[1]
        body = html.split("</style>", 1)[1]
        assert "<nav" not in body and "<button" not in body and "<form" not in body
        assert "<h2>Additions</h2>" in body and 'href="https://runbooks.example/gpt-oss"' in body
        assert "<h2>Configuration</h2>" in body


def test_the_release_page_summarises_the_notes_and_links_them(client, cast, job):
    client.force_login(cast.mona)
    html = client.get(f"/releases/{job.release_id}/").content.decode()
    summary = dom.find(html, "section#release-notes").html
    assert "<strong>Pool h200x8</strong>: version 2</a>" in summary
    assert "from job" in summary and "(regenerated)" in summary
    assert f'href="/releases/{job.release_id}/notes/?pool=h200x8"' in summary
    assert f'href="/releases/{job.release_id}/notes.md?pool=h200x8"' in summary
    link = f'href="/releases/{job.release_id}/notes/?pool=h200x8" id="job-{job.pk}-notes"'
    assert link in html  # from the job panel


def missing_text(html: str, part: str) -> str:
    """The text of one paragraph (`notes-missing-<part>`) of the page without notes."""
    return dom.text(html, f"p#notes-missing-{part}")


def test_without_notes_the_page_says_why_and_how_to_get_them(client, cast):
    """A release that exists but has no notes yet is a page (200), not a missing one: it says
    no job reached the release_notes stage, that notes are written when a job ends, and, to
    an engineer, offers to write them from the job that ended."""
    job = finished_job(notes_status="skipped")
    client.force_login(cast.eli)
    response = client.get(f"/releases/{job.release_id}/notes/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "No release notes yet" in html
    assert missing_text(html, "why").startswith(
        "No job of this release has reached its release_notes stage yet. "
        "The notes are written when a job ends"
    )
    # The job ended (its notes stage skipped): an engineer can write notes from it.
    assert f'action="/jobs/{job.pk}/notes/regenerate/"' in html
    assert "can still have notes written" in missing_text(html, "what")
    assert client.get(f"/releases/{job.release_id}/notes.md").status_code == 404
    assert client.get(f"/releases/{job.release_id}/notes/print/").status_code == 404
    # A manager reads that an engineer can write them, without the buttons.
    client.force_login(cast.mona)
    html = client.get(f"/releases/{job.release_id}/notes/").content.decode()
    assert missing_text(html, "what").startswith("An engineer can write notes from a job")
    assert "/notes/regenerate/" not in html


def test_without_notes_a_running_job_is_named_and_a_release_without_jobs_says_so(client, cast):
    client.force_login(cast.mona)
    running = make_job(release=make_release(), statuses={"fetch": "running"})
    response = client.get(f"/releases/{running.release_id}/notes/")
    assert response.status_code == 200
    html = response.content.decode()
    assert missing_text(html, "running") == (
        f"Job {running.pk} ({running.pool.name}) is running: its notes appear here when it ends."
    )
    assert 'id="notes-missing-what"' not in html  # nothing to write them from yet

    alone = make_release()
    response = client.get(f"/releases/{alone.pk}/notes/")
    assert response.status_code == 200
    html = response.content.decode()
    assert missing_text(html, "why").startswith("This release has no adaptation job yet.")
    assert "An engineer can start a job" in missing_text(html, "what")


def test_notes_of_a_release_that_does_not_exist_are_404(client, cast):
    client.force_login(cast.mona)
    assert client.get("/releases/999999/notes/").status_code == 404
    assert client.get("/releases/999999/notes.md").status_code == 404


# --- permissions ---------------------------------------------------------------------------------


def test_a_manager_reads_the_notes_and_cannot_edit_the_additions(client, cast, job):
    client.force_login(cast.mona)
    html = client.get(notes_url(job)).content.decode()
    assert "No additions yet." in html
    assert "Edit additions" not in html and "notes-additions-save" not in html
    assert "notes-regenerate" not in html
    response = client.post(
        f"/releases/{job.release_id}/notes/additions/", {"pool": job.pool.name, "body": "mine"}
    )
    assert response.status_code == 403
    assert not ReleaseNotesAdditions.objects.exists()
    assert client.post(f"/jobs/{job.pk}/notes/regenerate/").status_code == 403


def test_an_engineer_edits_the_additions(client, cast, job):
    client.force_login(cast.eli)
    html = client.get(notes_url(job)).content.decode()
    assert "<summary>Edit additions</summary>" in html
    response = client.post(
        f"/releases/{job.release_id}/notes/additions/",
        {"pool": job.pool.name, "body": "Pin **vLLM 0.10** <b>exactly</b>."},
    )
    assert response.status_code == 302
    assert response["Location"] == f"/releases/{job.release_id}/notes/?pool=h200x8"
    additions = ReleaseNotesAdditions.objects.get()
    assert (additions.body, additions.updated_by) == ("Pin **vLLM 0.10** <b>exactly</b>.", cast.eli)
    html = client.get(notes_url(job)).content.decode()
    assert "Pin <strong>vLLM 0.10</strong> &lt;b&gt;exactly&lt;/b&gt;." in html


def test_an_engineer_regenerates_the_notes(client, cast, job):
    client.force_login(cast.eli)
    response = client.post(f"/jobs/{job.pk}/notes/regenerate/")
    assert response.status_code == 302
    html = client.get(response["Location"]).content.decode()
    assert "Notes version 3 written from job" in html
    assert "Version <strong>3</strong> (the latest)" in html


def test_without_a_role_the_notes_are_not_shown(client, cast, job):
    client.force_login(cast.nina)
    for url in (
        notes_url(job),
        notes_url(job, suffix="notes.md"),
        notes_url(job, suffix="notes/print/"),
    ):
        assert client.get(url).status_code == 403
    client.logout()
    assert client.get(notes_url(job)).status_code == 302  # to the login page


def test_a_bad_version_or_pool_is_refused(client, cast, job):
    client.force_login(cast.mona)
    assert client.get(notes_url(job, version="x")).status_code == 400
    assert client.get(notes_url(job, version=9)).status_code == 404
    assert client.get(f"/releases/{job.release_id}/notes/?pool=nope").status_code == 404
