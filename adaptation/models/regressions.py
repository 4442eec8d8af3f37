"""Regressions: a measured figure of a job worse than the last good runs of the same release
(or family) on the same pool."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from adaptation.models.jobs import AdaptationJob, StageRun


class BaselineScope(models.TextChoices):
    RELEASE = "release", "Same release"
    FAMILY = "family", "Same family"


class Regression(models.Model):
    """One figure of `job` outside the spread of its baseline runs and worse by more than
        `margin` (a fraction). `baseline_jobs` are the ids of the last good jobs compared with,
        newest first; `baseline_low`..`baseline_high` their spread and `baseline_median` its
        middle, in `unit`. `worse_by` is the fraction the value is worse than the median; `floor`
    the least worsening (in `unit`) it also needed."""

    job = models.ForeignKey(AdaptationJob, on_delete=models.CASCADE, related_name="regressions")
    stage_run = models.ForeignKey(
        StageRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="regressions"
    )
    metric = models.CharField(
        max_length=64,
        help_text='What was measured, on what, at which point: "decode_tokens_per_s:twin:'
        'bfloat16:128", "duration_s:worker:analyze" (adaptation/selectors/regressions.py).',
    )
    unit = models.CharField(max_length=32, blank=True, help_text='"tokens/s", "s", ...')
    value = models.FloatField()
    baseline_median = models.FloatField()
    baseline_low = models.FloatField()
    baseline_high = models.FloatField()
    baseline_jobs = models.JSONField(default=list)
    scope = models.CharField(max_length=16, choices=BaselineScope.choices)
    margin = models.FloatField(
        help_text="The margin it was judged with: a fraction of the median (0.1 = 10 %)."
    )
    floor = models.FloatField(
        default=0.0,
        help_text="The least worsening it also needed, in `unit`: DAY0_REGRESSION_FLOOR_S for a "
        "duration on the host's clock, 0 for other figures.",
    )
    worse_by = models.FloatField(
        help_text="How much worse than the median it is: a fraction of the median."
    )
    detected_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-detected_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "metric"], name="regression_unique_per_job")
        ]

    def __str__(self) -> str:
        return f"{self.metric} regression of job {self.job_id}"
