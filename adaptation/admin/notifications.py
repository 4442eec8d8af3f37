"""Admin for teams, their notification subscriptions and the delivery log.

A generic subscription's signing secret is made when the subscription is saved and shown
once, in the message at the top of the next page; "Rotate signing secret" makes a new one
the same way. Only a superuser may let a subscription reach private or loopback addresses.
Deliveries are read-only, with "Retry now".
"""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from adaptation.admin.messages import secret_show_once
from adaptation.admin.read_only import ReadOnlyAdmin
from adaptation.models import (
    NotificationDelivery,
    NotificationEvent,
    NotificationFormat,
    NotificationSubscription,
    Team,
    default_notification_events,
)
from adaptation.notifications.services import (
    SubscriptionError,
    notification_retry_now,
    subscription_events_check,
    subscription_rotate_secret,
    subscription_url_check,
)
from adaptation.secrets import SecretUnreadable, secret_decrypt

RECENT_DELIVERIES_SHOWN = 10


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    """Teams and their members, with how many subscriptions each has."""

    list_display = ("name", "members_count", "subscriptions_count")
    search_fields = ("name",)
    filter_horizontal = ("members",)

    @admin.display(description="Members")
    def members_count(self, obj: Team) -> int:
        return obj.members.count()

    @admin.display(description="Subscriptions")
    def subscriptions_count(self, obj: Team) -> int:
        return obj.subscriptions.count()


class NotificationSubscriptionForm(forms.ModelForm):
    """Events as checkboxes; the URL must be http(s) (where it points is checked at each
    delivery)."""

    url = forms.URLField(
        max_length=1024,
        assume_scheme="https",
        help_text="http or https; where it points is checked at each delivery.",
    )
    events = forms.MultipleChoiceField(
        choices=NotificationEvent.choices,
        widget=forms.CheckboxSelectMultiple,
        initial=default_notification_events,
    )

    class Meta:
        model = NotificationSubscription
        fields = (
            "team",
            "name",
            "enabled",
            "url",
            "format",
            "allow_private_network",
            "events",
            "pools",
        )

    def clean_url(self) -> str:
        try:
            return subscription_url_check(self.cleaned_data.get("url", ""))
        except SubscriptionError as exc:
            raise forms.ValidationError(str(exc)) from exc

    def clean_events(self) -> list[str]:
        try:
            return subscription_events_check(self.cleaned_data.get("events") or [])
        except SubscriptionError as exc:
            raise forms.ValidationError(str(exc)) from exc


def _show_subscription_secret(
    request: HttpRequest, subscription: NotificationSubscription, secret: str
):
    secret_show_once(
        request,
        owner=f"the subscription “{subscription}” (its signing secret)",
        secret=secret,
        then="Put it in the receiver's configuration: it is stored encrypted.",
    )


