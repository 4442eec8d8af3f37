"""Report test fixtures: a second pool (`h200`, given to the app's tests by
tests/adaptation/conftest.py) and a helper that writes a job's stage runs with chosen finish
times."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from adaptation.models import AcceleratorPool, AdaptationJob, ModelRelease, StageRun
from adaptation.services.jobs import job_refresh_status
from tests.factories import cpu_pool


@pytest.fixture
def h200(db) -> AcceleratorPool:
    """A second pool (described by its layout, no worker here)."""
    return AcceleratorPool.objects.create(
        name="h200", backend="manifest", accelerator="h200", queue="pool.h200"
    )


def job_with_runs(
    release: ModelRelease,
    *,
    stages: list[str],
    outcomes: dict[str, tuple[str, datetime | None]],
    pool: AcceleratorPool | None = None,
    errors: dict[str, str] | None = None,
    created_at: datetime | None = None,
    **fields: Any,
) -> AdaptationJob:
    """A job running `stages` whose attempt-1 runs end as `outcomes` says ({stage: (status,
    finished_at)}; stages left out stay pending), refreshed through the service so its
    status and readiness are stored as in production."""
    job = AdaptationJob.objects.create(
        release=release,
        pool=pool or cpu_pool(),
        trigger="poll",
        stages=stages,
        **({"created_at": created_at} if created_at else {}),
        **fields,
    )
    for position, name in enumerate(stages):
        status, finished = outcomes.get(name, ("pending", None))
        StageRun.objects.create(
            job=job,
            stage=name,
            position=position,
            status=status,
            started_at=finished - timedelta(seconds=5) if finished else None,
            finished_at=finished,
            error=(errors or {}).get(name, ""),
        )
    if any(finished for _, finished in outcomes.values()):
        job.started_at = min(f for _, f in outcomes.values() if f) - timedelta(seconds=5)
        job.save(update_fields=["started_at"])
    return job_refresh_status(job=job)
