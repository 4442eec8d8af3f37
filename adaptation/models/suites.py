"""Standard-suite runs and the software-stack changes of pools that start them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from adaptation.models.pools import AcceleratorPool


class SuiteTrigger(models.TextChoices):
    MANUAL = "manual", "Manual"
    API = "api", "REST API"
    STACK_UPGRADE = "stack-upgrade", "Stack upgrade"


class SuiteRun(models.Model):
    """One run of a named suite of reference releases on one pool: one job per entry
    (`AdaptationJob.suite_run`). `stack` is the pool's software stack when it started;
    `previous` the run of the same suite on the same pool before it, which the matrix
    compares against."""

    suite = models.SlugField(max_length=64)
    pool = models.ForeignKey(AcceleratorPool, on_delete=models.PROTECT, related_name="suite_runs")
    trigger = models.CharField(max_length=16, choices=SuiteTrigger.choices)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=timezone.now)
    stack = models.JSONField(default=dict, blank=True)
    previous = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="next_runs"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["pool", "suite", "-created_at"])]

    def __str__(self) -> str:
        return f"suite {self.suite} run {self.pk} on {self.pool}"


class StackChange(models.Model):
    """A pool's workers reported a software stack (torch, driver, serving engine versions)
    other than the one it had: a stack upgrade. The first report of a pool is recorded with
    an empty `previous` and starts nothing."""

    pool = models.ForeignKey(
        AcceleratorPool, on_delete=models.CASCADE, related_name="stack_changes"
    )
    worker_name = models.CharField(max_length=255)
    detected_at = models.DateTimeField(default=timezone.now)
    previous = models.JSONField(default=dict, blank=True)
    current = models.JSONField(default=dict)
    suite_run = models.ForeignKey(
        SuiteRun,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="stack_changes",
        help_text="The suite run this change started, if any.",
    )

    class Meta:
        ordering = ["-detected_at", "-id"]

    def __str__(self) -> str:
        return f"stack change of {self.pool} at {self.detected_at:%Y-%m-%d %H:%M}"
