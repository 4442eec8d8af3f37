"""What several pages say of a stage: its title, the board's columns, its newest finished
attempt, whose fault a failed one is, whether a run is still active, and why an attempt was
skipped."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from adaptation.domain.stages import stage_title
from adaptation.models import ACTIVE_STAGE_STATUSES, AdaptationJob, StageRun, StageStatus
from adaptation.selectors.jobs import latest_runs_by_stage
from engine.registry import stage_names
from engine.stored import as_mapping


@dataclass(frozen=True)
class StageColumn:
    """One stage as a board column: its registry name and its title."""

    name: str
    title: str


def stage_columns(stage_lists: Iterable[Iterable[str]]) -> list[StageColumn]:
    """The union of the given jobs' stages: registered ones in registry order, then any
    unregistered ones in the order first seen."""
    seen: list[str] = []
    for names in stage_lists:
        for name in names:
            if name not in seen:
                seen.append(name)
    registered = [name for name in stage_names() if name in seen]
    others = [name for name in seen if name not in registered]
    return [StageColumn(name=name, title=stage_title(name)) for name in registered + others]


def finished_run(runs: Iterable[StageRun]) -> StageRun | None:
    """The newest finished (succeeded or failed) attempt among `runs`."""
    done = [r for r in runs if r.status in (StageStatus.SUCCEEDED, StageStatus.FAILED)]
    return max(done, key=lambda r: r.attempt) if done else None


# Whose fault a failed run is (`StageRun.failure_class`), as the pages style it.
FAILURE_CLASSES = ("infrastructure", "release")


def failure_class(run: StageRun) -> str:
    """Whose fault a failed run is: "infrastructure", "release", or "" (not failed, or not
    classified). Read with getattr so a row from before the field still reads."""
    if run.status != StageStatus.FAILED:
        return ""
    value = str(getattr(run, "failure_class", "") or "")
    return value if value in FAILURE_CLASSES else ""


def is_active(run: StageRun) -> bool:
    """Whether the run is queued or running."""
    return run.status in ACTIVE_STAGE_STATUSES


@dataclass(frozen=True)
class SkippedBecause:
    """Why a stage's attempt was skipped: the first earlier stage of its job that failed
    ("" when none did: an earlier stage did not succeed otherwise) and that stage's reason,
    without a final full stop ("" when it gave none)."""

    failed_stage: str
    reason: str


def skipped_because(job: AdaptationJob, latest: StageRun) -> SkippedBecause | None:
    """Why the `latest` attempt was skipped (None unless it was), from the job's prefetched
    runs: its failed stage's stored reason, else the last line of that stage's error."""
    if latest.status != StageStatus.SKIPPED:
        return None
    failed = [
        r
        for r in latest_runs_by_stage(job).values()
        if r.status == StageStatus.FAILED and r.position < latest.position
    ]
    if not failed:
        return SkippedBecause(failed_stage="", reason="")
    first = min(failed, key=lambda r: r.position)
    why = str(as_mapping(first.result).get("reason") or "").strip()
    if not why:
        lines = [line for line in str(first.error or "").strip().splitlines() if line.strip()]
        why = lines[-1].strip() if lines else ""
    return SkippedBecause(failed_stage=first.stage, reason=why.rstrip("."))


# A run still to come or under way: its panel says what it waits for, nothing more.
WAITING = (StageStatus.PENDING, StageStatus.QUEUED, StageStatus.RUNNING)


def settle_unfinished(
    panel: Any, job: AdaptationJob, run: StageRun, pools_without_worker: Mapping[int, Any] | None
) -> bool:
    """Fill a stage panel (`waiting_for`, `state`, `skipped`, `reason`) for a run that has no
    result to show: waiting (a pending or queued one on a pool no live worker serves says so),
    skipped (and why) or cancelled. True when the panel is complete."""
    if run.status in WAITING:
        if run.status != StageStatus.RUNNING:
            panel.waiting_for = (pools_without_worker or {}).get(job.pool_id)
        return True
    if run.status == StageStatus.SKIPPED:
        panel.state = "skipped"
        panel.skipped = skipped_because(job, run)
        return True
    if run.status == StageStatus.CANCELLED:
        panel.state = "cancelled"
        panel.reason = str(run.error or "")
        return True
    return False
