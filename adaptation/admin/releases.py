"""Admin for hub watches and the hubs they may use (configured here), and read-mostly views of
what they found: releases, their jobs with each stage attempt inline, and the stored operator
and precision rows."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from adaptation.models import (
    AdaptationJob,
    AllowedHubEndpoint,
    HubWatch,
    ModelRelease,
    OperatorCheck,
    PrecisionResult,
    StageRun,
)


@admin.register(HubWatch)
class HubWatchAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "kind",
        "author",
        "repo_pattern",
        "pool",
        "enabled",
        "poll_interval_s",
        "last_polled_at",
        "next_poll_at",
        "consecutive_failures",
    )
    list_filter = ("kind", "enabled", "pool")
    search_fields = ("name", "author", "repo_pattern", "endpoint")
    readonly_fields = (
        "last_polled_at",
        "last_success_at",
        "last_error",
        "consecutive_failures",
        "next_poll_at",
    )


@admin.register(AllowedHubEndpoint)
class AllowedHubEndpointAdmin(admin.ModelAdmin):
    """Hubs besides HF_ENDPOINT that Hugging Face watches may poll and that receive the
    worker's HF_TOKEN: the admin role's list (engineers see it, to know which hubs they may
    use). A URL resolving to an internal address is refused unless "allow private network"
    is set (`AllowedHubEndpoint.clean`)."""

    list_display = ("url", "allow_private_network", "note", "created_at")
    list_filter = ("allow_private_network",)
    search_fields = ("url", "note")
    readonly_fields = ("created_at",)


class StageRunInline(admin.TabularInline):
    model = StageRun
    extra = 0
    can_delete = False
    fields = ("stage", "attempt", "status", "started_at", "finished_at", "worker_host", "error")
    readonly_fields = fields


@admin.register(AdaptationJob)
class AdaptationJobAdmin(admin.ModelAdmin):
    """Jobs to read. A job is started from its release's page ("Adapt on pool…"), the API or
    `manage.py adapt`, which check its options and queue its first stage: the admin adds none
    (its add form saved a job without a pool or stage runs)."""

    list_display = ("id", "release", "pool", "trigger", "status", "created_at", "finished_at")
    list_filter = ("status", "pool", "trigger")
    inlines = [StageRunInline]
    readonly_fields = (
        "release",
        "pool",
        "trigger",
        "stages",
        "status",
        "started_at",
        "finished_at",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(ModelRelease)
class ModelReleaseAdmin(admin.ModelAdmin):
    list_display = ("repo_id", "revision", "hub_kind", "family", "published_at", "discovered_at")
    list_filter = ("hub_kind", "found_by", "family")
    search_fields = ("repo_id", "revision")
    readonly_fields = ("config", "metadata")


@admin.register(OperatorCheck)
class OperatorCheckAdmin(admin.ModelAdmin):
    list_display = ("name", "status", "feature", "pool", "stage_run")
    list_filter = ("status", "pool")
    search_fields = ("name", "feature")


@admin.register(PrecisionResult)
class PrecisionResultAdmin(admin.ModelAdmin):
    list_display = ("stage_run", "pool", "dtype", "passed", "top1_agreement", "max_abs_error")
    list_filter = ("passed", "dtype", "pool")
