"""End to end, a release day: Hub-format webhooks for a repo served by the local fake Hub
(signed with the endpoint's secret, two commits of one upload) make exactly one job, a real
Celery worker settles the upload and runs every stage of that job to success, and the team's
subscriber endpoint on loopback receives the `job.succeeded` notification signed with Standard
Webhooks headers."""

from __future__ import annotations

import pytest
from django.test import Client
from standardwebhooks import Webhook

from adaptation.models import (
    AdaptationJob,
    HubKind,
    JobStatus,
    NotificationDelivery,
    StageStatus,
    Team,
    WebhookDelivery,
    WebhookKind,
)
from adaptation.notifications.services import subscription_create
from adaptation.webhooks.endpoints import webhook_endpoint_create, webhook_url_path
from tests.adaptation.webhooks.conftest import hub_body
from tests.conftest import QUICK_MEASUREMENTS, REALCONFIGS_DIR
from tests.e2e.conftest import celery_worker_process, wait_for  # noqa: F401  (fixture)
from tests.factories import make_watch
from tests.receiver import receiver  # noqa: F401  (fixture)

pytestmark = [pytest.mark.e2e]

REPO = "acme-ai/Acme-LLM-7B"  # the repo of the documented payload fixtures


@pytest.fixture
def hub_env(monkeypatch, fake_hub):
    """HF_ENDPOINT at the fake Hub, set before the worker starts (it inherits it)."""
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return fake_hub


def test_signed_hub_webhook_runs_one_job_and_notifies_the_subscriber(
    hub_env,
    receiver,  # noqa: F811
    celery_worker_process,  # noqa: F811
):
    # The watch's job options keep the measured stages short (the defaults sweep to batch 64
    # and run stability for 20 s); the worker creates the job, so they must come from the row.
    make_watch(
        name="acme",
        kind=HubKind.HUGGINGFACE,
        endpoint="",
        author="acme-ai",
        job_options=QUICK_MEASUREMENTS,
    )
    endpoint, secret = webhook_endpoint_create(
        name="hub", kind=WebhookKind.HUGGINGFACE, quiet_period_s=1
    )
    team = Team.objects.create(name="release-eng")
    _, signing_secret = subscription_create(
        team=team,
        name="release-bot",
        url=receiver.url("/day0"),
        format="generic",
        events=["job.succeeded", "job.failed"],
        allow_private_network=True,  # the receiver is on loopback
    )
    config = (REALCONFIGS_DIR / "openai__gpt-oss-20b.json").read_bytes()
    first = hub_env.add_repo(REPO, {"README.md": b"# Acme LLM 7B (gpt-oss-20b config)\n"})
    last = hub_env.add_repo(
        REPO, {"README.md": b"# Acme LLM 7B (gpt-oss-20b config)\n", "config.json": config}
    )
    client = Client()

    for sha in (first, last, last):  # two commits of one upload, then the Hub repeating one
        response = client.post(
            webhook_url_path(endpoint),
            data=hub_body("repo_content_update_main", headSha=sha),
            content_type="application/json",
            headers={"X-Webhook-Secret": secret},
        )
        assert response.status_code == 202, response.json()
    assert AdaptationJob.objects.count() == 0  # answered before any job or stage

    wait_for(
        lambda: NotificationDelivery.objects.filter(status="delivered").exists(),
        timeout_s=240,
        worker=celery_worker_process,
        what="the job to finish and its notification to be delivered",
    )

    job = AdaptationJob.objects.get()
    assert (job.release.repo_id, job.release.revision, job.trigger) == (REPO, last, "webhook")
    assert job.status == JobStatus.SUCCEEDED
    assert job.options["stability"]["duration_s"] == QUICK_MEASUREMENTS["stability"]["duration_s"]
    assert {run.status for run in job.stage_runs.all()} == {StageStatus.SUCCEEDED}
    assert WebhookDelivery.objects.filter(verdict="coalescing").count() == 3

    [request] = receiver.requests
    assert request.path == "/day0"
    payload = Webhook(signing_secret).verify(request.body, request.headers)
    assert payload["type"] == "job.succeeded"
    assert payload["data"]["job"]["id"] == job.pk
    assert payload["data"]["release"]["repo_id"] == REPO
    assert [s["name"] for s in payload["data"]["stages"]] == job.stages
