"""Webhook endpoints, every delivery they received, and uploads waiting to settle."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from adaptation.models.jobs import AdaptationJob
from adaptation.models.pools import AcceleratorPool
from adaptation.models.releases import HubWatch, ModelRelease


class WebhookKind(models.TextChoices):
    HUGGINGFACE = "huggingface", "Hugging Face Hub"
    GENERIC = "generic", "Standard Webhooks (generic)"


class WebhookEndpoint(models.Model):
    """A URL that turns signed deliveries into adaptation jobs: `/webhooks/<kind>/<id>`.

    The id is a random UUID, so the URL itself is not guessable. The secret is shown once at
    creation and never stored in the clear: a Hub endpoint keeps an HMAC-SHA256 digest of it
    (the Hub sends the secret itself in `X-Webhook-Secret`), a generic endpoint keeps it
    encrypted (Standard Webhooks signatures need the key; `adaptation/secrets.py`).

    Hub deliveries for one repo are coalesced until it has been quiet for `quiet_period_s`
    seconds and the upload is complete; `pool` overrides the matching watch's pool (Hub) or
    `DAY0_DEFAULT_POOL` (generic) when a delivery names none.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=128, unique=True)
    kind = models.CharField(max_length=32, choices=WebhookKind.choices)
    secret_digest = models.CharField(max_length=128, blank=True, editable=False)
    secret_ciphertext = models.TextField(blank=True, editable=False)
    pool = models.ForeignKey(
        AcceleratorPool,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="webhook_endpoints",
        help_text="Pool for the jobs it starts; blank: the matching watch's pool (Hub) or the "
        "default pool (generic), unless a delivery names one.",
    )
    quiet_period_s = models.PositiveIntegerField(
        default=60,
        help_text="Hub deliveries for one repo are coalesced until it has been quiet this many "
        "seconds and the upload is complete; then one job starts at the last revision.",
    )
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    last_delivery_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()})"


class DeliveryVerdict(models.TextChoices):
    """What day0 did with an inbound delivery."""

    ACCEPTED = "accepted", "Accepted: job started"
    COALESCING = "coalescing", "Accepted: waiting for the upload to settle"
    DUPLICATE = "duplicate", "Duplicate: no new job"
    IGNORED = "ignored", "Ignored"
    REJECTED = "rejected", "Rejected"


class WebhookDelivery(models.Model):
    """One inbound request to an endpoint, whatever became of it.

    `headers` are stored without secrets or signatures; `body` is the raw body, the bytes as
    received, whatever they are (up to the size limit; larger bodies are refused with 413 and
    stored empty; a delivery refused before its sender proved itself keeps its first KiB
    only). The text fields taken from a delivery (`event`, `repo_id`, `revision`, ...) are
    stored with NUL characters and lone surrogates escaped (`\\u0000`, `\\ud800`), which
    PostgreSQL text columns cannot hold. `idempotency_key`
    is set only on the delivery that first claimed its key (a generic `webhook-id`): the
    unique constraint makes a second job for the same key impossible, even under races.
    """

    # PROTECT: deleting an endpoint must not delete its log; disable it instead.
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.PROTECT, related_name="deliveries"
    )
    received_at = models.DateTimeField(default=timezone.now, db_index=True)
    delivery_id = models.CharField(
        max_length=255, blank=True, help_text="webhook-id (generic) or the Hub's request id."
    )
    # NULL, not "", for deliveries that claim no key: NULLs never collide in the constraint.
    idempotency_key = models.CharField(  # noqa: DJ001
        max_length=255, null=True, blank=True, editable=False
    )
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    body = models.BinaryField(blank=True, default=b"")
    event = models.CharField(max_length=64, blank=True, help_text='e.g. "repo.content/update".')
    repo_id = models.CharField(max_length=256, blank=True)
    revision = models.CharField(max_length=128, blank=True)
    status_code = models.PositiveSmallIntegerField()
    verdict = models.CharField(max_length=16, choices=DeliveryVerdict.choices)
    reason = models.TextField(blank=True)
    release = models.ForeignKey(
        ModelRelease, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    job = models.ForeignKey(
        AdaptationJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-received_at", "-id"]
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "idempotency_key"], name="webhook_delivery_idempotency_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.endpoint.name} {self.received_at:%Y-%m-%d %H:%M:%S} {self.verdict}"

    @property
    def body_bytes(self) -> bytes:
        """The stored body as bytes (PostgreSQL hands a binary column back as a memoryview)."""
        return bytes(self.body or b"")

    @property
    def body_text(self) -> str:
        """The body as text to show: invalid UTF-8 replaced (U+FFFD), NUL as `\\u0000`."""
        return self.body_bytes.decode("utf-8", errors="replace").replace("\x00", "\\u0000")


class PendingUpload(models.Model):
    """Hub deliveries for one repo, coalesced while its upload goes on: one job starts, pinned
    to `revision` (the last head sha seen), once the repo has been quiet for the endpoint's
    `quiet_period_s` and the hub shows the upload complete (config present, every shard the
    index names present)."""

    class Status(models.TextChoices):
        WAITING = "waiting", "Waiting for the upload to settle"
        STARTED = "started", "Job started"
        DUPLICATE = "duplicate", "Revision already adapted"
        ABANDONED = "abandoned", "Abandoned"

    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.PROTECT, related_name="pending_uploads"
    )
    watch = models.ForeignKey(
        HubWatch, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    pool = models.ForeignKey(AcceleratorPool, on_delete=models.PROTECT, related_name="+")
    hub_endpoint = models.CharField(max_length=512)
    repo_id = models.CharField(max_length=256)
    revision = models.CharField(max_length=128)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.WAITING)
    deliveries = models.PositiveIntegerField(default=1)
    first_event_at = models.DateTimeField(default=timezone.now)
    last_event_at = models.DateTimeField(default=timezone.now)
    checks = models.PositiveIntegerField(default=0, help_text="Completeness checks made.")
    last_check_at = models.DateTimeField(null=True, blank=True)
    last_check_error = models.TextField(blank=True)
    release = models.ForeignKey(
        ModelRelease, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    job = models.ForeignKey(
        AdaptationJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-last_event_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "repo_id"],
                condition=models.Q(status="waiting"),
                name="pending_upload_one_waiting_per_repo",
            )
        ]

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision[:12]} ({self.status})"
