"""How each pool and catalog kind would serve a release, predicted by the planner."""

from __future__ import annotations

from django import forms
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from adaptation.models import ModelRelease
from adaptation.presenters import compare_pools as compare_pools_presenters
from adaptation.selectors import pools as pool_selectors
from adaptation.selectors import releases as release_selectors
from adaptation.views.access import VIEW_RELEASES, permission_required
from engine.stages.plan.planner import MAX_CONCURRENCY, MAX_CONTEXT_TOKENS


class ComparePoolsForm(forms.Form):
    """The compare page's plan options, from its query string; all optional (blank: the
    planner's default), bounded as the planner bounds them."""

    context = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_CONTEXT_TOKENS,
        label="Context (tokens)",
        help_text="Tokens per sequence; blank: the release's max, capped at 32,768.",
    )
    concurrency = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_CONCURRENCY,
        label="Concurrent sequences",
        help_text="Sequences held at the full context at once; blank: 4.",
    )
    dtype = forms.ChoiceField(
        required=False,
        choices=[
            (d, "checkpoint's own (default)" if d == "checkpoint" else d)
            for d in compare_pools_presenters.SERVING_DTYPES
        ],
        label="Serving dtype",
    )


@permission_required(VIEW_RELEASES)
@require_GET
def release_compare_pools(request: HttpRequest, pk: int) -> HttpResponse:
    """How each enabled pool, and each catalog kind on as many nodes as it needs, would serve
    the release (predicted by the planner from its latest analysis), in
    `presenters.compare_pools.CompareRow.sort_key` order. Bad options answer 400 with the form's
    errors."""
    try:
        release = release_selectors.release_detail(release_id=pk)
    except ModelRelease.DoesNotExist:
        raise Http404(f"No release {pk}.") from None
    form = ComparePoolsForm(request.GET or None)
    comparison = None
    status = 200
    if form.is_bound and not form.is_valid():
        status = 400
    else:
        options = form.cleaned_data if form.is_bound else {}
        comparison = compare_pools_presenters.compare_pools(
            release,
            pools=pool_selectors.pools_enabled(),
            context_tokens=options.get("context"),
            concurrency=options.get("concurrency"),
            dtype=options.get("dtype") or None,
        )
    context = {"release": release, "form": form, "comparison": comparison}
    return render(request, "adaptation/compare_pools.html", context, status=status)
