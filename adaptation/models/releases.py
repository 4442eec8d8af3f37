"""Hubs, their watches and the releases found on them."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from adaptation.models.hub_endpoints import (
    hub_endpoint_refusal,
    hub_endpoint_unlisted_reason,
    mirror_root_refusal,
)
from adaptation.models.pools import AcceleratorPool
from engine.hubs.kinds import HUB_KIND_SPECS, hub_kind_choices, known_hub_kind
from engine.registry import job_options_check

# The hub kinds as Django choices, one member per row of `engine.hubs.kinds.HUB_KIND_SPECS`
# (`HubKind.HUGGINGFACE`, `HubKind.MODELSCOPE`, `HubKind.MIRROR`: the kind upper-cased). The
# fields below take their choices from `hub_kind_choices`, a callable, so a new row changes
# no migration.
HubKind = models.TextChoices(
    "HubKind",
    [(spec.kind.upper(), (spec.kind, spec.label)) for spec in HUB_KIND_SPECS],
    module=__name__,
)


class HubWatch(models.Model):
    """A hub location polled for new releases: an org/author or a repo pattern."""

    name = models.CharField(max_length=128, unique=True)
    kind = models.CharField(max_length=32, choices=hub_kind_choices)
    endpoint = models.CharField(
        max_length=512,
        blank=True,
        help_text="Hub URL (blank: the hub its kind's variable configures, such as HF_ENDPOINT, "
        "else the kind's public hub; otherwise one of its kind on the Allowed hub endpoints "
        "list) or a mirror folder (inside DAY0_MIRROR_ROOTS).",
    )
    author = models.CharField(
        max_length=128, blank=True, help_text="Org or user (ModelScope: organization) to list."
    )
    repo_pattern = models.CharField(
        max_length=256, blank=True, help_text="fnmatch pattern on the repo id; blank: all."
    )
    pool = models.ForeignKey(
        AcceleratorPool,
        on_delete=models.PROTECT,
        related_name="watches",
        help_text="Pool whose workers adapt the releases this watch finds.",
    )
    enabled = models.BooleanField(default=True)
    poll_interval_s = models.PositiveIntegerField(
        "Poll interval (s)",
        default=300,
        validators=[MinValueValidator(10)],
        help_text="Seconds between polls; errors back off exponentially from it.",
    )
    job_options = models.JSONField(
        default=dict,
        blank=True,
        help_text="Stage options for the jobs of the releases it finds (by poll or webhook), as "
        '`adapt --options` takes them: {"plan": {"context_tokens": 131072}, '
        '"stability": {"duration_s": 3600}}.',
    )
    last_polled_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    # Counters since the watch was created (Prometheus counters on /metrics): every poll ends
    # in exactly one of them.
    polls_succeeded = models.PositiveBigIntegerField(default=0)
    polls_rate_limited = models.PositiveBigIntegerField(
        default=0, help_text="Polls the hub answered 429 (Too Many Requests)."
    )
    polls_failed = models.PositiveBigIntegerField(
        default=0, help_text="Polls that failed for any other reason (hub, network, refusal)."
    )
    next_poll_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "hub watches"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """A URL hub watch (Hugging Face, ModelScope) needs a configured hub of its kind, a
        folder watch (a mirror) a folder inside the mirror roots
        (`adaptation.models.hub_endpoints`, checked again before each poll), and its job
        options must be ones the stages take; a typo is caught when saved, not at the next
        poll. Raises `ValidationError` naming the field."""
        refusal = self.endpoint_refusal()
        if refusal:
            raise ValidationError({"endpoint": refusal})
        spec = known_hub_kind(self.kind)
        if spec is not None and spec.is_folder and not Path(self.endpoint).is_dir():
            raise ValidationError({"endpoint": f"{self.endpoint or '(blank)'} is not a folder."})
        try:
            self.job_options = job_options_check(options=self.job_options)
        except ValueError as exc:
            raise ValidationError({"job_options": str(exc)}) from exc

    def endpoint_refusal(self, *, resolve: bool = True) -> str:
        """Why this watch may not poll its endpoint ("" when it may): a URL hub endpoint that
        is not a configured hub of its kind or fails the address guard, a folder outside
        `DAY0_MIRROR_ROOTS`. Resolves an allow-listed hub's host, unless not `resolve` (then
        the address guard is left to the poll and the token check). "" for a kind the table
        does not hold (the poll refuses that kind)."""
        spec = known_hub_kind(self.kind)
        if spec is None:
            return ""
        if spec.is_url_hub:
            if not resolve:
                return hub_endpoint_unlisted_reason(self.endpoint, self.kind)
            return hub_endpoint_refusal(self.endpoint, self.kind)
        return mirror_root_refusal(self.endpoint)


class Trigger(models.TextChoices):
    """How a release was found, and so what started its first job."""

    POLL = "poll", "Hub poll"
    WEBHOOK = "webhook", "Webhook"
    MANUAL = "manual", "Manual"
    API = "api", "REST API"
    SUITE = "suite", "Standard suite"


class ModelRelease(models.Model):
    """One repo at one revision on one hub. Never created twice for the same triple."""

    watch = models.ForeignKey(
        HubWatch, null=True, blank=True, on_delete=models.SET_NULL, related_name="releases"
    )
    hub_kind = models.CharField(max_length=32, choices=hub_kind_choices)
    hub_endpoint = models.CharField(max_length=512)
    repo_id = models.CharField(max_length=256)
    revision = models.CharField(max_length=128)
    published_at = models.DateTimeField(null=True, blank=True, help_text="As the hub says.")
    discovered_at = models.DateTimeField(default=timezone.now)
    found_by = models.CharField(max_length=16, choices=Trigger.choices)
    config = models.JSONField(null=True, blank=True, help_text="config.json as fetched.")
    metadata = models.JSONField(default=dict, blank=True)
    architecture = models.CharField(max_length=128, blank=True)
    family = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-discovered_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["hub_kind", "hub_endpoint", "repo_id", "revision"],
                name="release_unique_per_hub_repo_revision",
            )
        ]

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision[:12]}"

    @property
    def hub_repo_url(self) -> str:
        """The repo's page on its hub at `hub_endpoint` (`HubKindSpec.repo_page`:
        `<hub>/<org>/<name>` on a Hugging Face hub, `<hub>/models/<org>/<name>` on
        ModelScope); "" for a kind without pages (a mirror folder)."""
        spec = known_hub_kind(self.hub_kind)
        return spec.repo_page(self.hub_endpoint, self.repo_id) if spec is not None else ""

    @property
    def publication_known(self) -> bool:
        """Whether `published_at` is when the hub published the release. A kind without
        publication times (`HubKindSpec.publishes_time`: a mirror folder) has its
        `published_at` set to when day0 first saw the release's files complete, which the
        pages call "discovered"."""
        spec = known_hub_kind(self.hub_kind)
        return self.published_at is not None and (spec is None or spec.publishes_time)

    @property
    def publication_time(self) -> datetime | None:
        """`published_at` when it is a publication time (`publication_known`), else None."""
        return self.published_at if self.publication_known else None

    def day0_basis(self) -> tuple[datetime, str]:
        """Where the release's time-to-Day-0 runs from: its publication time when the hub gave
        one ("publication"), else its discovery ("discovery")."""
        if self.publication_time is not None:
            return self.publication_time, "publication"
        return self.discovered_at, "discovery"

    @property
    def time_to_detect(self) -> timedelta | None:
        """Discovered minus published (None when the hub gave no publication time: a mirror's
        `published_at` is its first sight, not a publication)."""
        if self.publication_time is None:
            return None
        return self.discovered_at - self.publication_time
