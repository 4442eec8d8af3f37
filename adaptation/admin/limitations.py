"""Admin for known limitations: every note, filtered by severity, status, stage and pool.

A note a stage raised (`key` set) keeps its words, severity, pool and key from the stage:
only its status can change here, as on the release page; its words are shown as its template
writes them now (`shown_title`, `shown_body`), with the template's name and data. A note
added here is the adding person's (`author`), and only they or an admin may change it
(`adaptation.roles.limitation_may_edit`; anyone else sees it read-only). Changing the status
keeps `resolved_at` in step (set when it becomes resolved, cleared when reopened or
mitigated) and is recorded with who and when (`status_history`).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from adaptation.models import KnownLimitation, LimitationStatus
from adaptation.roles import limitation_may_edit
from adaptation.services.limitations import STAGE_OWNED_FIELDS, limitation_status_record

_ALWAYS_READ_ONLY = (
    "key",
    "stage",
    "stage_run",
    "author",
    "created_at",
    "updated_at",
    "resolved_at",
    "status_history",
    "template",
    "template_data",
)
# A stage's note shows the words its template writes now in place of its stored rendering.
_STAGE_WORDS = {"title": "shown_title", "body": "shown_body"}


def _stage_change(stage_run_id: int | None) -> str:
    """Who made a stage's status change, in the admin's history."""
    return "a stage re-run" + (f" (stage run {stage_run_id})" if stage_run_id else "")


@admin.register(KnownLimitation)
class KnownLimitationAdmin(admin.ModelAdmin):
    list_display = ("shown_title", "release", "pool", "severity", "status", "stage", "updated_at")
    list_filter = ("severity", "status", "stage", "pool")
    search_fields = ("title",)
    list_select_related = ("release", "pool")
    raw_id_fields = ("release",)
    # What a person may edit, then what only the stages and the history write.
    fields = ("release", "pool", "title", "severity", "status", "body", *_ALWAYS_READ_ONLY)

    @admin.display(description="title")
    def shown_title(self, note: KnownLimitation) -> str:
        """The note's title as people read it (its template's for a stage's note)."""
        return note.shown_title

    @admin.display(description="body")
    def shown_body(self, note: KnownLimitation) -> str:
        """The note's Markdown body as people read it (its template's for a stage's note)."""
        return note.shown_body

    def get_fields(self, request: HttpRequest, obj: KnownLimitation | None = None) -> list[str]:
        """The form's fields: a stage's note shows its words as its template writes them, and
        the template and data it writes them from; a person's note has neither."""
        fields = list(super().get_fields(request, obj))
        if obj is not None and obj.key:
            return [_STAGE_WORDS.get(name, name) for name in fields]
        return [name for name in fields if name not in ("template", "template_data")]

    @admin.display(description="status changes")
    def status_history(self, note: KnownLimitation) -> str:
        """Every status change of the note, newest first: status, by whom, when (UTC)."""
        if note.pk is None:
            return "—"
        changes = note.status_changes.order_by("-changed_at", "-id")
        rows = [
            (
                change.get_status_display(),
                change.changed_by_name or _stage_change(change.stage_run_id),
                f"{change.changed_at:%Y-%m-%d %H:%M:%S} UTC",
            )
            for change in changes
        ]
        if not rows:
            return "—"
        return format_html("<ul>{}</ul>", format_html_join("", "<li>{} by {}, {}</li>", rows))

    def get_readonly_fields(
        self, request: HttpRequest, obj: KnownLimitation | None = None
    ) -> tuple[str, ...]:
        """The bookkeeping fields always; a stage's note also its stage-owned fields and its
        release."""
        if obj is not None and obj.key:
            return ("release", *STAGE_OWNED_FIELDS, *_STAGE_WORDS.values(), *_ALWAYS_READ_ONLY)
        return _ALWAYS_READ_ONLY

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Another person's note is read-only but to its author and admins."""
        if obj is not None and not limitation_may_edit(user=request.user, limitation=obj):
            return False
        return super().has_change_permission(request, obj)

    def save_model(
        self, request: HttpRequest, obj: KnownLimitation, form: Any, change: bool
    ) -> None:
        """Stamp the author of a new note, `updated_at`, and `resolved_at` with the status;
        record a changed status with who and when. Raises `PermissionDenied` for a change by
        someone who may not edit the note (`has_change_permission` already refuses it)."""
        if change and not limitation_may_edit(user=request.user, limitation=obj):
            raise PermissionDenied("Only its author or an admin may edit this known limitation.")
        now = timezone.now()
        if not change and not obj.key:
            obj.author = request.user
            obj.created_at = now
        if obj.status == LimitationStatus.RESOLVED:
            obj.resolved_at = obj.resolved_at or now
        else:
            obj.resolved_at = None
        obj.updated_at = now
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if change and "status" in form.changed_data:
                limitation_status_record(limitation=obj, by=request.user, now=now)
