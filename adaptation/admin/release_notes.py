"""Admin views of release notes: every version read-only (the `release_notes` stage and
`release_notes_regenerate` write them), and people's additions, which the notes page edits
too (`change_releasenotesadditions`)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from adaptation.admin.read_only import ReadOnlyAdmin
from adaptation.models import ReleaseNotes, ReleaseNotesAdditions


@admin.register(ReleaseNotes)
class ReleaseNotesAdmin(ReadOnlyAdmin):
    """Every version of every release's notes; read-only."""

    list_display = ("release", "pool", "version", "job", "created_at", "page")
    list_filter = ("pool",)
    search_fields = ("release__repo_id",)
    list_select_related = ("release", "pool", "job")
    readonly_fields = (
        "release",
        "pool",
        "job",
        "stage_run",
        "version",
        "created_at",
        "markdown",
        "sections",
    )

    @admin.display(description="Page")
    def page(self, notes: ReleaseNotes) -> str:
        url = reverse("adaptation:release_notes", args=[notes.release_id])
        return format_html(
            '<a href="{}?pool={}&amp;version={}">view</a>', url, notes.pool.name, notes.version
        )


@admin.register(ReleaseNotesAdditions)
class ReleaseNotesAdditionsAdmin(admin.ModelAdmin):
    """People's additions to a release's notes on a pool (Markdown)."""

    list_display = ("release", "pool", "updated_by", "updated_at")
    list_filter = ("pool",)
    search_fields = ("release__repo_id", "body")
    list_select_related = ("release", "pool", "updated_by")
    readonly_fields = ("updated_by", "updated_at")

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        obj.updated_by = request.user
        obj.updated_at = timezone.now()
        super().save_model(request, obj, form, change)
