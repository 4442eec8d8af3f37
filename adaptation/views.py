"""Thin page views: read through `selectors`, shape through `presenters`, write through
`services`.

The board and the release page each return their full page, or, for an htmx request, only
the live part that polls. The board always polls: every `BOARD_POLL_BUSY_S` seconds while a
stage runs, every `BOARD_POLL_IDLE_S` seconds otherwise, so a release the periodic hub poll
finds appears on an open board. The release page's job panel polls only while its job runs,
so the browser stops asking once that work is done.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from functools import wraps
from urllib.parse import urlsplit

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required as django_login_required
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from adaptation import inventory, release_notes_presenters
from adaptation.charts.performance_metrics import METRICS
from adaptation.models import AcceleratorPool, AdaptationJob, ModelRelease
from adaptation.presenters import analysis as analysis_presenters
from adaptation.presenters import board as board_presenters
from adaptation.presenters import compare_pools as compare_pools_presenters
from adaptation.presenters import day0_clock as clock_presenters
from adaptation.presenters import distributed as distributed_presenters
from adaptation.presenters import job_timeline as timeline_presenters
from adaptation.presenters import limitations as limitation_presenters
from adaptation.presenters import performance as performance_presenters
from adaptation.presenters import performance_compare as compare_performance_presenters
from adaptation.presenters import performance_points, performance_view
from adaptation.presenters import plan as plan_presenters
from adaptation.presenters import stability as stability_presenters
from adaptation.presenters import validation as validation_presenters
from adaptation.presenters.stages import stage_title
from adaptation.roles import CANCEL_JOB, CHANGE_NOTES_ADDITIONS, RERUN_STAGE
from adaptation.selectors import release_notes as notes_selectors
from adaptation.selectors import releases as release_selectors
from adaptation.selectors.hubs import watches_with_errors
from adaptation.selectors.jobs import anything_running
from adaptation.selectors.workers import pools_without_live_worker
from adaptation.services import jobs as job_services
from adaptation.services import release_notes as notes_services
from adaptation.services.errors import ServiceError
from engine.stages.plan.planner import MAX_CONCURRENCY, MAX_CONTEXT_TOKENS

POLL_EVERY = "every 3s"
# The board's refresh period (seconds) while stages run, and while nothing runs.
BOARD_POLL_BUSY_S = 3
BOARD_POLL_IDLE_S = 20


def login_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Django's `login_required`, except that an htmx poll whose session expired sends the
    whole browser to the login page instead of swapping the login form into a table."""
    guarded = django_login_required(view)

    @wraps(view)
    def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if getattr(request, "htmx", False) and not request.user.is_authenticated:
            login = redirect_to_login(request.get_full_path())
            return HttpResponseClientRedirect(login["Location"])
        return guarded(request, *args, **kwargs)

    return wrapper


# What reading each page needs (`adaptation.roles`: managers, engineers and admins hold them).
VIEW_RELEASES = "adaptation.view_modelrelease"
VIEW_JOBS = "adaptation.view_adaptationjob"
VIEW_POOLS = "adaptation.view_acceleratorpool"


def permission_required(perm: str) -> Callable[..., Callable[..., HttpResponse]]:
    """Sign-in first (`login_required`: anonymous visitors go to the login page), then
    `perm`: a signed-in user without it gets 403, as the API answers them."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def checked(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
            if not request.user.has_perm(perm):
                raise PermissionDenied(f"it needs the {perm} permission")
            return view(request, *args, **kwargs)

        return login_required(checked)

    return decorator


def _wants_partial(request: HttpRequest) -> bool:
    """Whether this is an htmx request for the live part (not a boosted page load)."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.boosted


def _render(
    request: HttpRequest, *, page: str, partial: str, context: dict[str, object]
) -> HttpResponse:
    """The full page, or the partial for htmx; caches keep the two apart."""
    template = partial if _wants_partial(request) else page
    response = render(request, template, {**context, "poll_every": POLL_EVERY})
    patch_vary_headers(response, ("HX-Request",))
    return response


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
    return _render(
        request,
        page="adaptation/board.html",
        partial="adaptation/partials/board_live.html",
        context=context,
    )


