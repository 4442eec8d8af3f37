"""Standard-suite runs: one job per reference release of a suite on one pool, linked to the
run before it so the matrix can say what changed (docs/suite.md)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    HubKind,
    SuiteRun,
    SuiteTrigger,
    Trigger,
)
from adaptation.services.errors import ServiceError
from adaptation.services.jobs import job_create
from adaptation.services.releases import release_get_or_create
from engine.hubs import HubSpec, canonical_endpoint, hub_source
from engine.hubs.base import HubError, ReleaseCandidate
from engine.registry import stage_list_check
from engine.suites import STANDARD_SUITE, Suite, SuiteEntry, SuiteError, suite_load

logger = logging.getLogger(__name__)


def suite_definition(name: str) -> Suite:
    """The suite `name` read from the engine's suite files, its folders checked under the
    checkout. Raises `ServiceError` with the reason (unknown suite, bad file, a folder
    gone)."""
    try:
        return suite_load(name, base_dir=settings.BASE_DIR)
    except SuiteError as exc:
        raise ServiceError(str(exc)) from exc


def suite_start(
    *,
    pool: AcceleratorPool,
    trigger: str,
    suite: str = STANDARD_SUITE,
    requested_by: Any = None,
    stages: list[str] | None = None,
) -> SuiteRun:
    """Start a run of `suite` on `pool`: a `SuiteRun` holding the pool's stack now, linked to
    the newest earlier run of the same suite on that pool (`previous`), and one job per
    entry (trigger "suite", `suite_entry` the entry's name), each queued after commit as any
    job is.

    Each entry's release is found through the mirror hub kind on the entry's root, as a
    mirror watch would list it: the same release row as a watch or `manage.py adapt` on
    that folder (recorded found "suite" when the suite sees it first). A suite run is a
    deliberate re-run, so a job still running for the same release on the pool does not
    refuse it. `stages` restricts the jobs to those stages (in registry order; default:
    every stage).

    Raises `ServiceError` before anything is written: an unknown trigger, suite or stage, a
    disabled pool, an entry's folder that cannot be read or is not complete.
    """
    if trigger not in SuiteTrigger.values:
        raise ServiceError(f"Unknown suite trigger {trigger!r}; one of {SuiteTrigger.values}.")
    if not pool.enabled:
        raise ServiceError(f"Pool {pool.name!r} is disabled; enable it to run a suite on it.")
    definition = suite_definition(suite)
    try:
        # The jobs' own rule: known, in the registry's order, each with what it needs.
        names = stage_list_check(stages) if stages else None
    except ValueError as exc:
        raise ServiceError(str(exc)) from exc
    found = [(entry, *_entry_candidate(entry)) for entry in definition.entries]
    requester = requested_by if getattr(requested_by, "pk", None) else None
    with transaction.atomic():
        # Serialises two starts on one pool, so each links to the one before it.
        locked = AcceleratorPool.objects.select_for_update().get(pk=pool.pk)
        previous = (
            SuiteRun.objects.filter(suite=definition.name, pool=locked)
            .order_by("-created_at", "-id")
            .first()
        )
        run = SuiteRun.objects.create(
            suite=definition.name,
            pool=locked,
            trigger=trigger,
            requested_by=requester,
            stack=locked.stack or {},
            previous=previous,
        )
        now = timezone.now()
        for entry, endpoint, candidate in found:
            release, _ = release_get_or_create(
                hub_kind=HubKind.MIRROR,
                hub_endpoint=endpoint,
                repo_id=candidate.repo_id,
                revision=candidate.revision,
                # A folder has no publication time: first seen complete, as a watch records.
                published_at=candidate.published_at or now,
                found_by=Trigger.SUITE,
            )
            job = job_create(
                release=release,
                pool=locked,
                trigger=Trigger.SUITE,
                requested_by=requester,
                stages=names,
                allow_duplicate=True,
            )
            AdaptationJob.objects.filter(pk=job.pk).update(suite_run=run, suite_entry=entry.name)
    logger.info(
        "Suite %s run %s on %s (%s): %d jobs",
        run.suite,
        run.pk,
        pool.name,
        trigger,
        len(found),
    )
    return run


def _mirror_endpoint(root: str) -> str:
    """The endpoint of the mirror root `root` (relative to the checkout) as releases record
    it: the demo hub's folder exactly as `load_demo`'s watch names it (`DAY0_DEMO_HUB_DIR`,
    which may be written otherwise), so the suite's demo releases are the demo's rows; any
    other root as an absolute path under the checkout."""
    folder = settings.BASE_DIR / root
    demo = Path(settings.DAY0_DEMO_HUB_DIR)
    if folder.resolve() == demo.resolve():
        return str(demo)
    return str(folder)


def _entry_candidate(entry: SuiteEntry) -> tuple[str, ReleaseCandidate]:
    """The entry's mirror endpoint (as releases record it) and its release as the folder is
    now. Raises `ServiceError` when the folder cannot be read or is not complete."""
    spec = HubSpec(kind=HubKind.MIRROR, endpoint=_mirror_endpoint(entry.root))
    try:
        candidate = hub_source(spec).latest_release(entry.repo_id)
    except HubError as exc:
        raise ServiceError(f"Suite entry {entry.name}: {exc.message}") from exc
    if not candidate.complete:
        raise ServiceError(f"Suite entry {entry.name} is not complete: {candidate.reason}")
    return canonical_endpoint(spec), candidate
