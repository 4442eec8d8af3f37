"""Admin for hub watches and the hubs they may use (configured here), and read-mostly views of
what they found: releases, their jobs with each stage attempt inline, and the stored operator
and precision rows."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from adaptation.admin.read_only import NoAddAdmin
from adaptation.models import (
    AdaptationJob,
    AllowedHubEndpoint,
    HubWatch,
    ModelRelease,
    OperatorCheck,
    PrecisionResult,
    StageRun,
)
from adaptation.models.hub_endpoints import HUGGINGFACE
from engine.hubs.kinds import allow_list_kind_choices
from engine.hubs.trust import same_hub


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
        # Counted by the polls themselves (F() updates); a form saving the values it loaded
        # would undo the polls counted while it was open (/metrics's day0_hub_polls_total).
        "polls_succeeded",
        "polls_rate_limited",
        "polls_failed",
        "created_at",
    )


class AllowedHubEndpointForm(forms.ModelForm):
    """An allow-list entry's fields; `allows_private_network` (set by the admin per request)
    says whether the user may keep `allow_private_network` for a changed URL."""

    allows_private_network = False
    # Optional, so that a form posted without it (as before entries had kinds) means Hugging
    # Face.
    hub_kind = forms.ChoiceField(
        choices=allow_list_kind_choices, initial=HUGGINGFACE, required=False
    )

    class Meta:
        model = AllowedHubEndpoint
        fields = ("hub_kind", "url", "allow_private_network", "note")

    def clean_hub_kind(self) -> str:
        return self.cleaned_data.get("hub_kind") or HUGGINGFACE

    def clean(self) -> dict:
        """Drop the leave to reach private networks when a user who may not give it changes
        the URL (the model's clean then checks the new address)."""
        cleaned = super().clean()
        entry = self.instance
        if (
            not self.allows_private_network
            and entry.allow_private_network
            and not same_hub(cleaned.get("url") or "", self.initial.get("url") or "")
        ):
            entry.allow_private_network = False
        return cleaned


@admin.register(AllowedHubEndpoint)
class AllowedHubEndpointAdmin(admin.ModelAdmin):
    """Hubs besides each kind's configured one (HF_ENDPOINT, MODELSCOPE_ENDPOINT) that
    watches of the entry's kind may poll and that receive the worker's token of that kind
    (HF_TOKEN, MODELSCOPE_API_TOKEN): the admin role's list (engineers see it, to know which
    hubs they may use). A URL resolving to an internal address is refused unless "allow
    private network" is set (`AllowedHubEndpoint.clean`), which only a superuser may set, as
    for a pool's engine and a notification subscription."""

    form = AllowedHubEndpointForm
    list_display = ("url", "hub_kind", "allow_private_network", "note", "created_at")
    list_filter = ("hub_kind", "allow_private_network")
    search_fields = ("url", "note")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        """`created_at`; `allow_private_network` too unless the user is a superuser (it lets
        the worker, and its HF_TOKEN, reach the internal network)."""
        if request.user.is_superuser:
            return ("created_at",)
        return ("created_at", "allow_private_network")

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any):
        form = super().get_form(request, obj, change, **kwargs)
        form.allows_private_network = bool(request.user.is_superuser)
        return form


class StageRunInline(admin.TabularInline):
    model = StageRun
    extra = 0
    can_delete = False
    fields = ("stage", "attempt", "status", "started_at", "finished_at", "worker_host", "error")
    readonly_fields = fields


@admin.register(AdaptationJob)
class AdaptationJobAdmin(NoAddAdmin):
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


@admin.register(ModelRelease)
class ModelReleaseAdmin(NoAddAdmin):
    """Releases as polls, webhooks and the API found them. Where a release is (its hub,
    endpoint, repo and revision) is read-only and none is added here: the stages fetch from
    it, and only a watch's or webhook's endpoint is checked against the allowed hubs and
    mirror roots (`adaptation.models.hub_endpoints`)."""

    list_display = ("repo_id", "revision", "hub_kind", "family", "published_at", "discovered_at")
    list_filter = ("hub_kind", "found_by", "family")
    search_fields = ("repo_id", "revision")
    readonly_fields = (
        "watch",
        "hub_kind",
        "hub_endpoint",
        "repo_id",
        "revision",
        "config",
        "metadata",
    )


@admin.register(OperatorCheck)
class OperatorCheckAdmin(admin.ModelAdmin):
    list_display = ("name", "status", "feature", "pool", "stage_run")
    list_filter = ("status", "pool")
    search_fields = ("name", "feature")


@admin.register(PrecisionResult)
class PrecisionResultAdmin(admin.ModelAdmin):
    list_display = ("stage_run", "pool", "dtype", "passed", "top1_agreement", "max_abs_error")
    list_filter = ("passed", "dtype", "pool")
