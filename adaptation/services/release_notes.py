"""Writes of release notes: versions per release and pool, and people's additions.

The `release_notes` stage (`engine.stages.release_notes.run`) gathers the notes as data at
the end of a job; when its result is stored (the stage's handler in
`adaptation.services.stage_results`), `release_notes_store` writes the Markdown document
(`release_notes_markdown`) and the one-line summary (`release_notes_summary`) from the
templates and keeps them, with the data, as a new `ReleaseNotes` version. A version keeps the
document and the summary as they were written: later template changes never touch them
(nothing re-renders a stored version). Versions count up per (release, pool): a
re-run of any stage re-runs every later one, the notes included, so each re-run leaves a new
version and the old ones stay readable.

The stage runs for every job that ends, failed or not (a failed stage skips the later ones
but this one, whose notes then open with what blocked: `StageDefinition.runs_after_failure`).
`release_notes_regenerate(job=)` writes notes for any finished job from whatever its stages
found (a failed plan's "what would fit", a failed precision check's metrics) and says
what did not run: `manage.py release_report --regenerate` and the "Regenerate" button use it.

People's additions (`ReleaseNotesAdditions`, Markdown) belong to (release, pool), not to a
version: every version is printed with them, after the generated part
(`adaptation.presenters.release_notes.release_notes_document`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.template import engines
from django.utils import timezone

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    ModelRelease,
    ReleaseNotes,
    ReleaseNotesAdditions,
    StageRun,
)
from adaptation.selectors.release_notes import NotesError, job_stage_states, notes_limitations
from engine.contract import PoolSpec, ReleaseRef
from engine.registry import STAGES
from engine.stages.release_notes.result import ReleaseNotesResult
from engine.stages.release_notes.run import build_release_notes

# Additions longer than this are refused (a notes page, not a wiki).
ADDITIONS_MAX_CHARS = 50_000
DOCUMENT_TEMPLATE = "release_notes/document.md"
# Plain text, through the default template engine (escaping off in the template).
SUMMARY_TEMPLATE = "release_notes/summary.txt"


def section_template(stage: str) -> str:
    """The template of stage `stage`'s section of the notes."""
    return f"release_notes/sections/{stage}.md"


def release_notes_markdown(notes: Mapping[str, Any]) -> str:
    """The Markdown document of `notes` (the `release_notes` stage's result: "sections" and
    "order"), from `templates/release_notes/document.md` and each stage's section template,
    through the "markdown" template engine (no HTML escaping; strings escaped for
    Markdown by the templates' filters). Raises `TemplateDoesNotExist` for a stage in
    "order" without a section template."""
    result = ReleaseNotesResult.from_stored(notes)
    sections = result.sections or {}
    order = [
        {"stage": part.stage, "template": section_template(part.stage), "section": section}
        for part, section in result.ordered
    ]
    # The full-size figures follow the serving engine's section (document.md).
    serve_in_order = any(part["stage"] == "serve" for part in order)
    document = (
        engines["markdown"]
        .get_template(DOCUMENT_TEMPLATE)
        .render({"order": order, "sections": sections, "serve_in_order": serve_in_order})
    )
    return document.strip() + "\n"


def release_notes_summary(notes: Mapping[str, Any]) -> str:
    """The one-line summary of `notes` (the `release_notes` stage's result), from
    `templates/release_notes/summary.txt` and the values in `sections["summary"]`: plain
    text, nothing escaped (the pages escape it where they show it)."""
    summary = ReleaseNotesResult.from_stored(notes).summary
    return engines["django"].get_template(SUMMARY_TEMPLATE).render({"summary": summary}).strip()


def release_notes_store(
    *,
    job: AdaptationJob,
    notes: Mapping[str, Any],
    stage_run: StageRun | None = None,
) -> ReleaseNotes:
    """Write the document and the summary of `notes` (the stage's result) and store them with
    the notes' sections as the next version of the notes of the job's release on its pool
    (the highest version so far + 1). The version's `sections["summary"]` is the summary as
    written (the release page shows it), in place of the values it was written from. Two
    stores racing for one version: the unique constraint refuses one, which takes the next
    number."""
    markdown = release_notes_markdown(notes)
    sections = dict(ReleaseNotesResult.from_stored(notes).sections or {}) | {
        "summary": release_notes_summary(notes)
    }
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
        stages=STAGES,
        limitations=notes_limitations(release=release, pool=pool),
        states=states,
    )
    return release_notes_store(job=job, notes=notes)


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