def _page_params(request: HttpRequest) -> QueryDict:
    """The page's own query string. An htmx poll asks for `request.path` alone; the view the
    reader is on (e.g. `?perf_x=prompt_len`) is in its HX-Current-URL, so a poll keeps it."""
    if _wants_partial(request) and not request.GET:
        current = request.htmx.current_url or ""
        return QueryDict(urlsplit(current).query)
    return request.GET


@permission_required(VIEW_RELEASES)
@require_GET
def release_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """One release: header, analysis, and every attempt of every stage of its jobs."""
    try:
        release = release_selectors.release_detail(release_id=pk)
    except ModelRelease.DoesNotExist:
        raise Http404(f"No release {pk}.") from None
    # Queued stages (and a pending plan) of a pool without a live worker say so.
    active = timeline_presenters.release_is_active(release)
    idle_pools = pools_without_live_worker() if active else {}
    clock = clock_presenters.day0_clock(
        release, release.jobs.all(), now=timezone.now(), limitations=release.open_limitations
    )
    context = {
        "release": release,
        "clock": clock,
        "day0_timeline": clock_presenters.day0_timeline(release, clock),
        "analysis": analysis_presenters.analysis(release),
        "validation": validation_presenters.validation(release),
        "plans": plan_presenters.plan_panels(release, pools_without_worker=idle_pools),
        "distributed_panels": distributed_presenters.distributed_panels(
            release, pools_without_worker=idle_pools
        ),
        "performance": performance_presenters.performance_section(
            release, params=_page_params(request)
        ),
        "stabilities": stability_presenters.stability_panels(release),
        "limitations": limitation_presenters.release_limitations_panel(
            release=release, user=request.user
        ),
        "release_notes": notes_selectors.release_notes_summaries(release),
        "timelines": timeline_presenters.job_timelines(release, pools_without_worker=idle_pools),
        "polling": active,
    }
    return _render(
        request,
        page="adaptation/release_detail.html",
        partial="adaptation/partials/release_live.html",
        context=context,
    )


@permission_required(RERUN_STAGE)
@require_POST
def stage_rerun(request: HttpRequest, job_id: int, stage: str) -> HttpResponse:
    """Run a stage of a job again (and the stages after it), then go back to the release.
    Needs the `rerun_stage` permission (engineers, admins)."""
    job = get_object_or_404(AdaptationJob, pk=job_id)
    try:
        run = job_services.job_rerun_stage(job=job, stage=stage)
    except ServiceError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request,
            f"{stage_title(run.stage)} of job {job.pk} queued again "
            f"(attempt {run.attempt}); the stages after it follow.",
        )
    return redirect("adaptation:release_detail", pk=job.release_id)


@permission_required(CANCEL_JOB)
@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    """Cancel a job that has not finished (`job_services.job_cancel`), then go back to the
    release. Needs the `cancel_job` permission (engineers, admins)."""
    job = get_object_or_404(AdaptationJob, pk=job_id)
    try:
        job_services.job_cancel(job=job, by=request.user)
    except ServiceError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request, f"Job {job.pk} cancelled; a stage of it can still be re-run later."
        )
    return redirect("adaptation:release_detail", pk=job.release_id)


# The pools page's refresh period (seconds): workers beat every DAY0_WORKER_HEARTBEAT_S.
POOLS_POLL_S = 5


@permission_required(VIEW_POOLS)
@require_GET
def pool_list(request: HttpRequest) -> HttpResponse:
    """Every pool with its live workers (host, devices, heartbeat, what each runs now), its
    stale or stopped workers, devices held and free, and its queue; refreshed every
    `POOLS_POLL_S` seconds."""
    pools, catalog_error = inventory.pools_overview(now=timezone.now())
    context = {
        "pools": pools,
        "catalog_error": catalog_error,
        "pools_poll_s": POOLS_POLL_S,
        "stale_after_s": settings.DAY0_WORKER_STALE_S,
    }
    return _render(
        request,
        page="adaptation/pools.html",
        partial="adaptation/partials/pools_live.html",
        context=context,
    )


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
            pools=AcceleratorPool.objects.filter(enabled=True).order_by("name"),
            context_tokens=options.get("context"),
            concurrency=options.get("concurrency"),
            dtype=options.get("dtype") or None,
        )
    context = {"release": release, "form": form, "comparison": comparison}
    return render(request, "adaptation/compare_pools.html", context, status=status)


