"""Model releases: one row per repo, revision and hub, never created twice."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    HubWatch,
    ModelRelease,
)
from adaptation.services.jobs import job_create
from engine.hubs.base import ReleaseCandidate
from engine.hubs.kinds import kinds_without_publication_time


def release_get_or_create(
    *,
    hub_kind: str,
    hub_endpoint: str,
    repo_id: str,
    revision: str,
    published_at: datetime | None,
    found_by: str,
    watch: HubWatch | None = None,
) -> tuple[ModelRelease, bool]:
    """The release at (hub, repo, revision), created on first sight. Safe under races: the
    unique constraint decides, and the loser reads the winner's row."""
    lookup = {
        "hub_kind": hub_kind,
        "hub_endpoint": hub_endpoint,
        "repo_id": repo_id,
        "revision": revision,
    }
    existing = ModelRelease.objects.filter(**lookup).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            release = ModelRelease.objects.create(
                **lookup, published_at=published_at, found_by=found_by, watch=watch
            )
    except IntegrityError:
        return ModelRelease.objects.get(**lookup), False
    return release, True


def release_from_candidate(
    *,
    candidate: ReleaseCandidate,
    hub_kind: str,
    hub_endpoint: str,
    found_by: str,
    pool: AcceleratorPool,
    watch: HubWatch | None = None,
    requested_by: Any = None,
    adapt_known: bool = False,
    options: dict[str, dict[str, Any]] | None = None,
    seen_at: datetime | None = None,
    allow_duplicate: bool = True,
) -> AdaptationJob | None:
    """Record a hub candidate as a release (never twice) and start its job (with the
    per-stage `options` of `job_create`).

    A release seen before gets no new job (None) unless `adapt_known`: someone asked for it
    explicitly (`adapt`), so it is adapted again; `allow_duplicate` is `job_create`'s (False:
    refused with `DuplicateJobError` while a job for it on `pool` has not ended).

    A kind without publication times (`HubKindSpec.publishes_time`: a mirror folder) gives
    its release's `published_at` as when its files were first seen complete, `seen_at` (the
    poll that saw them; default now), and it stays so (a later poll, or a touched file, finds
    the release already recorded). The pages call that time "discovered"
    (`ModelRelease.publication_known`).
    """
    published_at = candidate.published_at
    if published_at is None and hub_kind in kinds_without_publication_time():
        published_at = seen_at or timezone.now()
    with transaction.atomic():
        release, created = release_get_or_create(
            hub_kind=hub_kind,
            hub_endpoint=hub_endpoint,
            repo_id=candidate.repo_id,
            revision=candidate.revision,
            published_at=published_at,
            found_by=found_by,
            watch=watch,
        )
        if not created and not adapt_known:
            return None
        return job_create(
            release=release,
            pool=pool,
            trigger=found_by,
            requested_by=requested_by,
            options=options,
            allow_duplicate=allow_duplicate,
        )
