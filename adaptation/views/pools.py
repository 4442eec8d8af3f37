"""The pools page: every pool with its live workers, devices and queue; refreshed every
`POOLS_POLL_S` seconds."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from adaptation.catalog import pool_layout
from adaptation.presenters import pools as pool_presenters
from adaptation.selectors import inventory as inventory_selectors
from adaptation.selectors import pools as pool_selectors
from adaptation.views.access import VIEW_POOLS, permission_required
from adaptation.views.live import render_live

# The pools page's refresh period (seconds): workers beat every DAY0_WORKER_HEARTBEAT_S.
POOLS_POLL_S = 5


@permission_required(VIEW_POOLS)
@require_GET
def pool_list(request: HttpRequest) -> HttpResponse:
    """Every pool with its live workers (host, devices, heartbeat, what each runs now), its
    stale or stopped workers, devices held and free, its queue, and its software stack with
    its latest changes; refreshed every `POOLS_POLL_S` seconds."""
    inventories, catalog_error = inventory_selectors.pools_overview(
        layout_of=pool_layout, now=timezone.now()
    )
    stack_changes = pool_selectors.recent_stack_changes(inv.pool.pk for inv in inventories)
    context = {
        "pools": pool_presenters.pool_cards(inventories, stack_changes),
        "catalog_error": catalog_error,
        "pools_poll_s": POOLS_POLL_S,
        "stale_after_s": settings.DAY0_WORKER_STALE_S,
    }
    return render_live(
        request,
        page="adaptation/pools.html",
        partial="adaptation/partials/pools_live.html",
        context=context,
    )
