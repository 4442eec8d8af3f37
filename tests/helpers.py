"""Test helpers that drive the real services without a Celery worker."""

from __future__ import annotations

from pathlib import Path

from adaptation.models import AdaptationJob, ModelRelease, StageRun, StageStatus
from adaptation.services.releases import release_get_or_create
from engine.hubs import HubSpec, canonical_endpoint, hub_source
from workers.runner import execute_stage_run


def run_queued_stages(job: AdaptationJob, *, max_steps: int = 50) -> AdaptationJob:
    """Run the job's queued stage runs in this process, in order, until none is queued —
    what a worker on the pool's queue does, minus Celery. Returns the refreshed job."""
    for _ in range(max_steps):
        queued = StageRun.objects.filter(job=job, status=StageStatus.QUEUED).order_by("position")
        run = queued.first()
        if run is None:
            break
        execute_stage_run(run.pk, final_try=True)
    job.refresh_from_db()
    return job


def mirror_release(root: Path, repo_id: str, config: bytes) -> ModelRelease:
    """A release of `repo_id` in a mirror folder under `root` holding `config` as its
    config.json, recorded as the poller would (found "manual")."""
    folder = root / repo_id
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(config)
    spec = HubSpec(kind="mirror", endpoint=str(root))
    [candidate] = hub_source(spec).list_releases()
    release, _ = release_get_or_create(
        hub_kind="mirror",
        hub_endpoint=canonical_endpoint(spec),
        repo_id=candidate.repo_id,
        revision=candidate.revision,
        published_at=candidate.published_at,
        found_by="manual",
    )
    return release
