"""Who may call what in the API, walked with the named cast (`tests.cast`): anonymous
callers get 401 with `WWW-Authenticate: Token`, nina (no role) 403 everywhere, mona
(manager) reads everything but writes nothing, eli (engineer) also triggers, cancels and
re-runs, and only ada (admin) manages webhook endpoints."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from adaptation.models import AdaptationJob, StageRun

pytestmark = pytest.mark.django_db

CAST = [None, "nina", "mona", "eli", "ada"]


def read_urls(seeded) -> list[str]:
    run = StageRun.objects.filter(job=seeded.llama_done).first()
    return [
        "/api/v1/releases/",
        f"/api/v1/releases/{seeded.deepseek.pk}/",
        "/api/v1/jobs/",
        f"/api/v1/jobs/{seeded.llama_done.pk}/",
        "/api/v1/stages/",
        f"/api/v1/stages/{run.pk}/",
        "/api/v1/pools/",
        f"/api/v1/pools/{seeded.cpu.pk}/",
    ]


@pytest.mark.parametrize(
    ("who", "expected"), [(None, 401), ("nina", 403), ("mona", 200), ("eli", 200), ("ada", 200)]
)
def test_reads_need_a_role(cast, seeded, who, expected):
    api = cast.api(who)
    answers = {url: api.get(url) for url in read_urls(seeded)}
    assert {url: r.status_code for url, r in answers.items()} == dict.fromkeys(answers, expected)
    sample = answers["/api/v1/jobs/"]
    if expected == 401:
        assert sample["WWW-Authenticate"] == "Token"
        assert sample.json()["error"]["code"] == "not_authenticated"
    if expected == 403:
        assert sample.json()["error"] == {
            "code": "permission_denied",
            "message": "Your account does not have the adaptation.view_adaptationjob "
            "permission this needs.",
        }


@pytest.mark.parametrize(
    ("who", "expected"), [(None, 401), ("nina", 403), ("mona", 200), ("eli", 200), ("ada", 200)]
)
def test_the_schema_needs_a_caller_with_a_role(cast, who, expected):
    response = cast.api(who).get("/api/schema/")
    assert response.status_code == expected
    if expected == 200:
        assert response["Content-Type"].startswith("application/vnd.oai.openapi")


@pytest.mark.parametrize(("who", "expected"), [("nina", 403), ("mona", 200)])
def test_the_docs_page_needs_a_role_too(cast, client, who, expected):
    client.force_login(getattr(cast, who))
    assert client.get("/api/docs/").status_code == expected


@pytest.mark.parametrize(
    ("who", "expected"), [(None, 401), ("nina", 403), ("mona", 403), ("eli", 201), ("ada", 201)]
)
def test_only_engineers_and_admins_create_jobs(cast, seeded, who, expected):
    response = cast.api(who).post(
        "/api/v1/jobs/", {"release": seeded.qwen.pk, "pool": "cpu"}, format="json"
    )
    assert response.status_code == expected
    made = AdaptationJob.objects.filter(release=seeded.qwen, trigger="api").count()
    assert made == (1 if expected == 201 else 0)


@pytest.mark.parametrize(
    ("who", "expected"), [(None, 401), ("nina", 403), ("mona", 403), ("eli", 200), ("ada", 200)]
)
def test_only_engineers_and_admins_cancel(cast, seeded, who, expected):
    job = seeded.llama_running
    response = cast.api(who).post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.status_code == expected
    job.refresh_from_db()
    assert job.status == ("cancelled" if expected == 200 else "running")


@pytest.mark.parametrize(
    ("who", "expected"), [(None, 401), ("nina", 403), ("mona", 403), ("eli", 202), ("ada", 202)]
)
def test_only_engineers_and_admins_rerun(cast, seeded, who, expected):
    job = seeded.qwen_failed
    response = cast.api(who).post(f"/api/v1/jobs/{job.pk}/stages/fetch/rerun/")
    assert response.status_code == expected
    assert StageRun.objects.filter(job=job).count() == (4 if expected == 202 else 2)


def test_a_managers_refusal_names_the_permission(cast, seeded):
    response = cast.api("mona").post(f"/api/v1/jobs/{seeded.llama_running.pk}/cancel/")
    assert response.json() == {
        "error": {
            "code": "permission_denied",
            "message": "Your account does not have the adaptation.cancel_job permission "
            "this needs.",
        }
    }


def test_a_forbidden_caller_learns_nothing_of_a_missing_job(cast, seeded):
    """Permission is checked before the lookup: 403, not 404, for a manager."""
    assert cast.api("mona").post("/api/v1/jobs/999999/cancel/").status_code == 403
    assert cast.api("eli").post("/api/v1/jobs/999999/cancel/").status_code == 404


def test_session_callers_need_the_csrf_token_for_writes(cast, seeded):
    browser = APIClient(enforce_csrf_checks=True)
    browser.force_login(cast.eli)
    assert browser.get("/api/v1/jobs/").status_code == 200
    response = browser.post(
        "/api/v1/jobs/", {"release": seeded.qwen.pk, "pool": "cpu"}, format="json"
    )
    assert response.status_code == 403
    assert "CSRF" in response.json()["error"]["message"]
    assert not AdaptationJob.objects.filter(trigger="api").exists()
