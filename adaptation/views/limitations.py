"""Known-limitation pages: the release page's panel, adding a note, editing one and the quick
status buttons. Plain POST then redirect; adding needs `add_knownlimitation`, changing
`change_knownlimitation` (engineers and admins: `adaptation.roles`), so a manager reads the
notes, sees no form, and a POST answers 403.

A note a stage raised keeps its title, body and severity from the stage: people may only set
its status (mitigated, resolved, open again). A person's note is edited only by its author or
an admin (`roles.limitation_may_edit`): anyone else gets 403 and the note is unchanged.
Each status change records who made it and when."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from adaptation.limitation_forms import LimitationForm, LimitationStatusForm
from adaptation.models import KnownLimitation, LimitationStatus, ModelRelease
from adaptation.presenters import limitations as limitation_presenters
from adaptation.roles import ADD_LIMITATION, CHANGE_LIMITATION, limitation_may_edit
from adaptation.selectors.limitations import limitation_get
from adaptation.services import limitations
from adaptation.views.access import permission_required


def _note_or_404(pk: int) -> KnownLimitation:
    try:
        return limitation_get(limitation_id=pk)
    except KnownLimitation.DoesNotExist:
        raise Http404(f"No known limitation {pk}.") from None


def _editable_note(request: HttpRequest, pk: int) -> KnownLimitation:
    """Note `pk` if the user may edit it; raises `Http404` for no such note and
    `PermissionDenied` (403) for someone else's note to a non-admin."""
    note = _note_or_404(pk)
    if not limitation_may_edit(user=request.user, limitation=note):
        raise PermissionDenied("Only its author or an admin may edit this known limitation.")
    return note


def _back_to(release_id: int, anchor: str = "limitations") -> str:
    return f"{reverse('adaptation:release_detail', args=[release_id])}#{anchor}"


@permission_required(ADD_LIMITATION)
@require_http_methods(["GET", "POST"])
def limitation_add(request: HttpRequest, pk: int) -> HttpResponse:
    """Add a person's note to release `pk` (GET: the form alone). A form with errors is shown
    again with them (400)."""
    release = get_object_or_404(ModelRelease, pk=pk)
    form = LimitationForm(request.POST or None, prefix="limitation")
    if request.method == "POST" and form.is_valid():
        try:
            note = limitations.limitation_create(
                release=release, author=request.user, **form.cleaned_data
            )
        except limitations.LimitationError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Known limitation added: {note.title}")
            return redirect(_back_to(release.pk, f"limitation-{note.pk}"))
    context = {"release": release, "form": form, "note": None}
    status = 400 if request.method == "POST" else 200
    return render(request, "adaptation/limitation_form.html", context, status=status)


@permission_required(CHANGE_LIMITATION)
@require_http_methods(["GET", "POST"])
def limitation_edit(request: HttpRequest, pk: int) -> HttpResponse:
    """Edit note `pk`: a person's note in full (its author or an admin), a stage's in status
    only."""
    note = _editable_note(request, pk)
    form_class = LimitationStatusForm if note.key else LimitationForm
    prefix = "limitation"
    form = form_class(request.POST or None, instance=note, prefix=prefix)
    if request.method == "POST" and form.is_valid():
        fresh = limitation_get(limitation_id=note.pk)  # the form changed `note` in place
        try:
            limitations.limitation_update(limitation=fresh, by=request.user, **form.cleaned_data)
        except limitations.LimitationError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Known limitation saved: {fresh.shown_title}")
            return redirect(_back_to(note.release_id, f"limitation-{note.pk}"))
    if request.method == "POST":  # show the stored note beside the form's errors
        note = limitation_get(limitation_id=note.pk)
    context = {
        "release": note.release,
        "form": form,
        "note": limitation_presenters.limitation_item(note, user=request.user),
    }
    status = 400 if request.method == "POST" else 200
    return render(request, "adaptation/limitation_form.html", context, status=status)


@permission_required(CHANGE_LIMITATION)
@require_POST
def limitation_set_status(request: HttpRequest, pk: int) -> HttpResponse:
    """The panel's quick buttons: set note `pk`'s status (`status` in the POST), then back to
    the release page."""
    note = _editable_note(request, pk)
    status = request.POST.get("status", "")
    try:
        limitations.limitation_update(limitation=note, by=request.user, status=status)
    except limitations.LimitationError as exc:
        messages.error(request, str(exc))
    else:
        label = LimitationStatus(status).label.lower()
        messages.success(request, f"Known limitation {label}: {note.shown_title}")
    return redirect(_back_to(note.release_id, f"limitation-{note.pk}"))
