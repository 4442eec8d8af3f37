"""Known limitations: the notes a stage raises from its findings, and the notes people write.

Two kinds of `KnownLimitation` rows live side by side:

- notes a stage raised from its findings, with a stable `key` ("operators:missing:aten::foo",
  "precision:float16", "plan:no-fit", "distributed:mismatch", "analyze:mtp", ...).
  `limitations_sync_for_stage` runs after each stage attempt that produced a result: it
  raises or updates the note of every current finding (reopening a resolved one whose problem
  is back) and resolves the stage's open or mitigated notes whose problem is no longer found
  (a note the attempt could not judge, `engine.registry.unjudged_keys`, is left as it is).
  Only the release's own faults count: a run failed for an infrastructure cause
  (`StageRun.failure_class`: a time limit that stopped a sweep, the host out of memory)
  raises, updates and resolves nothing.
  Their words and severity come from the stage; people may only change their status
  (mitigated, resolved). A finding names the template that words it and the data the words
  need; the note keeps both and is worded whenever it is shown
  (`adaptation.limitation_words`), with the rendering of its last sync stored in `title` and
  `body` beside them.
- notes people write (`key` blank, `author` set): never touched by a stage, and edited only
  by their author or an admin (`adaptation.roles.limitation_may_edit`).

Every status change, a person's or a stage re-run's, is recorded (`LimitationStatusChange`:
who and when).

The findings themselves are plain Python, in each stage's folder
(`engine/stages/<name>/findings.py`, named by its registry entry; `engine.findings` holds what
they share); `engine.registry.findings_for_stage` dispatches, so a new stage's notes need no
change here. Reads are in `adaptation.selectors.limitations`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from adaptation.limitation_words import finding_words
from adaptation.models import (
    AcceleratorPool,
    FailureClass,
    KnownLimitation,
    LimitationStatus,
    ModelRelease,
    Severity,
    StageRun,
    StageStatus,
)
from adaptation.models.limitations import LimitationStatusChange
from adaptation.roles import limitation_may_edit
from engine.registry import STAGES_WITH_FINDINGS, findings_for_stage, get_stage, unjudged_keys

logger = logging.getLogger(__name__)


class LimitationError(ValueError):
    """A change to a note the domain refuses, with a message for the person who made it."""


# --- syncing a stage's notes -------------------------------------------------------------------


@dataclass
class SyncOutcome:
    """What one sync did, by note key."""

    raised: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    reopened: list[str] = field(default_factory=list)
    resolved: list[str] = field(default_factory=list)


def _analysis_of(run: StageRun) -> dict[str, Any] | None:
    """The newest succeeded `analyze` result of the run's job (one query)."""
    result = (
        StageRun.objects.filter(job_id=run.job_id, stage="analyze", status=StageStatus.SUCCEEDED)
        .order_by("-attempt")
        .values_list("result", flat=True)
        .first()
    )
    return result if isinstance(result, dict) else None


