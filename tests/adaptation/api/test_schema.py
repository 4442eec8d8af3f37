"""The OpenAPI schema: valid without a warning, and every GET operation's answers conform
to it (schemathesis, generating requests from the schema against the app in-process on a
seeded database)."""

from __future__ import annotations

import pytest
import schemathesis
from django.contrib.staticfiles import finders
from django.core.handlers.wsgi import WSGIHandler
from django.core.management import call_command
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests import dom

pytestmark = pytest.mark.django_db


def test_the_schema_validates_without_warnings(tmp_path):
    """`manage.py spectacular --validate --fail-on-warn`: OpenAPI 3 valid, and every view
    and field typed (an untyped one is a warning, which fails this)."""
    out = tmp_path / "schema.yml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    text = out.read_text()
    assert text.startswith("openapi: 3.0.3")
    for path in (
        "/api/v1/releases/{id}/:",
        "/api/v1/jobs/{id}/cancel/:",
        "/api/v1/jobs/{id}/stages/{stage}/rerun/:",
        "/api/v1/stages/:",
        "/api/v1/pools/{id}/:",
        "/api/v1/webhook-endpoints/{id}/:",
        "/api/v1/suite-runs/{id}/:",
        "/api/v1/plans/:",
    ):
        assert f"\n  {path}\n" in text, path


def test_the_docs_page_serves_swagger_ui_from_this_server(cast, client):
    """No CDN: Swagger UI's files come from drf-spectacular-sidecar, as static files."""
    client.force_login(cast.mona)
    response = client.get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    bundle = "drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js"
    assert f"/static/{bundle}" in html
    assert finders.find(bundle) is not None
    linked = [el.get("src") or el.get("href") for el in dom.find_all(html, "[src], [href]")]
    assert not [url for url in linked if url.startswith(("http://", "https://"))]
    # No inline script (the Content-Security-Policy runs none): the start script, which names
    # the schema, comes from the docs URL itself.
    scripts = dom.find_all(html, "script")
    assert scripts and all(script.attrs and not script.raw_text for script in scripts)
    assert '<script src="/api/docs/?script="></script>' in html
    script = client.get("/api/docs/?script=")
    assert script["Content-Type"].startswith("application/javascript")
    assert '"/api/schema/"' in script.content.decode()


def test_the_docs_page_sends_signed_out_browsers_to_login(client):
    response = client.get("/api/docs/")
    assert response.status_code == 302 and response.url == "/accounts/login/?next=/api/docs/"


@pytest.fixture
def wsgi_app():
    """day0's WSGI app, called in this process on the test's database: as Django's test
    client does, a request must not close the connection holding the test's
    transaction."""
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield WSGIHandler()
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


# Every GET operation the schema must document, and the id each detail path is tried with
# (besides generated ones), so that its 200 body is checked too.
GET_PATHS = {
    "/api/v1/releases/",
    "/api/v1/releases/{id}/",
    "/api/v1/jobs/",
    "/api/v1/jobs/{id}/",
    "/api/v1/stages/",
    "/api/v1/stages/{id}/",
    "/api/v1/pools/",
    "/api/v1/pools/{id}/",
    "/api/v1/webhook-endpoints/",
    "/api/v1/webhook-endpoints/{id}/",
    "/api/v1/suite-runs/",
    "/api/v1/suite-runs/{id}/",
}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def test_get_answers_conform_to_the_schema(cast, seeded, wsgi_app):
    """Every GET operation, with generated filters, orderings, pages and ids (and a real id
    for each detail): never a 500, and each answer's status, content type and body as the
    schema documents them. Run as an admin, who may read every operation."""
    from adaptation.models import StageRun
    from adaptation.services.suites import suite_start
    from adaptation.webhooks.endpoints import webhook_endpoint_create

    endpoint, _ = webhook_endpoint_create(name="hub", kind="huggingface", pool=seeded.h200)
    suite_run = suite_start(pool=seeded.cpu, trigger="manual", stages=["fetch"])
    real_ids = {
        "/api/v1/releases/{id}/": seeded.deepseek.pk,
        "/api/v1/jobs/{id}/": seeded.qwen_failed.pk,
        "/api/v1/stages/{id}/": StageRun.objects.filter(job=seeded.llama_done).first().pk,
        "/api/v1/pools/{id}/": seeded.h200.pk,
        "/api/v1/webhook-endpoints/{id}/": str(endpoint.pk),
        "/api/v1/suite-runs/{id}/": suite_run.pk,
    }
    headers = {"Authorization": f"Token {cast.token('ada')}"}
    api_schema = schemathesis.openapi.from_wsgi("/api/schema/", wsgi_app, headers=headers)
    checked: list[str] = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        if operation.method.upper() != "GET":
            continue
        variants = [None]
        if operation.path in real_ids:
            variants.insert(0, {"id": real_ids[operation.path]})
        for path_parameters in variants:
            strategy = operation.as_strategy(path_parameters=path_parameters, headers=headers)

            @given(case=strategy)
            @settings(
                max_examples=10,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def conforms(case):
                case.call_and_validate(headers=headers, checks=CHECKS)

            conforms()
        checked.append(operation.path)
    assert set(checked) == GET_PATHS


def test_the_schema_lists_each_lists_orderings(cast):
    schema = cast.api("mona").get("/api/schema/", {"format": "json"}).json()
    (ordering,) = [
        p
        for p in schema["paths"]["/api/v1/releases/"]["get"]["parameters"]
        if p["name"] == "ordering"
    ]
    assert ordering["schema"]["items"]["enum"] == [
        "discovered_at", "-discovered_at", "published_at", "-published_at",
        "repo_id", "-repo_id", "id", "-id",
    ]  # fmt: skip
    assert (ordering["style"], ordering["explode"]) == ("form", False)  # comma-separated


def test_the_schema_documents_allow_duplicate_and_the_409_of_a_job_create(cast):
    schema = cast.api("mona").get("/api/schema/", {"format": "json"}).json()
    create = schema["paths"]["/api/v1/jobs/"]["post"]
    body = create["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    field = schema["components"]["schemas"][body.rsplit("/", 1)[1]]["properties"]["allow_duplicate"]
    assert (field["type"], field["default"]) == ("boolean", False)
    assert "pending or running" in field["description"]
    conflict = create["responses"]["409"]
    assert "duplicate_job" in conflict["description"]
    assert conflict["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"
    }
