"""The release board: a row per release, a column per stage. It always polls: every
`BOARD_POLL_BUSY_S` seconds while a stage runs, every `BOARD_POLL_IDLE_S` seconds otherwise,
so a release the periodic hub poll finds appears on an open board."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from adaptation.presenters import board as board_presenters
from adaptation.selectors import releases as release_selectors
from adaptation.selectors.hubs import watches_with_errors
from adaptation.selectors.jobs import anything_running
from adaptation.selectors.workers import pools_without_live_worker
from adaptation.views.access import VIEW_RELEASES, permission_required
from adaptation.views.live import render_live

# The board's refresh period (seconds) while stages run, and while nothing runs.
BOARD_POLL_BUSY_S = 3
BOARD_POLL_IDLE_S = 20


@permission_required(VIEW_RELEASES)
@require_GET
def board(request: HttpRequest) -> HttpResponse:
    """The release board: a row per release, a column per stage; refreshed quickly while work
    runs and slowly otherwise, so new releases appear without a reload."""
    running = anything_running()
    # Queued stages of a pool without a live worker say so (two queries, only while work runs).
    idle_pools = pools_without_live_worker() if running else {}
    context = {
        "board": board_presenters.board(
            release_selectors.releases_for_board(),
            now=timezone.now(),
            pools_without_worker=idle_pools,
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