def limitations_sync_for_stage(*, stage_run: StageRun) -> SyncOutcome | None:
    """Bring the stage's notes on the release (and the job's pool) in line with what the
    finished attempt `stage_run` found.

    Each current finding's note is created, or updated (template and data, or title and
    body, severity, `stage_run`; a resolved one is reopened as the problem is back; a
    mitigated one stays mitigated). The
    stage's open or mitigated notes whose key is no longer found are resolved (`resolved_at`
    now), except those the attempt could not judge (`unjudged_keys`: a distributed run that
    validated nothing leaves an earlier mismatch open). People's notes (blank `key`) are
    never touched. Nothing happens (None) for a run that is not finished or whose result
    holds nothing to judge: a stage that failed before checking resolves nothing; nor for a
    run failed for an infrastructure cause (`failure_class`): what it found before it was
    stopped is not the release's fault.
    """
    if stage_run.stage not in STAGES_WITH_FINDINGS:
        return None
    run = StageRun.objects.select_related("job__release", "job__pool").get(pk=stage_run.pk)
    if run.status not in (StageStatus.SUCCEEDED, StageStatus.FAILED):
        return None
    if run.status == StageStatus.FAILED and run.failure_class == FailureClass.INFRASTRUCTURE:
        return None
    job = run.job
    analysis = _analysis_of(run) if get_stage(run.stage).findings_read_analysis else None
    findings = findings_for_stage(run.stage, run.result, pool=job.pool.name, analysis=analysis)
    if findings is None:
        return None
    outcome = SyncOutcome()
    now = timezone.now()
    with transaction.atomic():
        # One sync per release at a time: an analysis note (pool None) is not covered by the
        # unique constraint, as NULLs differ.
        list(ModelRelease.objects.select_for_update().filter(pk=job.release_id).values("pk"))
        scope = (
            KnownLimitation.objects.filter(release_id=job.release_id, stage=run.stage)
            .exclude(key="")
            .filter(Q(pool_id=job.pool_id) | Q(pool__isnull=True))
            .order_by("pk")
        )
        existing: dict[tuple[int | None, str], KnownLimitation] = {}
        for note in scope:
            existing.setdefault((note.pool_id, note.key), note)
        seen: set[tuple[int | None, str]] = set()
        for finding in findings:
            pool_id = None if finding.all_pools else job.pool_id
            seen.add((pool_id, finding.key))
            note = existing.get((pool_id, finding.key))
            # Stored as their last rendering beside the template and its data: the pages
            # render the template again when they show the note.
            words = finding_words(finding)
            if note is None:
                KnownLimitation.objects.create(
                    release_id=job.release_id,
                    pool_id=pool_id,
                    key=finding.key,
                    stage=run.stage,
                    stage_run=run,
                    title=words.title,
                    body=words.body,
                    template=finding.template,
                    template_data=finding.data,
                    severity=finding.severity,
                    status=LimitationStatus.OPEN,
                    created_at=now,
                    updated_at=now,
                )
                outcome.raised.append(finding.key)
                continue
            # What the stage found changed: another severity, template or data, or for a
            # finding that writes its own words, other words. A reworded template alone is
            # no change of the note (its stored rendering is brought up to date all the same).
            changed = (note.severity, note.template, note.template_data) != (
                finding.severity,
                finding.template,
                finding.data,
            ) or (not finding.template and (note.title, note.body) != (words.title, words.body))
            note.title, note.body, note.severity = words.title, words.body, finding.severity
            note.template, note.template_data = finding.template, finding.data
            note.stage_run = run
            if note.status == LimitationStatus.RESOLVED:
                note.status, note.resolved_at = LimitationStatus.OPEN, None
                limitation_status_record(limitation=note, by=None, stage_run=run, now=now)
                outcome.reopened.append(finding.key)
                changed = True
            elif changed:
                outcome.updated.append(finding.key)
            if changed:
                note.updated_at = now
            note.save(
                update_fields=[
                    "title",
                    "body",
                    "template",
                    "template_data",
                    "severity",
                    "stage_run",
                    "status",
                    "resolved_at",
                    "updated_at",
                ]
            )
        unjudged = unjudged_keys(run.stage, run.result)
        for identity, note in existing.items():
            if identity in seen or note.status == LimitationStatus.RESOLVED:
                continue
            if note.key in unjudged:
                continue
            note.status, note.resolved_at, note.updated_at = LimitationStatus.RESOLVED, now, now
            note.stage_run = run
            note.save(update_fields=["status", "resolved_at", "updated_at", "stage_run"])
            limitation_status_record(limitation=note, by=None, stage_run=run, now=now)
            outcome.resolved.append(note.key)
    if outcome.raised or outcome.reopened or outcome.resolved:
        logger.info(
            "Known limitations of %s after %s: raised %s, reopened %s, resolved %s",
            job.release,
            run,
            outcome.raised,
            outcome.reopened,
            outcome.resolved,
        )
    return outcome


def limitations_sync_safely(*, stage_run: StageRun) -> SyncOutcome | None:
    """`limitations_sync_for_stage` that never raises, for the stage flow: its writes run in
    a savepoint, so a failure rolls back only them; it is logged. None after a failure."""
    try:
        with transaction.atomic():
            return limitations_sync_for_stage(stage_run=stage_run)
    except Exception:
        logger.exception("Could not sync the known limitations of stage run %s", stage_run.pk)
        return None


