"""Adaptation jobs and their stage runs (a `StageRun` row is the truth about one attempt)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

from adaptation.models.pools import AcceleratorPool
from adaptation.models.releases import ModelRelease, Trigger


class JobStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class Readiness(models.TextChoices):
    """How far a release has come on a pool, lowest first (thresholds: DAY0_READINESS)."""

    NONE = "none", "Not started"
    EXPERIMENTAL = "experimental", "Experimental"
    FUNCTIONAL = "functional", "Functional"
    COMPLETE = "complete", "Complete"


class AdaptationJob(models.Model):
    """Adapting one release to one pool: an ordered list of stages run on the pool's queue.

    `stages` is the stage list fixed when the job was created; `status` is derived from the
    latest attempt of each stage by `services.job_refresh_status`.
    """

    release = models.ForeignKey(ModelRelease, on_delete=models.CASCADE, related_name="jobs")
    pool = models.ForeignKey(AcceleratorPool, on_delete=models.PROTECT, related_name="jobs")
    trigger = models.CharField(max_length=16, choices=Trigger.choices)
    stages = models.JSONField(default=list)
    options = models.JSONField(
        default=dict,
        blank=True,
        help_text='Per-job stage options: {"plan": {"context_tokens": 8192, "concurrency": 16, '
        '"dtype": "fp8"}}.',
    )
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Kept by `services.job_refresh_status` from the stages (adaptation/readiness.py), so
    # reports over thousands of releases read one column instead of every stage run.
    readiness = models.CharField(max_length=16, choices=Readiness.choices, default=Readiness.NONE)
    blocking_stage = models.CharField(
        max_length=64, blank=True, help_text="The stage that keeps the job from the next level."
    )
    ready_at = models.DateTimeField(
        null=True, blank=True, help_text="When every required stage had passed (Day 0)."
    )
    suite_run = models.ForeignKey(
        "adaptation.SuiteRun",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="jobs",
        help_text="The standard-suite run this job belongs to, if any.",
    )
    suite_entry = models.CharField(
        max_length=64, blank=True, help_text="Its entry in that suite (a family shape)."
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status"]), models.Index(fields=["ready_at"])]
        # What the roles grant (adaptation/roles.py): beyond add/change/view, these name the
        # actions an engineer takes on a job.
        permissions = [
            ("trigger_job", "Can trigger adaptation jobs"),
            ("cancel_job", "Can cancel adaptation jobs"),
            ("rerun_stage", "Can re-run a stage of a job"),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.release} on {self.pool})"


class StageStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    SKIPPED = "skipped", "Skipped"
    CANCELLED = "cancelled", "Cancelled"


ACTIVE_STAGE_STATUSES = (StageStatus.QUEUED, StageStatus.RUNNING)


class AttemptEnd(models.TextChoices):
    """How one attempt at a stage run ended (`StageRun.attempts[i]["ended"]`)."""

    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    WORKER_LOST = "worker-lost", "Worker lost"
    TIME_LIMIT = "time-limit", "Time limit"
    TRANSIENT = "transient", "Transient error"
    CANCELLED = "cancelled", "Cancelled"


class Culprit(models.TextChoices):
    """What an attempt's end is put down to (`StageRun.attempts[i]["culprit"]`; None when
    it cannot be told)."""

    INFRASTRUCTURE = "infrastructure", "Infrastructure"
    RELEASE = "release", "Release"


class FailureClass(models.TextChoices):
    """Whose fault a failed stage run is (`StageRun.failure_class`; blank for any other
    status). Only a release failure raises known limitations (docs/limitations.md).

    - infrastructure: the host or the services around it, not the release: a time limit, a
      lost worker, the host out of memory, the broker, hub or network unavailable, a serving
      engine that did not start for a host reason; and a day0 error (an unexpected exception
      in day0's own code: not the release's fault either; its error says "day0 error").
    - release: the release cannot pass the stage: its config, an unsupported feature, a
      precision failure, no fit, an engine that refuses its architecture.
    """

    INFRASTRUCTURE = "infrastructure", "Infrastructure"
    RELEASE = "release", "Release"


class StageRun(models.Model):
    """One attempt of one stage of a job: the truth about that piece of work."""

    job = models.ForeignKey(AdaptationJob, on_delete=models.CASCADE, related_name="stage_runs")
    stage = models.CharField(max_length=64)
    position = models.PositiveSmallIntegerField(help_text="Index of the stage in job.stages.")
    attempt = models.PositiveIntegerField(default=1)
    status = models.CharField(
        max_length=16, choices=StageStatus.choices, default=StageStatus.PENDING
    )
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    worker_host = models.CharField(max_length=255, blank=True)
    celery_task_id = models.CharField(max_length=64, blank=True)
    retries = models.PositiveIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    log = models.TextField(blank=True)
    attempts = models.JSONField(
        default=list,
        blank=True,
        help_text="One entry per time a worker ran this row (a lost or transient one is retried "
        'on the same row), oldest first: {"n", "worker_host", "pid", "started_at", "ended_at", '
        '"ended" (succeeded, failed, worker-lost, time-limit, transient, cancelled; null while '
        'it runs), "reason", "culprit" (infrastructure, release or null), '
        '"oom_kills_at_start"}.',
    )
    sent_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the run's message was last handed to the broker; empty: not sent "
        "(or sending failed).",
    )
    failure_class = models.CharField(
        max_length=16,
        choices=FailureClass.choices,
        blank=True,
        default="",
        help_text="Whose fault a failed run is: infrastructure (time limit, lost worker, host "
        "out of memory, broker/hub/network unavailable, engine did not start for a host "
        "reason, a day0 error) or release (config, unsupported feature, precision, no fit, "
        "engine refuses the architecture); blank unless failed.",
    )

    class Meta:
        ordering = ["job_id", "position", "attempt"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "stage", "attempt"], name="stage_run_unique_attempt"
            )
        ]
        indexes = [models.Index(fields=["status", "heartbeat_at"])]

    def __str__(self) -> str:
        return f"{self.stage}#{self.attempt} of job {self.job_id}"

    @property
    def duration(self) -> timedelta | None:
        """Started to finished, or to now while running; None before it starts."""
        if self.started_at is None:
            return None
        end = self.finished_at or timezone.now()
        return end - self.started_at