@admin.register(NotificationSubscription)
class NotificationSubscriptionAdmin(admin.ModelAdmin):
    """A team's subscriptions: where (the URL, which for Slack is itself the secret), in
    what format, for which events and pools, with the latest deliveries. The admin role's
    only (`adaptation.roles.ADMIN_ONLY_MODELS`)."""

    form = NotificationSubscriptionForm
    list_display = ("name", "team", "format", "events", "url", "enabled", "allow_private_network")
    list_filter = ("team", "format", "enabled", "allow_private_network")
    search_fields = ("name", "team__name", "url")
    filter_horizontal = ("pools",)
    actions = ["rotate_signing_secret"]
    fieldsets = (
        (None, {"fields": ("team", "name", "enabled")}),
        (
            "Where and how",
            {
                "description": "Generic: JSON signed with Standard Webhooks headers (its "
                "secret is shown once, after saving). Slack: a Slack-compatible incoming "
                "webhook URL (not signed: the URL is the secret).",
                "fields": ("url", "format", "secret_status", "allow_private_network"),
            },
        ),
        ("What", {"fields": ("events", "pools")}),
        ("Deliveries", {"fields": ("recent_deliveries", "created_at")}),
    )

    def get_readonly_fields(self, request: HttpRequest, obj=None) -> tuple[str, ...]:
        """The secret's state and the log always; `allow_private_network` too unless the
        user is a superuser (it lets requests reach the internal network)."""
        fields = ("secret_status", "recent_deliveries", "created_at")
        if not request.user.is_superuser:
            fields += ("allow_private_network",)
        return fields

    def save_model(self, request: HttpRequest, obj, form, change: bool) -> None:
        """Save; a generic subscription without a secret gets one, shown once."""
        super().save_model(request, obj, form, change)
        if obj.format == NotificationFormat.GENERIC and not obj.secret_ciphertext:
            _show_subscription_secret(request, obj, subscription_rotate_secret(subscription=obj))

    @admin.action(description="Rotate signing secret (shows the new one once)")
    def rotate_signing_secret(self, request: HttpRequest, queryset: QuerySet) -> None:
        for subscription in queryset.select_related("team"):
            try:
                secret = subscription_rotate_secret(subscription=subscription)
            except SubscriptionError as exc:
                messages.info(request, str(exc))
                continue
            _show_subscription_secret(request, subscription, secret)

    @admin.display(description="Signing secret")
    def secret_status(self, obj: NotificationSubscription) -> str:
        if obj.format != NotificationFormat.GENERIC:
            return "None: Slack-format messages are not signed."
        if not obj.secret_ciphertext:
            return "Made when the subscription is saved, and shown once."
        try:
            secret_decrypt(obj.secret_ciphertext)
        except SecretUnreadable:
            return "Unreadable with the current key: use the action “Rotate signing secret”."
        return "Set (stored encrypted; “Rotate signing secret” makes a new one)."

    @admin.display(description="Recent deliveries")
    def recent_deliveries(self, obj: NotificationSubscription) -> str:
        if obj.pk is None:
            return "—"
        deliveries = list(obj.deliveries.all()[:RECENT_DELIVERIES_SHOWN])
        changelist = reverse("admin:adaptation_notificationdelivery_changelist")
        link = format_html(
            '<a href="{}?subscription__id__exact={}">All deliveries of this subscription</a>',
            changelist,
            obj.pk,
        )
        if not deliveries:
            return format_html("None yet. {}", link)
        rows = format_html_join(
            "",
            '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
            (
                (
                    reverse("admin:adaptation_notificationdelivery_change", args=[d.pk]),
                    f"{d.created_at:%Y-%m-%d %H:%M:%S}",
                    d.event,
                    d.get_status_display(),
                    d.attempts,
                    d.response_status or d.last_error[:120] or "",
                )
                for d in deliveries
            ),
        )
        return format_html(
            "<table><tr><th>Created (UTC)</th><th>Event</th><th>Status</th><th>Attempts</th>"
            "<th>Answer</th></tr>{}</table>{}",
            rows,
            link,
        )


@admin.register(NotificationDelivery)
class NotificationDeliveryAdmin(ReadOnlyAdmin):
    """The delivery log: read-only, with "Retry now"."""

    list_display = (
        "created_at",
        "event",
        "subscription",
        "status",
        "attempts",
        "response_status",
        "next_attempt_at",
        "delivered_at",
        "job",
    )
    list_filter = ("status", "event", "subscription")
    search_fields = ("message_id", "dedupe_key", "subscription__name")
    list_select_related = ("subscription__team", "job__release", "job__pool")
    actions = ["retry_now"]
    fields = (
        "subscription",
        "event",
        "status",
        "attempts",
        "response_status",
        "last_error",
        "created_at",
        "next_attempt_at",
        "delivered_at",
        "message_id",
        "dedupe_key",
        "job",
        "stage_run",
        "payload_json",
    )
    readonly_fields = fields

    @admin.display(description="Payload")
    def payload_json(self, obj: NotificationDelivery) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.payload, indent=2))

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("adaptation.change_notificationdelivery")

    @admin.action(description="Retry now", permissions=["retry"])
    def retry_now(self, request: HttpRequest, queryset: QuerySet) -> None:
        retried = sum(notification_retry_now(delivery=delivery) for delivery in queryset)
        skipped = queryset.count() - retried
        messages.success(
            request,
            f"{retried} deliver{'y' if retried == 1 else 'ies'} queued to be sent again"
            + (f"; {skipped} already delivered, left alone." if skipped else "."),
        )
