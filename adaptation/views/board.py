"""The release board: a row per release, a column per stage, `BOARD_PAGE_SIZE` releases a
page, searchable by repo id (`?q=`). It always polls, for the page and search it shows: every
`BOARD_POLL_BUSY_S` seconds while a stage runs, every `BOARD_POLL_IDLE_S` seconds otherwise,
so a release the periodic hub poll finds appears on an open board."""

from __future__ import annotations

from urllib.parse import urlencode

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from adaptation.presenters import board as board_presenters
from adaptation.selectors.board import BOARD_QUERY_MAX_CHARS, board_page
from adaptation.selectors.hubs import watches_with_errors
from adaptation.selectors.jobs import anything_running
from adaptation.selectors.workers import pools_without_live_worker
from adaptation.views.access import VIEW_RELEASES, permission_required
from adaptation.views.live import render_live

# The board's refresh period (seconds) while stages run, and while nothing runs.
BOARD_POLL_BUSY_S = 3
BOARD_POLL_IDLE_S = 20


def _query_string(query: str, page: int | None = None) -> str:
    """The board's query string for a search and a page (the first page and an empty search
    are left out); "" or "?…"."""
    params = [("q", query)] if query else []
    if page is not None and page > 1:
        params.append(("page", str(page)))
    return f"?{urlencode(params)}" if params else ""


@permission_required(VIEW_RELEASES)
@require_GET
def board(request: HttpRequest) -> HttpResponse:
    """The release board, page `?page=` (default the first; past the last, the last) of the
    releases whose repo id contains `?q=`; refreshed quickly while work runs and slowly
    otherwise, so new releases appear without a reload."""
    # Control characters (a NUL) are no part of a repo id: dropped, never echoed into the page.
    raw = "".join(c for c in request.GET.get("q", "") if c.isprintable() or c.isspace())
    query = " ".join(raw.split())[:BOARD_QUERY_MAX_CHARS]
    page = board_page(query=query, number=request.GET.get("page"))
    running = anything_running()
    # Queued stages of a pool without a live worker say so (two queries, only while work runs).
    idle_pools = pools_without_live_worker() if running else {}
    context = {
        "board": board_presenters.board(
            page.object_list, now=timezone.now(), pools_without_worker=idle_pools
        ),
        "page": page,
        "query": query,
        "board_url": f"{request.path}{_query_string(query, page.number)}",
        "previous_url": (
            f"{request.path}{_query_string(query, page.previous_page_number())}"
            if page.has_previous()
            else ""
        ),
        "next_url": (
            f"{request.path}{_query_string(query, page.next_page_number())}"
            if page.has_next()
            else ""
        ),
        "polling": running,
        "board_poll_s": BOARD_POLL_BUSY_S if running else BOARD_POLL_IDLE_S,
        "troubled_watches": list(watches_with_errors()),
        "hub_poll_s": settings.DAY0_POLL_EVERY_S,
    }
    return render_live(
        request,
        page="adaptation/board.html",
        partial="adaptation/partials/board_live.html",
        context=context,
    )
