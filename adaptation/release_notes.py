"""Release notes: versioned documents per release and pool, people's additions, exports.

The `release_notes` stage (`engine.stages.release_notes.run`) writes the notes at the end of a
job; its result is stored here as a new `ReleaseNotes` version (`release_notes_store`, called
by the stage's result handler in `adaptation.stage_results`). Versions count up per (release,
pool): a re-run of any stage re-runs every later one, the notes included, so each re-run
leaves a new version and the old ones stay readable.

The stage runs only when every earlier stage of the job succeeded (a failed stage skips the
later ones). `release_notes_regenerate(job=)` writes notes for any job from whatever its
stages found (a failed plan's "what would fit", a failed precision check's metrics) and says
what did not run: `manage.py release_report --regenerate` and the "Regenerate" button use it.

People's additions (`ReleaseNotesAdditions`, Markdown) belong to (release, pool), not to a
version: every version is printed with them, after the generated part
(`release_notes_document`).

Writes are keyword-only `<entity>_<verb>` functions, as in `adaptation.services`; reads
follow them. Markdown is rendered by `adaptation.safe_markdown` (raw HTML off): a note's
text cannot inject markup or script.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max, OuterRef, Subquery
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from adaptation import safe_markdown
from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    ModelRelease,
    ReleaseNotes,
    ReleaseNotesAdditions,
    StageRun,
    StageStatus,
)
from adaptation.selectors.jobs import job_current_stage_runs
from adaptation.selectors.limitations import release_open_limitations
from engine.contract import PoolSpec, ReleaseRef
from engine.stages.release_notes.run import build_release_notes

STAGE = "release_notes"
# Additions longer than this are refused (a notes page, not a wiki).
ADDITIONS_MAX_CHARS = 50_000


class NotesError(Exception):
    """A request about release notes that cannot be met, with the reason for the person."""


# --- reading the limitations for the stage -----------------------------------------------------


def limitation_dicts(rows: Any) -> tuple[dict[str, Any], ...]:
    """`KnownLimitation` rows as the plain dicts `StageContext.limitations` holds."""
    return tuple(
        {
            "title": row.title,
            "body": row.body,
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


# --- writes -------------------------------------------------------------------------------------


def release_notes_store(
    *,
    job: AdaptationJob,
    markdown: str,
    sections: dict[str, Any],
    stage_run: StageRun | None = None,
) -> ReleaseNotes:
    """Store `markdown` and `sections` as the next version of the notes of the job's release
    on its pool (the highest version so far + 1). Two stores racing for one version: the
    unique constraint refuses one, which takes the next number."""
    for _ in range(5):
        latest = ReleaseNotes.objects.filter(
            release_id=job.release_id, pool_id=job.pool_id
        ).aggregate(version=Max("version"))["version"]
        try:
            with transaction.atomic():
                return ReleaseNotes.objects.create(
                    release_id=job.release_id,
                    pool_id=job.pool_id,
                    job=job,
                    stage_run=stage_run,
                    version=(latest or 0) + 1,
                    markdown=markdown,
                    sections=sections,
                )
        except IntegrityError:
            continue
    raise NotesError(f"Could not number a new version of the notes of job {job.pk}; try again.")


def job_stage_states(job: AdaptationJob) -> tuple[dict[str, dict], dict[str, dict]]:
    """(results, states) of the job's stages as the notes engine reads them: the succeeded
    stages' results, and every stage's {"status", "error", "result"} (a failed run's result
    is what it kept), the notes stage itself left out."""
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
        }
    return results, states


def release_notes_regenerate(*, job: AdaptationJob) -> ReleaseNotes:
    """Write a new version of the notes of the job's release on its pool from whatever the
    job's stages found: succeeded stages' results, what failed ones kept, and which stages
    failed, were skipped or did not run; with the open limitations as they are now.
    Raises `NotesError` while the job still runs."""
    job = AdaptationJob.objects.select_related("release", "pool").get(pk=job.pk)
    if job.status in ("pending", "running"):
        raise NotesError(f"Job {job.pk} is still {job.status}; its notes follow when it ends.")
    results, states = job_stage_states(job)
    release, pool = job.release, job.pool
    notes = build_release_notes(
        release=ReleaseRef(
            hub_kind=release.hub_kind,
            hub_endpoint=release.hub_endpoint,
            repo_id=release.repo_id,
            revision=release.revision,
        ),
        pool=PoolSpec(
            name=pool.name,
            backend=pool.backend,
            queue=pool.queue,
            device=pool.device,
            dtypes=tuple(pool.dtypes or ()),
            accelerator=pool.accelerator,
            devices_per_node=pool.devices_per_node,
            nodes=pool.nodes,
        ),
        results=results,
        limitations=notes_limitations(release=release, pool=pool),
        states=states,
    )
    return release_notes_store(job=job, markdown=notes["markdown"], sections=notes["sections"])


def release_notes_additions_update(
    *, release: ModelRelease, pool: AcceleratorPool, body: str, by: Any = None
) -> ReleaseNotesAdditions:
    """Set people's additions to the release's notes on `pool` (Markdown; blank clears
    them). Raises `NotesError` for a body over `ADDITIONS_MAX_CHARS`."""
    body = (body or "").replace("\r\n", "\n").strip()
    if len(body) > ADDITIONS_MAX_CHARS:
        raise NotesError(
            f"Additions are at most {ADDITIONS_MAX_CHARS:,} characters; this is {len(body):,}."
        )
    additions, _ = ReleaseNotesAdditions.objects.update_or_create(
        release=release,
        pool=pool,
        defaults={
            "body": body,
            "updated_by": by if getattr(by, "pk", None) else None,
            "updated_at": timezone.now(),
        },
    )
    return additions


# --- reads --------------------------------------------------------------------------------------


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


# --- the document and its rendering -------------------------------------------------------------


def provenance(notes: ReleaseNotes) -> str:
    """One line saying which version this is, when and from what it was written."""
    source = (
        f"the release_notes stage of job {notes.job_id}"
        if notes.stage_run_id
        else f"job {notes.job_id}'s stages, regenerated"
    )
    return (
        f"Version {notes.version}, generated {notes.created_at:%Y-%m-%d %H:%M} UTC by day0 from "
        f"{source}."
    )


def release_notes_document(
    notes: ReleaseNotes, additions: ReleaseNotesAdditions | None = None
) -> str:
    """The whole Markdown document: the generated notes with their version line after the
    title, then people's additions (when there are any) under "Additions"."""
    title, _, rest = notes.markdown.partition("\n")
    parts = [title.rstrip(), "", f"*{provenance(notes)}*", "", rest.strip()]
    if additions is not None and additions.body.strip():
        parts += ["", "## Additions", "", additions.body.strip(), "", additions_line(additions)]
    return "\n".join(parts).strip() + "\n"


