"""Readiness levels: how far a release has come on a pool, from its job's stages.

A job (one release on one pool) reaches a level when every stage that level requires, and
every stage the lower levels require, has succeeded in its latest attempt. The stages per
level are `DAY0_READINESS` (settings, JSON in the environment):

    experimental  fetch, analyze, plan                   (runs on the twin, a plan exists)
    functional    + operators, precision, distributed    (operators covered, precision passed,
                                                          the split validated on the twin, or
                                                          shown impossible to validate there:
                                                          a known-limitation note says why)
    complete      + performance, stability, release_notes

On a pool with a serving engine (`AcceleratorPool.engine`), a job whose own stage list holds
`serve` also needs it passed to be `functional` (the release loads, answers correctly and keeps
up on the engine teams deploy), unless `DAY0_READINESS` already names it for some level. A job
created without it (before the stage existed, or run without it) keeps the readiness its own
stages give it; a pool without an engine does not run it.

A stage the job does not run counts as not passed: a job of `fetch` and `analyze` only stays
below `experimental`, as nothing validated the release further. The **blocking stage** is the
first stage, in the job's run order (then the level's own order for stages the job does not
run), that the next level requires and that has not succeeded. **ready_at** is when every stage
`complete` requires had passed: per stage its first succeeded attempt, the latest of those.
It is Day 0 on that pool, and it never moves: a later re-run (successful or not) leaves it,
while the level says where the job stands now.

`services.job_refresh_status` stores the three on `AdaptationJob` (`readiness`,
`blocking_stage`, `ready_at`) at every stage transition, so reports over thousands of
releases read columns; pages that already hold a job's stage runs compute the same from them
(`readiness_from_runs`). A release's readiness on a pool is that of its latest job there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from adaptation.models import (
    AdaptationJob,
    LimitationStatus,
    Readiness,
    StageRun,
    StageStatus,
)
from adaptation.models.limitations import SEVERITY_ORDER

# The levels above "none", lowest first: each needs its own stages and those of the ones before.
LEVELS: tuple[str, ...] = (Readiness.EXPERIMENTAL, Readiness.FUNCTIONAL, Readiness.COMPLETE)
# The stage a pool with a serving engine needs passed at `ENGINE_LEVEL` (docs/stages/serve.md).
SERVE_STAGE = "serve"
ENGINE_LEVEL = Readiness.FUNCTIONAL


class RunLike(Protocol):
    """What the rule reads of a stage attempt (a `StageRun`, or a row of a historical model)."""

    stage: str
    attempt: int
    status: str
    finished_at: datetime | None


@dataclass(frozen=True)
class JobReadiness:
    """A job's level, the stage keeping it from the next one ("" once complete, or when the
    job runs none of the stages the levels name) and when it was first ready (None before).
    Pages word the level in `adaptation/partials/readiness_level.html`."""

    readiness: str
    blocking_stage: str
    ready_at: datetime | None


def readiness_thresholds_check(thresholds: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """`thresholds` (a level's stages, as `DAY0_READINESS` holds them) with every level,
    lowest first, once every stage name is a registered stage. Raises
    `ImproperlyConfigured` naming the unknown names and the registered ones otherwise (day0
    checks its setting this way when it starts: `AdaptationConfig.ready`)."""
    from engine.registry import stage_names

    known = stage_names()
    if not isinstance(thresholds, Mapping):
        raise ImproperlyConfigured("DAY0_READINESS must map levels to lists of stage names.")
    if extra := [level for level in thresholds if level not in LEVELS]:
        raise ImproperlyConfigured(
            f"DAY0_READINESS: unknown {'level' if len(extra) == 1 else 'levels'} "
            f"{', '.join(map(repr, extra))}; levels: "
            f"{', '.join(LEVELS)}."
        )
    levels = {level: list(thresholds.get(level) or []) for level in LEVELS}
    unknown = [name for stages in levels.values() for name in stages if name not in known]
    if unknown:
        raise ImproperlyConfigured(
            f"DAY0_READINESS names {'stage' if len(unknown) == 1 else 'stages'} "
            f"{', '.join(map(repr, unknown))} that are not "
            f"registered; registered stages: {', '.join(known)}."
        )
    return levels


def readiness_thresholds() -> dict[str, list[str]]:
    """The stages each level requires of its own (`DAY0_READINESS`), lowest first. Its
    names were checked against the registry when day0 started (`readiness_thresholds_check`);
    a job that does not run one of them does not reach that level."""
    configured = settings.DAY0_READINESS
    return {level: list(configured.get(level) or []) for level in LEVELS}


def pool_has_engine(pool: Any) -> bool:
    """Whether `pool` (an `AcceleratorPool`) names a serving engine: its jobs that run the
    `serve` stage then need it passed to be `functional`."""
    return bool(getattr(pool, "engine", None))


def with_engine_stage(thresholds: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """`thresholds` for a job on a pool with a serving engine: `SERVE_STAGE` added to
    `ENGINE_LEVEL`'s stages, unless some level already names it."""
    levels = {level: list(thresholds.get(level) or []) for level in LEVELS}
    if not any(SERVE_STAGE in stages for stages in levels.values()):
        levels[ENGINE_LEVEL].append(SERVE_STAGE)
    return levels


def readiness_from_runs(
    *,
    stages: Sequence[str],
    runs: Iterable[RunLike],
    thresholds: Mapping[str, Sequence[str]] | None = None,
    engine: bool = False,
) -> JobReadiness:
    """The readiness of a job running `stages` (in order) from its stage attempts `runs`
    (every attempt, any order), under `thresholds` (default: `DAY0_READINESS`), with the
    `serve` stage required at `functional` when `engine` (the job's pool has a serving
    engine: `pool_has_engine`) and `stages` holds it. Queries nothing: `runs` may be
    prefetched rows."""
    levels = readiness_thresholds() if thresholds is None else thresholds
    if engine and SERVE_STAGE in stages:
        levels = with_engine_stage(levels)
    latest: dict[str, RunLike] = {}
    first_success: dict[str, datetime] = {}
    for run in runs:
        current = latest.get(run.stage)
        if current is None or run.attempt > current.attempt:
            latest[run.stage] = run
        if run.status == StageStatus.SUCCEEDED and run.finished_at is not None:
            known = first_success.get(run.stage)
            if known is None or run.finished_at < known:
                first_success[run.stage] = run.finished_at
    order = list(stages)
    # The job's own stages first, in its order; a required stage it does not run is missing.
    required = [
        (
            level,
            [s for s in order if s in (levels.get(level) or ())]
            + [s for s in (levels.get(level) or ()) if s not in order],
        )
        for level in LEVELS
    ]
    if not any(names for _, names in required):
        return JobReadiness(readiness=Readiness.NONE, blocking_stage="", ready_at=None)
    reached, blocking = Readiness.NONE, ""
    for level, names in required:
        missing = [
            name
            for name in names
            if name not in latest or latest[name].status != StageStatus.SUCCEEDED
        ]
        if missing:
            blocking = missing[0]
            break
        reached = level
    every = [name for _, names in required for name in names]
    ready_at = (
        max(first_success[name] for name in every)
        if all(name in first_success for name in every)
        else None
    )
    return JobReadiness(readiness=reached, blocking_stage=blocking, ready_at=ready_at)


def job_readiness(*, job: AdaptationJob) -> JobReadiness:
    """The job's readiness from its stage attempts as stored now (one query; one more when
    its pool is not loaded)."""
    runs = StageRun.objects.filter(job=job).only("stage", "attempt", "status", "finished_at")
    return readiness_from_runs(stages=job.stages or [], runs=runs, engine=pool_has_engine(job.pool))


def top_limitation(limitations: Iterable[Any], *, pool_id: int | None) -> Any | None:
    """The most severe (then most recently updated) of open `limitations` that apply to the
    pool `pool_id` (its own and the release's every-pool ones); None when there is none.
    `limitations` are `KnownLimitation` rows of one release, any order."""
    applying = [
        limitation
        for limitation in limitations
        if limitation.status == LimitationStatus.OPEN
        and (limitation.pool_id is None or pool_id is None or limitation.pool_id == pool_id)
    ]
    if not applying:
        return None

    def key(limitation: Any) -> tuple[int, float]:
        rank = (
            SEVERITY_ORDER.index(limitation.severity)
            if limitation.severity in SEVERITY_ORDER
            else len(SEVERITY_ORDER)
        )
        return rank, -limitation.updated_at.timestamp()

    return min(applying, key=key)
