"""End to end: Hub-format webhooks for an upload served by the local fake Hub, coalesced and
settled by `day0.settle_upload` on a real Celery worker (default queue "day0"), which starts
exactly one job at the last revision; the same worker runs its first stages against the Hub."""

from __future__ import annotations

import json
import time

import pytest
from django.test import Client

from adaptation.models import AdaptationJob, PendingUpload, StageRun, StageStatus
from tests.adaptation.webhooks.conftest import REPO, hub_body, post_hub
from tests.conftest import REALCONFIGS_DIR
from tests.e2e.conftest import celery_worker_process, wait_for  # noqa: F401  (fixture)

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def hub_env(monkeypatch, fake_hub):
    """HF_ENDPOINT at the fake Hub, set before the worker starts (it inherits it)."""
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return fake_hub


def test_hub_webhooks_make_one_job_that_the_worker_runs(
    hub_env,
    hub_watch,
    hub_endpoint,
    celery_worker_process,  # noqa: F811
):
    hub_endpoint.row.quiet_period_s = 2
    hub_endpoint.row.save()
    config = (REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json").read_bytes()
    readme = b"# Acme LLM 7B\n"
    first = hub_env.add_repo(REPO, {".gitattributes": b"", "README.md": readme})
    last = hub_env.add_repo(
        REPO, {".gitattributes": b"", "README.md": readme, "config.json": config}
    )
    client = Client()

    started = time.monotonic()
    for sha in (first, last):  # the second within the quiet period: one upload, one job
        response = post_hub(client, hub_endpoint, hub_body("repo_content_update_main", headSha=sha))
        assert response.status_code == 202, response.json()
        assert AdaptationJob.objects.count() == 0  # the answer comes before any job
    assert time.monotonic() - started < 2

    wait_for(
        lambda: StageRun.objects.filter(stage="fetch", status=StageStatus.SUCCEEDED).exists(),
        timeout_s=90,
        worker=celery_worker_process,
        what="the settled upload's job to fetch its files",
    )
    job = AdaptationJob.objects.get()
    assert job.release.revision == last and job.trigger == "webhook"
    fetched = job.stage_runs.get(stage="fetch").result
    assert json.dumps(fetched).count("LlamaForCausalLM") >= 1
    upload = PendingUpload.objects.get()
    assert (upload.status, upload.job_id, upload.deliveries) == ("started", job.pk, 2)
