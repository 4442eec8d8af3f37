"""A release's notes on a pool: the page (latest or a version, with people's additions and
the history), the printable page, the Markdown download, saving additions and writing a new
version from a finished job."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from adaptation.models import AcceleratorPool, JobStatus, ModelRelease
from adaptation.presenters import release_notes as release_notes_presenters
from adaptation.roles import CHANGE_NOTES_ADDITIONS, RERUN_STAGE
from adaptation.selectors import jobs as job_selectors
from adaptation.selectors import pools as pool_selectors
from adaptation.selectors import release_notes as notes_selectors
from adaptation.services import release_notes as notes_services
from adaptation.views.access import VIEW_NOTES, permission_required

# A job that has not ended yet: its release_notes stage may still write the notes.
UNFINISHED_JOB_STATUSES = (JobStatus.PENDING, JobStatus.RUNNING)


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
        pool = pool_selectors.pool_by_name(name)
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
    printable page too). A release (or pool) without notes yet answers 200 with a page saying
    why and how they are made, its jobs that are still running and those notes can be written
    from; 404 only for an unknown release or pool, or a version that does not exist."""
    if request.GET.get("print"):
        return release_notes_print(request, pk)
    release, pool, version = _notes_request(request, pk)
    notes = (
        notes_selectors.release_notes_get(release=release, pool=pool, version=version)
        if pool is not None
        else None
    )
    jobs = [
        job
        for job in job_selectors.release_recent_jobs(release, limit=10)
        if pool is None or job.pool_id == pool.pk
    ]
    context: dict[str, object] = {
        "release": release,
        "pool": pool,
        "notes": notes,
        "jobs": jobs,
        # Without notes: the jobs that may still write them, and those they can be written from.
        "jobs_running": [job for job in jobs if job.status in UNFINISHED_JOB_STATUSES],
        "jobs_ended": [job for job in jobs if job.status not in UNFINISHED_JOB_STATUSES],
        "notes_pools": notes_selectors.release_notes_pools(release),
    }
    if notes is None:
        # A version asked for that does not exist is not there; a release without notes yet is.
        status = 404 if version is not None else 200
        return render(request, "adaptation/release_notes.html", context, status=status)
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
    return HttpResponse(
        release_notes_presenters.render_notes_html(
            notes, additions, style_nonce=str(request.csp_nonce)
        )
    )


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
    job = get_object_or_404(job_selectors.jobs_with_release_and_pool(), pk=job_id)
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