@permission_required(VIEW_JOBS)
@require_GET
def job_performance_csv(request: HttpRequest, job_id: int) -> HttpResponse:
    """The job's performance rows (its newest finished `performance` attempt) as CSV: the
    numbers its charts and table show, one figure per line."""
    job = get_object_or_404(AdaptationJob.objects.select_related("release", "pool"), pk=job_id)
    run = performance_points.job_performance_run(job)
    if run is None:
        raise Http404(f"Job {job_id} has no finished performance run.")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = (
        f'attachment; filename="{compare_performance_presenters.csv_filename(job)}"'
    )
    writer = csv.writer(response, lineterminator="\n")
    columns = performance_points.CSV_COLUMNS
    writer.writerow(columns)
    for row in performance_points.point_rows(run):
        writer.writerow([compare_performance_presenters.csv_cell(row[c]) for c in columns])
    return response


@permission_required(VIEW_JOBS)
@require_GET
def compare_performance(request: HttpRequest) -> HttpResponse:
    """Two jobs' performance curves overlaid: `?jobs=<id>,<id>` (the same release on two
    pools, or two releases on one pool), in the chart view of `perf_x`/`perf_metric`. Bad
    ids answer 400, a job missing or without performance rows 404, each with the reason."""
    view = performance_view.performance_view(request.GET)
    context: dict[str, object] = {
        "view": view,
        "comparison": None,
        "error": "",
        "choices": compare_performance_presenters.compare_choices(),
        "x_choices": performance_view.x_choices(),
        "metric_choices": [(name, metric.label) for name, metric in METRICS.items()],
        "chosen": [],
    }
    status = 200
    try:
        ids = compare_performance_presenters.compare_job_ids(request.GET.getlist("jobs"))
        context["chosen"] = ids
        context["comparison"] = compare_performance_presenters.compare_performance(ids, view)
    except compare_performance_presenters.CompareError as exc:
        context["error"], status = str(exc), exc.status
    return render(request, "adaptation/compare_performance.html", context, status=status)


# --- release notes ----------------------------------------------------------------------------

VIEW_NOTES = "adaptation.view_releasenotes"


class NotesAdditionsForm(forms.Form):
    """People's additions to a release's notes on a pool (Markdown; blank clears them)."""

    pool = forms.CharField(widget=forms.HiddenInput)
    body = forms.CharField(
        required=False,
        max_length=notes_services.ADDITIONS_MAX_CHARS,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 10, "cols": 80}),
        label="Additions (Markdown)",
        help_text="Printed after the generated notes in every version; raw HTML is shown as text.",
    )


def _notes_request(
    request: HttpRequest, pk: int
) -> tuple[ModelRelease, AcceleratorPool | None, int | None]:
    """(release, pool, version) a notes request names: `?pool=` (default: the pool with the
    release's newest notes) and `?version=` (default: the latest). 404 for an unknown release
    or pool, 400 (`SuspiciousOperation`) for a version that is not a whole number."""
    release = get_object_or_404(ModelRelease, pk=pk)
    name = request.GET.get("pool") or request.POST.get("pool") or ""
    if name:
        pool = AcceleratorPool.objects.filter(name=name).first()
        if pool is None:
            raise Http404(f"No pool {name!r}.")
    else:
        pools = notes_selectors.release_notes_pools(release)
        pool = pools[0] if pools else None
    raw = request.GET.get("version") or ""
    if raw and not (raw.isascii() and raw.isdigit() and len(raw) < 10):
        raise SuspiciousOperation(f"version must be a whole number, got {raw[:20]!r}")
    return release, pool, int(raw) if raw else None


def _notes_or_404(request: HttpRequest, pk: int):
    """(release, pool, notes, additions) of a notes request; 404 when there are none."""
    release, pool, version = _notes_request(request, pk)
    notes = (
        notes_selectors.release_notes_get(release=release, pool=pool, version=version)
        if pool is not None
        else None
    )
    if notes is None:
        raise Http404(f"No release notes for {release.repo_id} on that pool and version.")
    return release, pool, notes, notes_selectors.release_notes_additions(release=release, pool=pool)


