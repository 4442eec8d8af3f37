"""Absolute links to day0's pages under `DAY0_PUBLIC_URL`: what notifications and webhook
answers point people to (a release's page, a job's timeline on it, a stage's block)."""

from __future__ import annotations

from django.conf import settings
from django.urls import reverse

from adaptation.models import AdaptationJob, ModelRelease, StageRun


def page_url(path: str) -> str:
    """`path` (a day0 page) as an absolute link under `DAY0_PUBLIC_URL` (the path alone
    where that setting is empty)."""
    base = (settings.DAY0_PUBLIC_URL or "").rstrip("/")
    return f"{base}{path}"


def release_page_url(release: ModelRelease) -> str:
    """A release's page."""
    return page_url(reverse("adaptation:release_detail", args=[release.pk]))


def job_page_url(job: AdaptationJob) -> str:
    """A job's timeline on its release's page."""
    return f"{release_page_url(job.release)}#job-{job.pk}"


def stage_page_url(run: StageRun) -> str:
    """A stage's block in its job's timeline on the release's page."""
    return f"{release_page_url(run.job.release)}#job-{run.job_id}-stage-{run.stage}"
