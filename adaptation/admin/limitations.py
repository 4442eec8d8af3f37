"""Admin for known limitations: every note, filtered by severity, status, stage and pool.

A note a stage raised (`key` set) keeps its title, body, severity, pool and key from the
stage: only its status can change here, as on the release page. A note added here is the
adding person's (`author`). Changing the status keeps `resolved_at` in step (set when it
becomes resolved, cleared when reopened or mitigated).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone

from adaptation.models import KnownLimitation, LimitationStatus
from adaptation.services.limitations import STAGE_OWNED_FIELDS

_ALWAYS_READ_ONLY = (
    "key",
    "stage",
    "stage_run",
    "author",
    "created_at",
    "updated_at",
    "resolved_at",
)


@admin.register(KnownLimitation)
class KnownLimitationAdmin(admin.ModelAdmin):
    list_display = ("title", "release", "pool", "severity", "status", "stage", "updated_at")
    list_filter = ("severity", "status", "stage", "pool")
    search_fields = ("title",)
    list_select_related = ("release", "pool")
    raw_id_fields = ("release",)
    fields = (
        "release",
        "pool",
        "title",
        "severity",
        "status",
        "body",
        "key",
        "stage",
        "stage_run",
        "author",
        "created_at",
        "updated_at",
        "resolved_at",
    )

    def get_readonly_fields(
        self, request: HttpRequest, obj: KnownLimitation | None = None
    ) -> tuple[str, ...]:
        """The bookkeeping fields always; a stage's note also its stage-owned fields and its
        release."""
        if obj is not None and obj.key:
            return ("release", *STAGE_OWNED_FIELDS, *_ALWAYS_READ_ONLY)
        return _ALWAYS_READ_ONLY

    def save_model(
        self, request: HttpRequest, obj: KnownLimitation, form: Any, change: bool
    ) -> None:
        """Stamp the author of a new note, `updated_at`, and `resolved_at` with the status."""
        now = timezone.now()
        if not change and not obj.key:
            obj.author = request.user
            obj.created_at = now
        if obj.status == LimitationStatus.RESOLVED:
            obj.resolved_at = obj.resolved_at or now
        else:
            obj.resolved_at = None
        obj.updated_at = now
        super().save_model(request, obj, form, change)