@permission_required(VIEW_NOTES)
@require_GET
def release_notes_page(request: HttpRequest, pk: int) -> HttpResponse:
    """A release's notes on a pool (`?pool=`, default the pool with the newest notes): the
    latest version or `?version=N`, people's additions (an edit form for engineers), the
    version history, and links to the Markdown and the printable page (`?print=1` is the
    printable page too). Without notes: 404, saying how they are made."""
    if request.GET.get("print"):
        return release_notes_print(request, pk)
    release, pool, version = _notes_request(request, pk)
    notes = (
        notes_selectors.release_notes_get(release=release, pool=pool, version=version)
        if pool is not None
        else None
    )
    jobs = list(release.jobs.select_related("pool").order_by("-created_at", "-id")[:10])
    context: dict[str, object] = {
        "release": release,
        "pool": pool,
        "notes": notes,
        "jobs": [job for job in jobs if pool is None or job.pool_id == pool.pk],
        "notes_pools": notes_selectors.release_notes_pools(release),
    }
    if notes is None:
        return render(request, "adaptation/release_notes.html", context, status=404)
    additions = notes_selectors.release_notes_additions(release=release, pool=pool)
    versions = notes_selectors.release_notes_versions(release=release, pool=pool)
    context.update(
        {
            "document_html": release_notes_presenters.render_markdown(
                release_notes_presenters.release_notes_document(notes)
            ),
            "additions": additions,
            "additions_html": release_notes_presenters.render_markdown(
                additions.body if additions else ""
            ),
            "additions_form": NotesAdditionsForm(
                initial={"pool": pool.name, "body": additions.body if additions else ""}
            ),
            "versions": versions,
            "latest_version": versions[0].version if versions else notes.version,
        }
    )
    return render(request, "adaptation/release_notes.html", context)


@permission_required(VIEW_NOTES)
@require_GET
def release_notes_print(request: HttpRequest, pk: int) -> HttpResponse:
    """The notes with their additions as a standalone page that prints cleanly to PDF from
    the browser (a print stylesheet: no navigation or buttons, a page per major section,
    tables kept whole, link targets printed)."""
    _release, _pool, notes, additions = _notes_or_404(request, pk)
    return HttpResponse(release_notes_presenters.render_notes_html(notes, additions))


@permission_required(VIEW_NOTES)
@require_GET
def release_notes_markdown(request: HttpRequest, pk: int) -> HttpResponse:
    """The notes with their additions as a Markdown download (`?pool=`, `?version=`)."""
    _release, _pool, notes, additions = _notes_or_404(request, pk)
    response = HttpResponse(
        release_notes_presenters.release_notes_document(notes, additions),
        content_type="text/markdown; charset=utf-8",
    )
    response["Content-Disposition"] = (
        f'attachment; filename="{release_notes_presenters.notes_filename(notes, "md")}"'
    )
    return response


@permission_required(CHANGE_NOTES_ADDITIONS)
@require_POST
def release_notes_additions_save(request: HttpRequest, pk: int) -> HttpResponse:
    """Save people's additions to a release's notes on a pool, then go back to the notes.
    Needs `change_releasenotesadditions` (engineers, admins): managers read them only."""
    release = get_object_or_404(ModelRelease, pk=pk)
    form = NotesAdditionsForm(request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(e for errors in form.errors.values() for e in errors))
        return redirect("adaptation:release_notes", pk=pk)
    pool = get_object_or_404(AcceleratorPool, name=form.cleaned_data["pool"])
    try:
        notes_services.release_notes_additions_update(
            release=release, pool=pool, body=form.cleaned_data["body"], by=request.user
        )
    except notes_selectors.NotesError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Additions to the notes on {pool.name} saved.")
    return redirect(f"{reverse('adaptation:release_notes', args=[pk])}?pool={pool.name}")


@permission_required(RERUN_STAGE)
@require_POST
def job_notes_regenerate(request: HttpRequest, job_id: int) -> HttpResponse:
    """Write a new version of the notes from a finished job's stages, whatever they found
    (`notes_services.release_notes_regenerate`: a job that failed early still has notes).
    Needs `rerun_stage` (engineers, admins)."""
    job = get_object_or_404(AdaptationJob.objects.select_related("pool"), pk=job_id)
    try:
        notes = notes_services.release_notes_regenerate(job=job)
    except notes_selectors.NotesError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request, f"Notes version {notes.version} written from job {job.pk}'s stages."
        )
    url = reverse("adaptation:release_notes", args=[job.release_id])
    return redirect(f"{url}?pool={job.pool.name}")
