"""Release notes, one version per stage run that wrote them, and people's additions."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from adaptation.models.jobs import AdaptationJob, StageRun
from adaptation.models.pools import AcceleratorPool
from adaptation.models.releases import ModelRelease


class ReleaseNotes(models.Model):
    """One version of a release's notes on one pool, written by the `release_notes` stage:
    configuration notes, performance recommendations, precision summary, known limitations
    and what was not validated. `markdown` is the generated document; `sections` the same
    content as data for the pages. Versions count up per (release, pool); people's additions
    live in `ReleaseNotesAdditions` and survive regeneration."""

    release = models.ForeignKey(ModelRelease, on_delete=models.CASCADE, related_name="notes")
    pool = models.ForeignKey(AcceleratorPool, on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey(AdaptationJob, on_delete=models.CASCADE, related_name="notes")
    stage_run = models.ForeignKey(
        StageRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    version = models.PositiveIntegerField()
    markdown = models.TextField()
    sections = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["release_id", "pool_id", "-version"]
        verbose_name_plural = "release notes"
        constraints = [
            models.UniqueConstraint(
                fields=["release", "pool", "version"], name="release_notes_version_unique"
            )
        ]

    def __str__(self) -> str:
        return f"notes v{self.version} of {self.release} on {self.pool}"


class ReleaseNotesAdditions(models.Model):
    """What people added to a release's notes on a pool (Markdown): kept across every
    regeneration and printed after the generated part."""

    release = models.ForeignKey(ModelRelease, on_delete=models.CASCADE, related_name="+")
    pool = models.ForeignKey(AcceleratorPool, on_delete=models.CASCADE, related_name="+")
    body = models.TextField(blank=True, help_text="Markdown.")
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "release notes additions"
        constraints = [
            models.UniqueConstraint(fields=["release", "pool"], name="notes_additions_unique")
        ]

    def __str__(self) -> str:
        return f"additions to {self.release} on {self.pool}"
