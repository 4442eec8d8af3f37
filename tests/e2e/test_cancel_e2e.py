"""End to end: cancelling a job while a real worker runs its long stage stops that stage at
its next step (the worker learns of it from its heartbeat), and the same worker goes on to run
the next job: nothing is killed, so the worker's pool is never left stuck."""

from __future__ import annotations

import pytest

from adaptation.models import JobStatus, StageRun, StageStatus
from adaptation.services.jobs import job_cancel, job_create
from tests.conftest import REALCONFIGS_DIR
from tests.e2e.conftest import celery_worker_process, wait_for  # noqa: F401  (fixture)
from tests.factories import cpu_pool
from tests.helpers import mirror_release

pytestmark = [pytest.mark.e2e]


def test_cancelling_a_running_stage_stops_it_and_the_worker_runs_the_next_job(
    celery_worker_process,  # noqa: F811
    tmp_path,
):
    release = mirror_release(
        tmp_path / "hub",
        "acme/long-runner",
        (REALCONFIGS_DIR / "openai__gpt-oss-20b.json").read_bytes(),
    )
    long_job = job_create(
        release=release,
        pool=cpu_pool(),
        trigger="manual",
        stages=["fetch", "stability"],
        options={"stability": {"duration_s": 300, "batch_size": 1, "prompt_len": 8}},
    )
    wait_for(
        lambda: StageRun.objects.filter(
            job=long_job, stage="stability", status=StageStatus.RUNNING
        ).exists(),
        timeout_s=90,
        worker=celery_worker_process,
        what="the stability stage to start",
    )

    job_cancel(job=long_job)
    next_job = job_create(release=release, pool=cpu_pool(), trigger="manual", stages=["fetch"])

    # The 300 s stability run stops within a heartbeat (1 s here) and a step; the worker
    # (concurrency 1) can only take the next job once it has.
    wait_for(
        lambda: StageRun.objects.filter(
            job=next_job, stage="fetch", status=StageStatus.SUCCEEDED
        ).exists(),
        timeout_s=90,
        worker=celery_worker_process,
        what="the next job to run after the cancel",
    )
    long_job.refresh_from_db()
    stability = long_job.stage_runs.get(stage="stability")
    assert long_job.status == JobStatus.CANCELLED
    assert (stability.status, stability.result) == (StageStatus.CANCELLED, None)
    assert "stopped: it is no longer running" in celery_worker_process.log_path.read_text()
