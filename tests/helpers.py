"""Test helpers that drive the real services without a Celery worker."""

from __future__ import annotations

from adaptation.models import AdaptationJob, StageRun, StageStatus
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
