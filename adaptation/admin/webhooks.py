"""Admin for inbound webhooks: endpoints (created here or by `create_webhook_endpoint`; the
secret is shown once, on creation or rotation, and never again), and read-only views of the
deliveries they received and the Hub uploads being coalesced.

An endpoint that has received deliveries cannot be deleted (they are its log: the
deliveries' and uploads' `endpoint` is PROTECT, so the admin shows what protects it);
disable it instead, and it answers 404."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from adaptation.admin.messages import secret_show_once
from adaptation.admin.read_only import ReadOnlyAdmin
from adaptation.models import PendingUpload, WebhookDelivery, WebhookEndpoint
from adaptation.webhooks.endpoints import (
    webhook_endpoint_create,
    webhook_endpoint_rotate_secret,
    webhook_setup_hint,
    webhook_url_path,
)


def _show_endpoint_secret(request: HttpRequest, endpoint: WebhookEndpoint, secret: str) -> None:
    url = webhook_url_path(endpoint)
    secret_show_once(
        request,
        owner=repr(endpoint.name),
        secret=secret,
        then=f"URL path: {url}. {webhook_setup_hint(endpoint, url=url)}",
    )


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    """Secrets never reach a form: the digest and ciphertext are not editable fields, and
    the clear secret exists only in the one message shown on creation or rotation."""

    list_display = (
        "name",
        "kind",
        "pool",
        "quiet_period_s",
        "enabled",
        "url_path",
        "last_delivery_at",
    )
    list_filter = ("kind", "enabled", "pool")
    search_fields = ("name",)
    actions = ["rotate_secret"]
    add_fields = ("name", "kind", "pool", "quiet_period_s", "enabled")
    change_fields = (
        "name",
        "kind",
        "url_path",
        "pool",
        "quiet_period_s",
        "enabled",
        "created_by",
        "created_at",
        "last_delivery_at",
    )

    def get_fields(self, request: HttpRequest, obj: WebhookEndpoint | None = None) -> Any:
        return self.add_fields if obj is None else self.change_fields

    def get_readonly_fields(self, request: HttpRequest, obj: WebhookEndpoint | None = None) -> Any:
        if obj is None:
            return ()
        # The kind decides how the secret is kept: changing it would strand the secret.
        return ("kind", "url_path", "created_by", "created_at", "last_delivery_at")

    @admin.display(description="URL path")
    def url_path(self, obj: WebhookEndpoint) -> str:
        return webhook_url_path(obj) if obj.pk else "—"

    def save_model(self, request: HttpRequest, obj: WebhookEndpoint, form: Any, change: bool):
        """A new endpoint is made by `webhook_endpoint_create` (the one place a secret is
        made), and its secret shown once; changes save as usual."""
        if change:
            super().save_model(request, obj, form, change)
            return
        endpoint, secret = webhook_endpoint_create(
            name=obj.name,
            kind=obj.kind,
            pool=obj.pool,
            quiet_period_s=obj.quiet_period_s,
            created_by=request.user,
        )
        if not obj.enabled:
            endpoint.enabled = False
            endpoint.save(update_fields=["enabled"])
        # The admin goes on with `obj` (log entry, redirect): make it the saved row.
        obj.pk = endpoint.pk
        obj.secret_digest, obj.secret_ciphertext = (
            endpoint.secret_digest,
            endpoint.secret_ciphertext,
        )
        obj.created_by, obj.created_at = endpoint.created_by, endpoint.created_at
        obj._state.adding, obj._state.db = False, endpoint._state.db
        _show_endpoint_secret(request, endpoint, secret)

    @admin.action(description="Rotate the secret of the selected endpoints (shown once)")
    def rotate_secret(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        for endpoint in queryset:
            _show_endpoint_secret(
                request, endpoint, webhook_endpoint_rotate_secret(endpoint=endpoint)
            )


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    """Every request an endpoint received, newest first: what it announced, the answer and
    why, and the job it started or joined; searchable by repo, revision and delivery id.
    Old ones that started nothing are pruned daily (`day0.prune_webhook_deliveries`)."""

    list_display = (
        "received_at",
        "endpoint",
        "event",
        "repo_id",
        "short_revision",
        "verdict",
        "status_code",
        "job",
    )
    list_filter = ("verdict", "endpoint")
    search_fields = ("repo_id", "revision", "delivery_id")
    date_hierarchy = "received_at"
    list_select_related = ("endpoint", "job")
    # The raw body is binary: shown as text (invalid UTF-8 replaced, NUL escaped).
    readonly_fields = ("body_text",)

    @admin.display(description="Body")
    def body_text(self, obj: WebhookDelivery) -> str:
        return obj.body_text

    @admin.display(description="Revision", ordering="revision")
    def short_revision(self, obj: WebhookDelivery) -> str:
        return obj.revision[:12]


@admin.register(PendingUpload)
class PendingUploadAdmin(ReadOnlyAdmin):
    """Hub uploads being coalesced, one per endpoint and repo: the revision they wait at,
    how many deliveries and completeness checks so far (the last check's error), and the job
    they started once settled."""

    list_display = (
        "repo_id",
        "endpoint",
        "status",
        "revision",
        "deliveries",
        "first_event_at",
        "last_event_at",
        "checks",
        "last_check_error",
        "job",
    )
    list_filter = ("status", "endpoint")
    search_fields = ("repo_id", "revision")
    list_select_related = ("endpoint", "job")
