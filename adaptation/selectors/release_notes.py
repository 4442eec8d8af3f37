"""Reads of release notes: versions per release and pool, people's additions, the release
page's summaries, a release named on the command line, and what the `release_notes` stage
reads (the job's stages' states, the open known limitations).

Writes are in `adaptation.services.release_notes`; the documents (Markdown download,
printable page) in `adaptation.presenters.release_notes`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Max, OuterRef, Subquery

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    ModelRelease,
    ReleaseNotes,
    ReleaseNotesAdditions,
    StageStatus,
)
from adaptation.selectors.jobs import job_current_stage_runs
from adaptation.selectors.limitations import release_open_limitations

STAGE = "release_notes"


class NotesError(Exception):
    """A request about release notes that cannot be met, with the reason for the person."""


# --- what the stage reads -----------------------------------------------------------------------


def limitation_dicts(rows: Any) -> tuple[dict[str, Any], ...]:
    """`KnownLimitation` rows as the plain dicts `StageContext.limitations` holds, with the
    words the release page shows (`shown_title`, `shown_body`: a stage's note worded by its
    template now)."""
    return tuple(
        {
            "title": row.shown_title,
            "body": row.shown_body,
            "severity": row.severity,
            "status": row.status,
            "stage": row.stage,
            "pool": row.pool.name if row.pool_id else None,
            "updated_at": row.updated_at.isoformat() if row.updated_at else None,
        }
        for row in rows
    )


def notes_limitations(*, release: ModelRelease, pool: AcceleratorPool) -> tuple[dict, ...]:
    """The release's open known limitations on `pool` (or every pool), most severe first,
    as plain dicts: what the stage's runner passes and what a regeneration reads."""
    return limitation_dicts(release_open_limitations(release=release, pool=pool))


def job_stage_states(job: AdaptationJob) -> tuple[dict[str, dict], dict[str, dict]]:
    """(results, states) of the job's stages as the notes engine reads them: the succeeded
    stages' results, and every stage's {"status", "error", "result", "failure_class"} (a
    failed run's result is what it kept, its class whose fault it was), the notes stage
    itself left out."""
    results: dict[str, dict] = {}
    states: dict[str, dict] = {}
    for run in job_current_stage_runs(job):
        if run.stage == STAGE:
            continue
        if run.status == StageStatus.SUCCEEDED:
            results[run.stage] = run.result or {}
        states[run.stage] = {
            "status": run.status,
            "error": run.error,
            "result": run.result if run.status == StageStatus.FAILED else None,
            "failure_class": run.failure_class,
        }
    return results, states


# --- versions and additions ---------------------------------------------------------------------


def release_notes_pools(release: ModelRelease) -> list[AcceleratorPool]:
    """The pools the release has notes on, the one with the newest notes first."""
    newest = dict(
        ReleaseNotes.objects.filter(release=release)
        .values("pool_id")
        .annotate(newest=Max("created_at"))
        .values_list("pool_id", "newest")
    )
    pools = AcceleratorPool.objects.filter(pk__in=newest)
    return sorted(pools, key=lambda pool: (newest[pool.pk], pool.pk), reverse=True)


def release_notes_get(
    *, release: ModelRelease, pool: AcceleratorPool, version: int | None = None
) -> ReleaseNotes | None:
    """Version `version` (default: the latest) of the release's notes on `pool`, or None."""
    notes = ReleaseNotes.objects.filter(release=release, pool=pool).select_related(
        "job", "stage_run", "pool", "release"
    )
    if version is not None:
        return notes.filter(version=version).first()
    return notes.order_by("-version").first()


def release_notes_versions(*, release: ModelRelease, pool: AcceleratorPool) -> list[ReleaseNotes]:
    """Every version of the release's notes on `pool`, newest first (documents left out)."""
    return list(
        ReleaseNotes.objects.filter(release=release, pool=pool)
        .defer("markdown", "sections")
        .order_by("-version")
    )


def release_notes_additions(
    *, release: ModelRelease, pool: AcceleratorPool
) -> ReleaseNotesAdditions | None:
    """People's additions to the release's notes on `pool`, or None."""
    return (
        ReleaseNotesAdditions.objects.filter(release=release, pool=pool)
        .select_related("updated_by")
        .first()
    )


@dataclass(frozen=True)
class NotesSummary:
    """The latest notes of a release on one pool, for the release page."""

    pool: AcceleratorPool
    version: int
    created_at: datetime
    job_id: int
    regenerated: bool
    summary: str


def release_notes_summaries(release: ModelRelease) -> list[NotesSummary]:
    """The latest notes of the release on each pool, newest first (one query)."""
    latest_version = (
        ReleaseNotes.objects.filter(release=OuterRef("release"), pool=OuterRef("pool"))
        .order_by("-version")
        .values("version")[:1]
    )
    rows = (
        ReleaseNotes.objects.filter(release=release, version=Subquery(latest_version))
        .select_related("pool")
        .defer("markdown")
        .order_by("-created_at", "-id")
    )
    return [
        NotesSummary(
            pool=notes.pool,
            version=notes.version,
            created_at=notes.created_at,
            job_id=notes.job_id,
            regenerated=notes.stage_run_id is None,
            summary=str((notes.sections or {}).get("summary") or ""),
        )
        for notes in rows
    ]


_REVISION = re.compile(r"[0-9a-fA-F]{7,64}|[\w.-]+")


def release_resolve(ref: str) -> ModelRelease:
    """The release `ref` names: its id ("12"), or "org/name[@revision]" (a revision or its
    first 7+ characters; without one, the repo's newest discovered release). Raises
    `NotesError` saying what was not found."""
    ref = ref.strip()
    if ref.isdigit():
        release = ModelRelease.objects.filter(pk=int(ref)).first()
        if release is None:
            raise NotesError(f"No release {ref}.")
        return release
    repo_id, _, revision = ref.partition("@")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise NotesError(f"{ref!r} is neither a release id nor org/name[@revision].")
    releases = ModelRelease.objects.filter(repo_id=repo_id).order_by("-discovered_at", "-id")
    if not releases.exists():
        raise NotesError(f"No release of {repo_id}.")
    if not revision:
        return releases.first()
    exact = releases.filter(revision=revision).first()
    if exact is not None:
        return exact
    if len(revision) >= 7 and _REVISION.fullmatch(revision):
        matches = list(releases.filter(revision__startswith=revision)[:2])
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise NotesError(f"Revision {revision!r} of {repo_id} is ambiguous; give more of it.")
    known = ", ".join(r.revision[:12] for r in releases[:5])
    raise NotesError(f"No release of {repo_id} at revision {revision!r} (known: {known}).")
