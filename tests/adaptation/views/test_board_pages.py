"""The board a page at a time: 50 releases a page, page links and the live refresh
keep the search, and the same number of queries for 3 releases or 60."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from adaptation.models import AcceleratorPool, KnownLimitation, StageRun
from adaptation.selectors.board import BOARD_PAGE_SIZE
from tests import dom
from tests.adaptation.views.test_board import OPERATORS_TWO_MISSING, cell_text
from tests.factories import make_job, make_release, make_watch

pytestmark = pytest.mark.django_db

BOARD = reverse("adaptation:board")


def releases(count: int, *, prefix: str, start: int = 0) -> list:
    """`count` releases `prefix`-0000, -0001, ..., the first the newest found, each with a
    finished two-stage job."""
    now = timezone.now()
    made = []
    for n in range(start, start + count):
        release = make_release(
            repo_id=f"{prefix}-{n:04d}", discovered_at=now - timedelta(minutes=n)
        )
        make_job(release=release, statuses={"fetch": "succeeded", "analyze": "succeeded"})
        made.append(release)
    return made


def rows(html: str) -> list[int]:
    """The release ids of the board's rows, in order."""
    return [
        int(row["id"].removeprefix("release-row-"))
        for row in dom.find_all(html, 'tr[id^="release-row-"]')
    ]


def link(html: str, link_id: str) -> str:
    """Where the link whose id is `link_id` leads."""
    return dom.attr(html, f"a#{link_id}", "href")


def test_the_board_shows_50_releases_a_page_and_the_51st_on_page_2(logged_in_client):
    made = releases(BOARD_PAGE_SIZE + 1, prefix="org/model")
    first = logged_in_client.get(BOARD).content.decode()
    assert BOARD_PAGE_SIZE == 50
    assert rows(first) == [release.pk for release in made[:50]]
    assert "Releases 1\u201350 of 51." in first and "Page 1 of 2" in first
    assert 'id="board-previous"' not in first
    assert link(first, "board-next") == "/?page=2"

    second = logged_in_client.get(link(first, "board-next")).content.decode()
    assert rows(second) == [made[50].pk]
    assert "Releases 51\u201351 of 51." in second and "Page 2 of 2" in second
    assert link(second, "board-previous") == "/"
    assert 'id="board-next"' not in second
    # The live refresh asks for the page it shows, not the first one.
    assert 'hx-get="/?page=2"' in second


def test_a_page_past_the_last_or_not_a_number_shows_a_page_that_exists(logged_in_client):
    made = releases(3, prefix="org/few")
    for page in ("9", "x", "-1"):
        response = logged_in_client.get(BOARD, {"page": page})
        assert response.status_code == 200
        assert rows(response.content.decode()) == [release.pk for release in made]


def test_the_search_keeps_to_its_releases_on_every_page_and_in_the_refresh(logged_in_client):
    wanted = releases(BOARD_PAGE_SIZE + 1, prefix="deepseek-ai/V")
    # Other releases found in between: not on any page of the search.
    others = releases(30, prefix="qwen/Q", start=0)

    first = logged_in_client.get(BOARD, {"q": "  DeepSeek-AI/ "}).content.decode()
    assert rows(first) == [release.pk for release in wanted[:50]]
    assert not set(rows(first)) & {release.pk for release in others}
    assert 'value="DeepSeek-AI/"' in first  # the search box keeps it
    assert "Releases 1\u201350 of 51 matching \u201cDeepSeek-AI/\u201d." in first
    assert link(first, "board-next") == "/?q=DeepSeek-AI%2F&page=2"
    assert 'hx-get="/?q=DeepSeek-AI%2F"' in first

    second = logged_in_client.get(link(first, "board-next")).content.decode()
    assert rows(second) == [wanted[50].pk]
    assert link(second, "board-previous") == "/?q=DeepSeek-AI%2F"
    assert 'hx-get="/?q=DeepSeek-AI%2F&amp;page=2"' in second

    # The poll of page 2 (as htmx sends it) answers page 2 of the search, page links with it.
    poll = logged_in_client.get(
        link(second, "board-previous").replace("?", "?page=2&"), headers={"HX-Request": "true"}
    ).content.decode()
    assert poll.lstrip().startswith('<table id="board-table"')
    assert rows(poll) == [wanted[50].pk]
    nav = '<nav id="board-pages" class="pagination" aria-label="Board pages" hx-swap-oob="true">'
    assert nav in poll
    assert link(poll, "board-previous") == "/?q=DeepSeek-AI%2F"


