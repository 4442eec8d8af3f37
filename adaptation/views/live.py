"""A page that refreshes itself: the full page, or for an htmx request only its live part,
and the page's own query string as a poll sends it."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.utils.cache import patch_vary_headers

POLL_EVERY = "every 3s"


def wants_partial(request: HttpRequest) -> bool:
    """Whether this is an htmx request for the live part (not a boosted page load)."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.boosted


def render_live(
    request: HttpRequest, *, page: str, partial: str, context: dict[str, object]
) -> HttpResponse:
    """The full page, or the partial for htmx; caches keep the two apart."""
    template = partial if wants_partial(request) else page
    response = render(request, template, {**context, "poll_every": POLL_EVERY})
    patch_vary_headers(response, ("HX-Request",))
    return response


def page_params(request: HttpRequest) -> QueryDict:
    """The page's own query string. An htmx poll asks for `request.path` alone; the view the
    reader is on (e.g. `?perf_x=prompt_len`) is in its HX-Current-URL, so a poll keeps it."""
    if wants_partial(request) and not request.GET:
        current = request.htmx.current_url or ""
        return QueryDict(urlsplit(current).query)
    return request.GET
