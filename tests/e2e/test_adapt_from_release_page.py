"""End to end: an engineer starts a job from a release's page ("Adapt on pool…") and a real
Celery worker process runs it. The job is narrowed to fetch and analyze for speed (the form's
view is the one under test; the stages are the pipeline test's)."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from adaptation.models import AdaptationJob, HubKind, JobStatus, StageStatus
from adaptation.roles import ENGINEER, role_grant
from adaptation.services.releases import release_get_or_create
from adaptation.views import adapt as adapt_view
from engine.hubs import HubSpec, hub_source
from tests.conftest import REALCONFIGS_DIR
from tests.e2e.conftest import wait_for
from tests.factories import cpu_pool

pytestmark = [pytest.mark.e2e]

REPO = "meta-llama/Llama-3.1-8B"
STAGES = ("fetch", "analyze")


@pytest.fixture
def mirror_release(tmp_path):
    folder = tmp_path / "mirror" / REPO
    folder.mkdir(parents=True)
    config = (REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json").read_bytes()
    (folder / "config.json").write_bytes(config)
    root = str(tmp_path / "mirror")
    candidate = hub_source(HubSpec(kind=HubKind.MIRROR, endpoint=root)).latest_release(REPO)
    release, _ = release_get_or_create(
        hub_kind=HubKind.MIRROR,
        hub_endpoint=root,
        repo_id=REPO,
        revision=candidate.revision,
        published_at=None,
        found_by="manual",
    )
    return release


@pytest.fixture
def fetch_and_analyze_only(monkeypatch) -> list[dict]:
    """The view's jobs run fetch and analyze only (the options of other stages left out);
    returns the options the view asked for, one entry per job."""
    create = adapt_view.job_create
    asked: list[dict] = []

    def job_create(*, options=None, **kwargs):
        asked.append(options or {})
        kept = {name: value for name, value in (options or {}).items() if name in STAGES}
        return create(stages=list(STAGES), options=kept or None, **kwargs)

    monkeypatch.setattr(adapt_view, "job_create", job_create)
    return asked


def test_a_job_started_from_the_release_page_runs_on_a_worker(
    celery_worker_process, mirror_release, client, django_user_model, fetch_and_analyze_only
):
    release = mirror_release
    pool = cpu_pool()
    eli = django_user_model.objects.create_user(username="eli")
    role_grant(user=eli, role=ENGINEER)
    client.force_login(eli)
    page = client.get(reverse("adaptation:release_detail", args=[release.pk]))
    assert 'name="adapt-pool"' in page.content.decode()

    response = client.post(
        reverse("adaptation:release_adapt", args=[release.pk]),
        {
            "adapt-pool": pool.name,
            "adapt-context": "4096",
            "adapt-concurrency": "2",
            "adapt-options": json.dumps({"plan": {"dtype": "bfloat16"}}),
        },
    )
    assert response.status_code == 302, response.context["adapt_form"].errors
    job = AdaptationJob.objects.get(release=release)
    assert response["Location"].endswith(f"#job-{job.pk}")
    [asked] = fetch_and_analyze_only
    assert asked["plan"] == {"context_tokens": 4096, "concurrency": 2, "dtype": "bfloat16"}

    def done() -> bool:
        job.refresh_from_db()
        return job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED)

    wait_for(done, timeout_s=180, worker=celery_worker_process, what=f"job {job.pk} to end")
    runs = {run.stage: run for run in job.stage_runs.all()}
    assert job.status == JobStatus.SUCCEEDED, {s: r.error for s, r in runs.items()}
    assert runs["fetch"].status == StageStatus.SUCCEEDED
    assert runs["analyze"].status == StageStatus.SUCCEEDED
    assert runs["analyze"].worker_host.startswith("e2e-")
    assert runs["analyze"].result["total_params"] == 8_030_261_248
    assert job.requested_by == eli

    page = client.get(response["Location"].split("#")[0]).content.decode()
    assert f'id="job-{job.pk}"' in page
