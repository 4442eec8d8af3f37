"""Teams, their notification subscriptions and each delivery sent."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from adaptation.models.jobs import AdaptationJob, StageRun
from adaptation.models.pools import AcceleratorPool


class Team(models.Model):
    """A group of people who subscribe to job events together."""

    name = models.CharField(max_length=128, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="teams")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class NotificationEvent(models.TextChoices):
    STAGE_FAILED = "stage.failed", "Stage failed"
    JOB_SUCCEEDED = "job.succeeded", "Job succeeded"
    JOB_FAILED = "job.failed", "Job failed"
    # A measured figure worse than the last good runs' spread (adaptation/models/regressions.py).
    REGRESSION_DETECTED = "regression.detected", "Regression detected"
    # The managers' weekly summary (adaptation/domain/reports.py), sent to subscriptions
    # that opt in.
    REPORT_WEEKLY = "report.weekly", "Weekly summary"


class NotificationFormat(models.TextChoices):
    GENERIC = "generic", "JSON signed with Standard Webhooks headers"
    SLACK = "slack", "Slack-compatible incoming webhook"


def default_notification_events() -> list[str]:
    """A new subscription's events: every job event (the weekly summary is opted into)."""
    return [
        choice.value for choice in NotificationEvent if choice != NotificationEvent.REPORT_WEEKLY
    ]


class NotificationSubscription(models.Model):
    """A team's subscription: job events of the chosen pools (all when none) sent to `url`.

    A generic subscription signs each message with its `whsec_…` secret (stored encrypted,
    shown once). Addresses that resolve to private, loopback, link-local or reserved networks
    are refused unless `allow_private_network` (an admin's decision) is set.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="subscriptions")
    name = models.CharField(max_length=128)
    url = models.URLField(max_length=1024)
    format = models.CharField(
        max_length=16, choices=NotificationFormat.choices, default=NotificationFormat.GENERIC
    )
    events = models.JSONField(
        default=default_notification_events,
        help_text='Event names: "stage.failed", "job.succeeded", "job.failed".',
    )
    pools = models.ManyToManyField(
        AcceleratorPool, blank=True, related_name="+", help_text="Blank: every pool."
    )
    secret_ciphertext = models.TextField(blank=True, editable=False)
    allow_private_network = models.BooleanField(
        default=False,
        help_text="Deliver even when the URL resolves to a private or loopback address "
        "(an admin's decision: it lets requests reach the internal network).",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["team__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="subscription_unique_per_team")
        ]

    def __str__(self) -> str:
        return f"{self.team.name}: {self.name}"


class NotificationDelivery(models.Model):
    """One event sent (or being sent) to one subscription, with its attempts.

    `message_id` is the Standard Webhooks `webhook-id`, the same on every retry so the
    receiver can drop repeats; `dedupe_key` ("job.failed:job=12") makes the same event for
    the same subject one delivery per subscription.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed (gave up)"
        BLOCKED = "blocked", "Blocked (private address)"

    subscription = models.ForeignKey(
        NotificationSubscription, on_delete=models.CASCADE, related_name="deliveries"
    )
    event = models.CharField(max_length=32, choices=NotificationEvent.choices)
    dedupe_key = models.CharField(max_length=128)
    message_id = models.CharField(max_length=64, unique=True)
    job = models.ForeignKey(
        AdaptationJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    stage_run = models.ForeignKey(
        StageRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "notification deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["subscription", "dedupe_key"], name="notification_once_per_subject"
            )
        ]

    def __str__(self) -> str:
        return f"{self.event} to {self.subscription} ({self.status})"