def additions_line(additions: ReleaseNotesAdditions) -> str:
    """Who last edited the additions and when, as an italic line."""
    who = additions.updated_by.get_username() if additions.updated_by_id else "someone"
    return f"*Added by people; last edited by {who} on {additions.updated_at:%Y-%m-%d %H:%M} UTC.*"


def render_markdown(text: str) -> SafeString:
    """`text` (Markdown) as safe HTML through `adaptation.safe_markdown` (raw HTML escaped,
    script URLs refused, tables on): the notes pages and the printable page use it."""
    return mark_safe(safe_markdown.render_markdown(text))  # nothing unsafe survives it


def render_notes_html(notes: ReleaseNotes, additions: ReleaseNotesAdditions | None) -> str:
    """The printable page of `notes` with `additions`: one standalone HTML document (no
    navigation, its stylesheet inline) that prints cleanly to PDF from a browser; what the
    print view serves and `manage.py release_report --format html` writes."""
    return render_to_string(
        "adaptation/release_notes_print.html",
        {
            "notes": notes,
            "document_html": render_markdown(release_notes_document(notes, additions)),
        },
    )


def notes_filename(notes: ReleaseNotes, extension: str) -> str:
    """A download name: "<org>_<name>-<pool>-notes-v<N>.<extension>"."""
    repo = re.sub(r"[^\w.-]+", "_", notes.release.repo_id)
    return f"{repo}-{notes.pool.name}-notes-v{notes.version}.{extension}"
