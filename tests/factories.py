"""Small factories for domain rows: each fills what the test does not care about."""

from __future__ import annotations

import hashlib
import itertools
from datetime import timedelta
from typing import Any

from django.utils import timezone

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    HubKind,
    HubWatch,
    ModelRelease,
    StageRun,
    StageStatus,
)

_counter = itertools.count(1)


def cpu_pool() -> AcceleratorPool:
    """The `cpu` pool the migrations create (made again after a transactional test's flush),
    without its serving engine: the migrations give it vLLM's CPU build, which `make engine`
    installs and tests do not, so its jobs' `serve` stage does not run (a test of the stage
    sets an engine)."""
    pool, _ = AcceleratorPool.objects.get_or_create(
        name="cpu", defaults={"backend": "cpu", "queue": "pool.cpu"}
    )
    if pool.engine:
        pool.engine = {}
        pool.save(update_fields=["engine"])
    return pool


def make_watch(**fields: Any) -> HubWatch:
    n = next(_counter)
    defaults: dict[str, Any] = {
        "name": f"watch-{n}",
        "kind": HubKind.MIRROR,
        "endpoint": "/nonexistent",
        "pool": cpu_pool(),
    }
    defaults.update(fields)
    return HubWatch.objects.create(**defaults)


def make_release(**fields: Any) -> ModelRelease:
    n = next(_counter)
    defaults: dict[str, Any] = {
        "hub_kind": HubKind.HUGGINGFACE,
        "hub_endpoint": "https://huggingface.co",
        "repo_id": f"org/model-{n}",
        "revision": hashlib.sha1(str(n).encode()).hexdigest(),
        "published_at": timezone.now() - timedelta(hours=2),
        "found_by": "poll",
    }
    defaults.update(fields)
    return ModelRelease.objects.create(**defaults)


# Page and service tests build two-stage jobs, so they do not change as stages are added to
# the registry; a test that needs every stage passes `stages=stage_names()`.
CORE_STAGES = ("fetch", "analyze")


def make_job(
    *,
    release: ModelRelease | None = None,
    stages: tuple[str, ...] | list[str] = CORE_STAGES,
    statuses: dict[str, str] | None = None,
    results: dict[str, dict] | None = None,
    errors: dict[str, str] | None = None,
    **fields: Any,
) -> AdaptationJob:
    """A job with one stage run per stage of `stages`, in the given statuses (default pending).

    Finished runs get start/finish times one and three seconds apart so durations show.
    """
    release = release or make_release()
    names = list(stages)
    job = AdaptationJob.objects.create(
        release=release,
        pool=fields.pop("pool", None) or cpu_pool(),
        trigger=fields.pop("trigger", "poll"),
        stages=names,
        **fields,
    )
    now = timezone.now()
    for position, name in enumerate(names):
        status = (statuses or {}).get(name, StageStatus.PENDING)
        started = now - timedelta(seconds=10 - position) if status != StageStatus.PENDING else None
        finished = (
            started + timedelta(seconds=3)
            if started and status in (StageStatus.SUCCEEDED, StageStatus.FAILED)
            else None
        )
        StageRun.objects.create(
            job=job,
            stage=name,
            position=position,
            status=status,
            started_at=started,
            finished_at=finished,
            heartbeat_at=started,
            worker_host="worker-1" if started else "",
            result=(results or {}).get(name),
            error=(errors or {}).get(name, ""),
        )
    from adaptation.services.jobs import job_refresh_status

    return job_refresh_status(job=job)