# --- people's notes ----------------------------------------------------------------------------

# What people may not change on a note a stage raised: its words and severity are the
# stage's (its template and data are never editable).
STAGE_OWNED_FIELDS = ("title", "body", "severity", "pool")
_EDITABLE_FIELDS = ("title", "body", "severity", "pool", "status")


def limitation_status_record(
    *,
    limitation: KnownLimitation,
    by: AbstractBaseUser | None,
    stage_run: StageRun | None = None,
    now: datetime,
) -> LimitationStatusChange:
    """Record that `limitation` now has its status, set by `by` (a user) or by `stage_run`."""
    return LimitationStatusChange.objects.create(
        limitation=limitation,
        status=limitation.status,
        changed_by=by,
        changed_by_name=by.get_username() if by is not None else "",
        stage_run=stage_run,
        changed_at=now,
    )


def _apply_status(note: KnownLimitation, status: str, now: Any) -> None:
    if status not in LimitationStatus.values:
        raise LimitationError(
            f"Unknown status {status!r}; statuses: {', '.join(LimitationStatus.values)}."
        )
    if status == LimitationStatus.RESOLVED:
        if note.status != LimitationStatus.RESOLVED or note.resolved_at is None:
            note.resolved_at = now
    else:
        note.resolved_at = None
    note.status = status


def limitation_create(
    *,
    release: ModelRelease,
    author: Any,
    title: str,
    body: str = "",
    severity: str = Severity.MAJOR,
    pool: AcceleratorPool | None = None,
    status: str = LimitationStatus.OPEN,
) -> KnownLimitation:
    """A person's note on `release` (`pool` None: every pool). Raises `LimitationError` for a
    blank title or an unknown severity or status."""
    if not title.strip():
        raise LimitationError("A known limitation needs a title.")
    if severity not in Severity.values:
        raise LimitationError(
            f"Unknown severity {severity!r}; severities: {', '.join(Severity.values)}."
        )
    now = timezone.now()
    note = KnownLimitation(
        release=release,
        pool=pool,
        title=title.strip(),
        body=body,
        severity=severity,
        author=author if getattr(author, "pk", None) else None,
        created_at=now,
        updated_at=now,
    )
    _apply_status(note, status, now)
    note.save()
    return note


def limitation_update(*, limitation: KnownLimitation, by: Any, **changes: Any) -> KnownLimitation:
    """Change a note's title, body, severity, pool or status (`changes`) as user `by`; only
    its status on a note a stage raised, whose other fields are the stage's. A new status is
    recorded with `by` and the time. Raises `PermissionDenied` when `by` may not edit the note
    (`adaptation.roles.limitation_may_edit`), and `LimitationError` for a stage-owned change,
    an unknown field, or a blank title."""
    if not limitation_may_edit(user=by, limitation=limitation):
        raise PermissionDenied("Only its author or an admin may edit this known limitation.")
    unknown = sorted(set(changes) - set(_EDITABLE_FIELDS))
    if unknown:
        raise LimitationError(f"A known limitation has no editable {', '.join(unknown)}.")
    if limitation.key:
        owned = [
            name
            for name in STAGE_OWNED_FIELDS
            if name in changes and changes[name] != getattr(limitation, name)
        ]
        if owned:
            raise LimitationError(
                f"The {limitation.stage or 'stage'} stage raised this note: its "
                f"{', '.join(owned)} come from the stage; only its status can change."
            )
    if "title" in changes and not str(changes["title"] or "").strip():
        raise LimitationError("A known limitation needs a title.")
    if "severity" in changes and changes["severity"] not in Severity.values:
        raise LimitationError(f"Unknown severity {changes['severity']!r}.")
    now = timezone.now()
    for name in ("title", "body", "severity", "pool"):
        if name in changes:
            value = changes[name]
            setattr(limitation, name, value.strip() if name == "title" else value)
    before = limitation.status
    if "status" in changes:
        _apply_status(limitation, changes["status"], now)
    limitation.updated_at = now
    with transaction.atomic():
        limitation.save()
        if limitation.status != before:
            limitation_status_record(limitation=limitation, by=by, now=now)
    return limitation