def test_a_search_that_matches_nothing_says_so(logged_in_client):
    releases(2, prefix="org/model")
    html = logged_in_client.get(BOARD, {"q": "<nothing>"}).content.decode()
    assert rows(html) == []
    assert "No release matches \u201c&lt;nothing&gt;\u201d." in html
    assert 'id="board-pages" class="pagination" aria-label="Board pages"></nav>' in html


def busy_release(n: int, *, h200: AcceleratorPool, watch) -> None:
    """A release as a busy board shows it: a finished job on cpu, a running one on h200 with a
    queued stage and a failed one, an operators figure, a second attempt, and open
    limitations."""
    release = make_release(repo_id=f"org/busy-{n:03d}", watch=watch)
    make_job(
        release=release,
        stages=("fetch", "analyze", "operators"),
        statuses={"fetch": "succeeded", "analyze": "succeeded", "operators": "succeeded"},
        results={"operators": OPERATORS_TWO_MISSING},
    )
    running = make_job(
        release=release,
        pool=h200,
        statuses={"fetch": "failed", "analyze": "queued"},
        errors={"fetch": "the worker was lost"},
        created_at=timezone.now() + timedelta(seconds=1),
    )
    StageRun.objects.filter(job=running, stage="fetch").update(failure_class="infrastructure")
    StageRun.objects.filter(job=running, stage="analyze").update(started_at=None)  # not begun
    StageRun.objects.create(job=running, stage="fetch", position=0, attempt=2, status="running")
    KnownLimitation.objects.create(release=release, pool=h200, title="Slow", severity="minor")
    KnownLimitation.objects.create(release=release, title="Missing kernel", severity="major")


def test_the_board_asks_the_same_number_of_queries_for_3_releases_or_60(logged_in_client):
    h200 = AcceleratorPool.objects.create(name="h200", backend="cuda", queue="pool.h200")
    watch = make_watch(name="busy-watch", pool=h200)
    for n in range(3):
        busy_release(n, h200=h200, watch=watch)
    logged_in_client.get(BOARD)  # per-process caches (content types, the session) warmed
    with CaptureQueriesContext(connection) as few:
        three = logged_in_client.get(BOARD).content.decode()
    for n in range(3, 60):
        busy_release(n, h200=h200, watch=watch)
    with CaptureQueriesContext(connection) as many:
        sixty = logged_in_client.get(BOARD).content.decode()

    assert len(rows(three)) == 3 and len(rows(sixty)) == BOARD_PAGE_SIZE
    assert len(many) == len(few), [query["sql"] for query in many.captured_queries]
    # The rows hold what the queries must have read: each cell, figure and badge.
    pk = rows(sixty)[-1]
    # Per pool, the newest job first (h200's).
    assert cell_text(sixty, pk, "operators") == "cpu Succeeded 3.0 s 2 operators missing"
    assert cell_text(sixty, pk, "fetch") == "h200 Running attempt 2 cpu Succeeded 3.0 s"
    assert cell_text(sixty, pk, "analyze") == (
        "h200 waiting: no live worker for pool h200 (queue pool.h200) cpu Succeeded 3.0 s"
    )
    assert 'class="limitation-count severity-major"' in sixty
    assert sixty.count("· busy-watch") == BOARD_PAGE_SIZE


def test_a_nul_in_the_search_is_dropped_not_echoed(logged_in_client):
    response = logged_in_client.get("/", {"q": "qw\x00en"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "\x00" not in html
    assert 'value="qwen"' in html
