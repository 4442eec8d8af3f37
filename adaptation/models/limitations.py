"""Known limitations: what users of a release must know before deploying it."""

from __future__ import annotations

from collections.abc import Mapping

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.functional import cached_property

from adaptation.limitation_words import Words, stored_words
from adaptation.models.jobs import StageRun
from adaptation.models.pools import AcceleratorPool
from adaptation.models.releases import ModelRelease
from engine import findings


class Severity(models.TextChoices):
    """How much a limitation keeps a release from serving, most severe first: the engine's
    severities (`engine.findings.SEVERITIES`), which stages' findings carry."""

    BLOCKER = findings.BLOCKER, "Blocker"
    MAJOR = findings.MAJOR, "Major"
    MINOR = findings.MINOR, "Minor"
    INFO = findings.INFO, "Info"


class LimitationStatus(models.TextChoices):
    OPEN = "open", "Open"
    MITIGATED = "mitigated", "Mitigated"
    RESOLVED = "resolved", "Resolved"


class KnownLimitation(models.Model):
    """Something users of a release must know before deploying it: raised by a stage from its
    findings (`key` set, e.g. "operators:missing:aten::_grouped_mm") or written by a person
    (`key` blank, `author` set). `pool` null means every pool. A stage re-run that no longer
    finds the problem marks its note resolved (`resolved_at`).

    Its words are `shown_title` and `shown_body` (Markdown, rendered safely: no raw HTML):
    for a stage's note with a `template`, that template rendered from `template_data` now
    (`adaptation.limitation_words`), so a reworded template is never stale; otherwise the
    stored `title` and `body`, a person's own words. On a stage's note with a template,
    `title` and `body` keep the rendering of its last sync (the admin's search reads them).
    """

    release = models.ForeignKey(ModelRelease, on_delete=models.CASCADE, related_name="limitations")
    pool = models.ForeignKey(
        AcceleratorPool,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="limitations",
        help_text="Blank: every pool.",
    )
    # The engine cuts a stage's titles and keys to these lengths (`engine.findings`).
    title = models.CharField(max_length=findings.TITLE_MAX_CHARS)
    body = models.TextField(blank=True, help_text="Markdown.")
    template = models.CharField(
        max_length=findings.TEMPLATE_MAX_CHARS,
        blank=True,
        help_text="For notes a stage raised: the template that words it "
        "(templates/limitations/<name>.md), rendered whenever the note is shown.",
    )
    template_data = models.JSONField(
        default=dict, blank=True, help_text="The figures and names the template's words need."
    )
    severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.MAJOR)
    status = models.CharField(
        max_length=16, choices=LimitationStatus.choices, default=LimitationStatus.OPEN
    )
    key = models.CharField(
        max_length=findings.KEY_MAX_CHARS,
        blank=True,
        help_text="For notes a stage raised: what it found, so a re-run updates or resolves "
        "the same note.",
    )
    stage = models.CharField(max_length=64, blank=True, help_text="The stage that raised it.")
    stage_run = models.ForeignKey(
        StageRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["release_id", "status", "severity", "-updated_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["release", "pool", "key"],
                condition=~models.Q(key=""),
                name="limitation_one_per_stage_finding",
            ),
            # NULLs never collide in the one above: notes for every pool need their own.
            models.UniqueConstraint(
                fields=["release", "key"],
                condition=~models.Q(key="") & models.Q(pool__isnull=True),
                name="limitation_one_per_finding_all_pools",
            ),
        ]
        indexes = [models.Index(fields=["release", "status"])]
        # Editing a person's note is its author's; this lets the admin role (which holds every
        # day0 permission, `adaptation.roles`) edit anyone's.
        permissions = [("edit_any_knownlimitation", "Can edit anyone's known limitation")]

    def __str__(self) -> str:
        return f"{self.get_severity_display()}: {self.shown_title}"

    @cached_property
    def rendered(self) -> Words | None:
        """Its template's words from its data as they read now; None without a template
        (or when the template is gone: `adaptation.limitation_words.stored_words`)."""
        return stored_words(self.template, self.template_data)

    @property
    def shown_title(self) -> str:
        """The title people read: its template's, else the stored one."""
        return self.rendered.title if self.rendered and self.rendered.title else self.title

    @property
    def shown_body(self) -> str:
        """The body people read (Markdown): its template's, else the stored one."""
        return self.rendered.body if self.rendered else self.body


class LimitationStatusChange(models.Model):
    """One change of a note's status: who made it and when. A person's change keeps their
    user and username (the name stays if the user is deleted); a stage re-run's (resolving a
    note whose problem is gone, reopening one whose problem is back) has no user and names
    the run (`stage_run`, null once that run is deleted)."""

    limitation = models.ForeignKey(
        KnownLimitation, on_delete=models.CASCADE, related_name="status_changes"
    )
    status = models.CharField(max_length=16, choices=LimitationStatus.choices)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    changed_by_name = models.CharField(
        max_length=150, blank=True, help_text="The person's username then; blank: a stage."
    )
    stage_run = models.ForeignKey(
        StageRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-changed_at", "-id"]
        indexes = [models.Index(fields=["limitation", "-changed_at"])]

    def __str__(self) -> str:
        who = self.changed_by_name or "a stage"
        return f"{self.get_status_display()} by {who} at {self.changed_at:%Y-%m-%d %H:%M}"


# Most severe first: the order of the release page's groups and of the board's badge colour
# (the engine's, which the stages' findings carry).
SEVERITY_ORDER: tuple[str, ...] = findings.SEVERITIES
SEVERITY_RANK: Mapping[str, int] = {severity: rank for rank, severity in enumerate(SEVERITY_ORDER)}
# Statuses of a note still worth showing first: a mitigated one is still a limitation.
ACTIVE_STATUSES = (LimitationStatus.OPEN, LimitationStatus.MITIGATED)
