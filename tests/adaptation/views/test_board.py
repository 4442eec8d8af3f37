"""The release board: login, rows and cells, the Day-0 clock, live refresh, hub trouble."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.template.loader import get_template
from django.urls import reverse
from django.utils import timezone

from adaptation.models import StageRun
from adaptation.presenters.board import cell_figure_template
from adaptation.stages import app_stages
from engine.registry import stage_names
from engine.stages.operators.result import OperatorCounts, OperatorsResult
from tests import dom
from tests.factories import make_job, make_release, make_watch
from tests.worker_rows import make_worker

pytestmark = pytest.mark.django_db

BOARD = reverse("adaptation:board")
# An operators run on which 2 of 42 operators are missing, as the stage stores it.
OPERATORS_TWO_MISSING = OperatorsResult(counts=OperatorCounts(covered=40, missing=2)).to_dict()


def cell_text(html: str, release_pk: int, stage: str) -> str:
    """The whitespace-collapsed text of one stage cell of one release row."""
    row = dom.find(html, f"tr#release-row-{release_pk}")
    # The cell's parts (status, duration, attempt, ...) are laid out on lines of their own.
    return " ".join(dom.find(row, f'td[class^="stage-cell"][data-stage="{stage}"]').strings)


def test_board_requires_login(client):
    response = client.get(BOARD)
    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))
    assert "next=/" in response.url


def test_board_lists_releases_newest_first_with_stage_cells(logged_in_client):
    now = timezone.now()
    old = make_release(repo_id="meta-llama/Llama-3.1-8B", discovered_at=now - timedelta(days=1))
    new = make_release(
        repo_id="deepseek-ai/DeepSeek-V3",
        discovered_at=now,
        family="deepseek_v3",
        architecture="DeepseekV3ForCausalLM",
    )
    make_job(release=old, statuses={"fetch": "succeeded", "analyze": "succeeded"})
    make_job(
        release=new,
        statuses={"fetch": "succeeded", "analyze": "failed"},
        errors={"analyze": "Unknown architecture FooForCausalLM\nsecond line"},
    )

    html = logged_in_client.get(BOARD).content.decode()

    assert html.index("deepseek-ai/DeepSeek-V3") < html.index("meta-llama/Llama-3.1-8B")
    assert cell_text(html, new.pk, "fetch") == "Succeeded 3.0 s"
    assert cell_text(html, new.pk, "analyze") == "Failed 3.0 s"
    assert cell_text(html, old.pk, "analyze") == "Succeeded 3.0 s"
    assert 'title="Unknown architecture FooForCausalLM"' in html
    assert reverse("adaptation:release_detail", args=[new.pk]) in html
    assert f'<code title="{new.revision}">{new.revision[:12]}</code>' in html
    assert "deepseek_v3" in html and "DeepseekV3ForCausalLM" in html
    assert "Hugging Face Hub" in html and "pool cpu" in html and "hub poll" in html


def test_stage_columns_use_registry_titles(logged_in_client):
    from engine.registry import get_stage

    make_job(statuses={"fetch": "running"})
    html = logged_in_client.get(BOARD).content.decode()
    for name in ("fetch", "analyze"):
        header = dom.find(html, f'th[scope="col"].stage-col[data-stage="{name}"]')
        title = get_stage(name).title
        assert header.get("title") == header.text == title


def test_cell_shows_latest_attempt_number(logged_in_client):
    job = make_job(statuses={"fetch": "succeeded", "analyze": "failed"})
    StageRun.objects.create(job=job, stage="analyze", position=1, attempt=2, status="queued")
    make_worker()  # a live worker on pool.cpu: the stage is queued, not waiting for one
    html = logged_in_client.get(BOARD).content.decode()
    assert cell_text(html, job.release.pk, "analyze") == "Queued attempt 2"
    assert cell_text(html, job.release.pk, "fetch") == "Succeeded 3.0 s"


def finish_stages(job, at, *, attempt: int = 1) -> None:
    """Move the finish of the job's attempt-`attempt` runs to `at` (analyze) and 30 s
    before (fetch)."""
    StageRun.objects.filter(job=job, stage="fetch", attempt=attempt).update(
        finished_at=at - timedelta(seconds=30)
    )
    StageRun.objects.filter(job=job, stage="analyze", attempt=attempt).update(finished_at=at)


def clock_text(html: str, release_pk: int) -> str:
    """The text of the clock cell of one release row."""
    return dom.text(html, f"tr#release-row-{release_pk} td.clock")


@pytest.mark.usefixtures("fetch_analyze_readiness")
def test_day0_clock(logged_in_client):
    now = timezone.now()
    ready = make_release(published_at=now - timedelta(hours=3))
    job = make_job(release=ready, statuses={"fetch": "succeeded", "analyze": "succeeded"})
    finish_stages(job, ready.published_at + timedelta(hours=2, minutes=14))
    unknown = make_release(published_at=None)
    make_job(release=unknown, statuses={"fetch": "running"})

    html = logged_in_client.get(BOARD).content.decode()

    ready_row = dom.find(html, f"tr#release-row-{ready.pk}")
    assert "ready after 2 h 14 m" in ready_row.text
    assert "published 3 h 00 m ago" in ready_row.text
    assert "3 h 00 m" in dom.texts(ready_row, "strong")
    assert "re-run" not in ready_row.html
    unknown_row = dom.find(html, f"tr#release-row-{unknown.pk}").html
    assert "published time unknown" in unknown_row
    assert "ready after" not in unknown_row


@pytest.mark.usefixtures("fetch_analyze_readiness")
def test_day0_clock_keeps_the_first_readiness_through_a_later_successful_rerun(
    logged_in_client,
):
    now = timezone.now()
    release = make_release(published_at=now - timedelta(hours=3))
    job = make_job(release=release, statuses={"fetch": "succeeded", "analyze": "succeeded"})
    finish_stages(job, release.published_at + timedelta(minutes=1, seconds=2))
    # A re-run of analyze an hour later, succeeded: the job's finish moves, readiness not.
    StageRun.objects.create(
        job=job,
        stage="analyze",
        position=1,
        attempt=2,
        status="succeeded",
        started_at=now - timedelta(minutes=5),
        finished_at=now - timedelta(minutes=4),
    )
    job.finished_at = now - timedelta(minutes=4)
    job.save(update_fields=["finished_at"])
    # And a manual re-adapt (a newer job) that also succeeded later still.
    newer = make_job(
        release=release,
        statuses={"fetch": "succeeded", "analyze": "succeeded"},
        trigger="manual",
        created_at=now - timedelta(minutes=2),
    )
    finish_stages(newer, now - timedelta(minutes=1))

    html = logged_in_client.get(BOARD).content.decode()

    assert clock_text(html, release.pk) == (
        "published 3 h 00 m ago detected after 3 h 00 m ready after 1 m 02 s from publication "
        "cpu Complete"
    )


@pytest.mark.usefixtures("fetch_analyze_readiness")
@pytest.mark.parametrize(
    ("newest_statuses", "shown", "level"),
    [
        # A re-run that ran a stage and failed it is the pool's news: it lowers the level.
        (
            {"fetch": "succeeded", "analyze": "failed"},
            "re-run failed",
            "Not yet rated · needs Architecture analysis",
        ),
        # One still running, queued or pending ran nothing yet: the older success stands.
        ({"fetch": "succeeded", "analyze": "running"}, "re-run running", "Complete"),
        ({"fetch": "queued"}, "re-run running", "Complete"),
        ({}, "re-run pending", "Complete"),
    ],
)
def test_day0_clock_stays_ready_while_a_rerun_runs_or_after_it_failed(
    logged_in_client, newest_statuses, shown, level
):
    now = timezone.now()
    release = make_release(published_at=now - timedelta(hours=3))
    first = make_job(release=release, statuses={"fetch": "succeeded", "analyze": "succeeded"})
    finish_stages(first, release.published_at + timedelta(minutes=1, seconds=2))
    make_job(
        release=release,
        statuses=newest_statuses,
        errors={"analyze": "boom"},
        trigger="manual",
        created_at=timezone.now() + timedelta(seconds=5),
    )

    html = logged_in_client.get(BOARD).content.decode()

    # Day 0 stays; per stage the pool's readiness reads the newest job that ran it.
    assert clock_text(html, release.pk) == (
        f"published 3 h 00 m ago detected after 3 h 00 m ready after 1 m 02 s from publication "
        f"· {shown} cpu {level}"
    )
    assert "not ready" not in clock_text(html, release.pk)


@pytest.mark.usefixtures("fetch_analyze_readiness")
def test_day0_clock_counts_a_stage_rerun_within_the_same_job(logged_in_client):
    """A stage that failed and succeeded on its second attempt: ready when that attempt
    finished; a third attempt that fails later does not undo it."""
    now = timezone.now()
    release = make_release(published_at=now - timedelta(hours=1))
    job = make_job(
        release=release,
        statuses={"fetch": "succeeded", "analyze": "failed"},
        errors={"analyze": "x"},
    )
    StageRun.objects.filter(job=job, stage="fetch").update(
        finished_at=release.published_at + timedelta(minutes=5)
    )
    StageRun.objects.create(
        job=job,
        stage="analyze",
        position=1,
        attempt=2,
        status="succeeded",
        finished_at=release.published_at + timedelta(minutes=20),
    )
    StageRun.objects.create(
        job=job, stage="analyze", position=1, attempt=3, status="failed", error="later"
    )
    from adaptation.services.jobs import job_refresh_status

    job_refresh_status(job=job)

    html = logged_in_client.get(BOARD).content.decode()

    assert clock_text(html, release.pk) == (
        "published 1 h 00 m ago detected after 1 h 00 m ready after 20 m 00 s from publication "
        "· re-run failed cpu Not yet rated · needs Architecture analysis"
    )


def test_day0_clock_not_ready_when_no_job_ever_succeeded(logged_in_client):
    release = make_release(published_at=timezone.now() - timedelta(hours=1))
    make_job(release=release, statuses={"fetch": "succeeded", "analyze": "failed"})
    html = logged_in_client.get(BOARD).content.decode()
    assert clock_text(html, release.pk) == (
        "published 1 h 00 m ago detected after 1 h 00 m not ready: a stage failed "
        "cpu Not yet rated · needs Architecture analysis"
    )


def test_htmx_request_gets_only_the_partial_and_polls_while_running(logged_in_client):
    job = make_job(statuses={"fetch": "succeeded", "analyze": "running"})

    response = logged_in_client.get(BOARD, headers={"HX-Request": "true"})

    html = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in html and "<header" not in html
    assert html.lstrip().startswith('<table id="board-table"')
    assert 'hx-trigger="every 3s"' in html
    assert f'hx-get="{BOARD}"' in html
    assert 'hx-swap="outerHTML"' in html
    assert cell_text(html, job.release.pk, "analyze").startswith("Running")
    assert "HX-Request" in response.headers["Vary"]


def test_full_page_polls_while_running(logged_in_client):
    make_job(statuses={"fetch": "queued"})
    html = logged_in_client.get(BOARD).content.decode()
    assert "<html" in html
    assert 'hx-trigger="every 3s"' in html
    assert "Live: refreshing every 3 s while stages run" in html
    assert "Checking for new releases" not in html


def test_board_polls_slowly_when_nothing_runs(logged_in_client):
    """An idle board keeps asking, slowly, so a release the hub poll finds appears."""
    job = make_job(statuses={"fetch": "succeeded", "analyze": "running"})
    StageRun.objects.filter(job=job, stage="analyze").update(
        status="succeeded", finished_at=timezone.now()
    )

    html = logged_in_client.get(BOARD, headers={"HX-Request": "true"}).content.decode()

    assert 'hx-trigger="every 20s"' in html and "every 3s" not in html
    assert f'hx-get="{BOARD}"' in html and 'hx-swap="outerHTML"' in html
    assert cell_text(html, job.release.pk, "analyze").startswith("Succeeded")
    assert "Checking for new releases every 20 s" in html
    assert "Live: refreshing" not in html


def test_empty_board(logged_in_client):
    html = logged_in_client.get(BOARD).content.decode()
    assert "No releases yet." in html
    assert 'hx-trigger="every 20s"' in html
    assert "Checking for new releases every 20 s" in html


def test_idle_board_poll_shows_a_release_found_since(logged_in_client):
    first = logged_in_client.get(BOARD, headers={"HX-Request": "true"}).content.decode()
    assert "No releases yet." in first and 'hx-trigger="every 20s"' in first

    release = make_release(repo_id="openai/gpt-oss-20b")
    make_job(release=release)  # pending: found, not yet queued

    later = logged_in_client.get(BOARD, headers={"HX-Request": "true"}).content.decode()
    assert f'id="release-row-{release.pk}"' in later
    assert 'hx-trigger="every 20s"' in later


def test_failed_watch_shows_in_hub_trouble_banner(logged_in_client):
    make_watch(
        name="deepseek-org",
        last_error=(
            "2025-01-01 10:00:00 UTC: Hub answered 429 Too Many Requests (next try in 600 s)"
        ),
        consecutive_failures=2,
    )
    make_watch(name="healthy-watch")
    make_watch(name="disabled-broken", enabled=False, last_error="401 gated")

    html = logged_in_client.get(BOARD).content.decode()

    assert "Hub trouble" in html
    assert "The trouble is in reaching the hub (the hub, the network or the watch" in html
    assert "not in a release" in html
    assert "deepseek-org" in html
    assert "Hub answered 429 Too Many Requests (next try in 600 s)" in html
    assert "2 failed polls in a row" in html
    assert "healthy-watch" not in html
    assert "disabled-broken" not in html


def test_htmx_partial_refreshes_hub_trouble_out_of_band(logged_in_client):
    make_job(statuses={"fetch": "running"})
    make_watch(name="gated-watch", last_error="403: the repo is gated")
    html = logged_in_client.get(BOARD, headers={"HX-Request": "true"}).content.decode()
    assert (
        '<div id="hub-trouble" class="banner banner-warning" '
        'aria-labelledby="hub-trouble-title" hx-swap-oob="true">' in html
    )
    assert "403: the repo is gated" in html


def test_hub_data_is_escaped(logged_in_client):
    make_job(release=make_release(repo_id="evil/<script>alert(1)</script>"))
    html = logged_in_client.get(BOARD).content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


@pytest.mark.django_db
def test_an_htmx_poll_after_the_session_expired_sends_the_browser_to_login(client):
    response = client.get("/", headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert response["HX-Redirect"] == "/accounts/login/?next=/"


@pytest.mark.django_db
def test_missing_operators_show_on_the_board(logged_in_client):
    job = make_job(
        stages=("fetch", "analyze", "operators"),
        statuses={"fetch": "succeeded", "analyze": "succeeded", "operators": "succeeded"},
        results={"operators": OPERATORS_TWO_MISSING},
    )
    html = logged_in_client.get("/").content.decode()
    row = html[html.index(f'id="release-row-{job.release_id}"') :]
    cell = row[row.index('data-stage="operators"') :]
    assert "2 operators missing" in cell[: cell.index("</td>")]


def test_every_board_cell_figure_is_a_registered_stage_with_its_template():
    cell_figures = [app.name for app in app_stages() if app.cell_figure_keys]
    assert cell_figures
    for stage in cell_figures:
        assert stage in stage_names()
        get_template(cell_figure_template(stage))  # raises TemplateDoesNotExist without one
