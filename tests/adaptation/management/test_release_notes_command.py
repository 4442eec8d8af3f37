"""`manage.py release_report RELEASE --format md|html [--pool] [--output] [--regenerate]`:
the latest notes with their additions; exit 1 with the reason when there are none."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from adaptation.services.release_notes import release_notes_additions_update
from tests.adaptation.services.test_release_notes_store import finished_job
from tests.factories import make_job, make_release
from tests.helpers import run_queued_stages
from tests.performance_rows import h200_pool

pytestmark = pytest.mark.django_db


def report(*args: str) -> str:
    out = io.StringIO()
    call_command("release_report", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.fixture
def job():
    job = run_queued_stages(finished_job())
    release_notes_additions_update(release=job.release, pool=job.pool, body="Checked by **ops**.")
    return job


def test_markdown_by_release_id_and_by_repo_id(job):
    by_id = report(str(job.release_id))
    assert by_id.startswith("# Release notes: openai/gpt-oss-20b on pool h200x8\n\n*Version 1,")
    assert "vllm serve openai/gpt-oss-20b" in by_id
    assert by_id.rstrip().endswith("UTC.*")  # the additions' line closes the document
    assert "## Additions\n\nChecked by **ops**." in by_id
    assert report("openai/gpt-oss-20b", "--format", "md") == by_id
    assert report(f"openai/gpt-oss-20b@{job.release.revision[:10]}", "--pool", "h200x8") == by_id


def test_html_to_a_file(job, tmp_path):
    path = tmp_path / "notes.html"
    assert report(str(job.release_id), "--format", "html", "--output", str(path)) == ""
    html = path.read_text()
    assert html.startswith("<!doctype html>") and "@media print" in html
    assert "<h1>Release notes: openai/gpt-oss-20b on pool h200x8</h1>" in html
    assert "<p>Checked by <strong>ops</strong>.</p>" in html


def test_the_newest_release_of_a_repo_is_the_default(job):
    newer = make_release(repo_id="openai/gpt-oss-20b")  # a later revision, without notes yet
    with pytest.raises(CommandError, match=rf"release {newer.pk}\) has no release notes: it has"):
        report("openai/gpt-oss-20b")
    assert "Version 1" in report(f"openai/gpt-oss-20b@{job.release.revision}")


@pytest.mark.parametrize(
    ("ref", "reason"),
    [
        ("999", "No release 999."),
        ("acme/none", "No release of acme/none."),
        ("nonsense", "'nonsense' is neither a release id nor org/name"),
    ],
)
def test_an_unknown_release_exits_1_with_the_reason(ref, reason):
    with pytest.raises(CommandError, match=reason):
        report(ref)


def test_no_notes_suggests_running_or_regenerating(db):
    release = make_release(repo_id="acme/fresh")
    with pytest.raises(CommandError, match=r"no job yet; run one \(manage.py adapt acme/fresh"):
        report("acme/fresh")
    make_job(
        release=release,
        pool=h200_pool(),
        stages=("fetch", "analyze", "release_notes"),
        statuses={"fetch": "failed", "analyze": "skipped", "release_notes": "skipped"},
        errors={"fetch": "config.json is not valid JSON"},
    )
    with pytest.raises(CommandError, match=r"an earlier stage\s+failed.*--regenerate"):
        report("acme/fresh")
    text = report("acme/fresh", "--regenerate")
    assert "`fetch`: failed: config.json is not valid JSON." in text
    assert "*Version 1, generated" in text


def test_an_unknown_pool_or_version_exits_1(job):
    with pytest.raises(CommandError, match="No pool 'h100'; pools: "):
        report(str(job.release_id), "--pool", "h100")
    with pytest.raises(CommandError, match="has no version 7 of its notes on pool h200x8"):
        report(str(job.release_id), "--notes-version", "7")


def test_the_exit_status_is_1(job, capsys):
    with pytest.raises(SystemExit) as exited:
        from django.core.management import execute_from_command_line

        execute_from_command_line(["manage.py", "release_report", "999"])
    assert exited.value.code == 1
    assert "No release 999." in capsys.readouterr().err


def test_regenerate_writes_from_the_job_named(db):
    release = make_release(repo_id="acme/two-jobs")
    pool = h200_pool()
    older = make_job(
        release=release,
        pool=pool,
        stages=("fetch", "analyze", "release_notes"),
        statuses={"fetch": "failed", "analyze": "skipped", "release_notes": "skipped"},
        errors={"fetch": "config.json is not valid JSON"},
    )
    make_job(
        release=release,
        pool=pool,
        stages=("fetch",),
        statuses={"fetch": "failed"},
        errors={"fetch": "the hub answered 404"},
    )
    newest = report("acme/two-jobs", "--regenerate")
    assert "the hub answered 404" in newest  # the newest finished job by default
    chosen = report("acme/two-jobs", "--regenerate", "--job", str(older.pk))
    assert "`fetch`: failed: config.json is not valid JSON." in chosen
    assert "*Version 2, generated" in chosen
    with pytest.raises(CommandError, match="add --regenerate"):
        report("acme/two-jobs", "--job", str(older.pk))
    with pytest.raises(CommandError, match="acme/two-jobs has no job 999999"):
        report("acme/two-jobs", "--regenerate", "--job", "999999")
