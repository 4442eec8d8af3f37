"""`POST /webhooks/huggingface/<id>`: one test per documented Hub event kind, then the
secret, size, parsing, watch matching and duplicate rules, and what is stored."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import override_settings
from django.urls import reverse

from adaptation.models import (
    AdaptationJob,
    DeliveryVerdict,
    HubKind,
    PendingUpload,
    WebhookDelivery,
)
from adaptation.webhooks.huggingface import HubEvent, hub_event_triage
from tests.adaptation.webhooks.conftest import REPO, hub_body, hub_payload, post_hub
from tests.factories import make_job, make_release, make_watch

pytestmark = pytest.mark.django_db

MAIN_SHA = "5f1c0ffee0ddba11c0de5eedfacade0123456789"
CREATE_SHA = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567"


def only_delivery() -> WebhookDelivery:
    (delivery,) = WebhookDelivery.objects.all()
    return delivery


# --- one test per documented event kind -----------------------------------------------------


def test_content_update_on_main_opens_a_pending_upload(client, hub_endpoint, hub_watch, sent):
    response = post_hub(client, hub_endpoint, hub_body("repo_content_update_main"))

    assert response.status_code == 202
    answer = response.json()
    assert answer["verdict"] == "coalescing"
    assert answer["job"] is None and answer["release"] is None
    upload = PendingUpload.objects.get()
    assert answer["pending_upload"] == upload.pk
    assert (upload.repo_id, upload.revision, upload.status) == (REPO, MAIN_SHA, "waiting")
    assert upload.watch == hub_watch and upload.pool == hub_watch.pool
    assert upload.hub_endpoint == "https://huggingface.co"  # canonical: no HF_ENDPOINT here
    delivery = only_delivery()
    assert delivery.event == "repo.content/update"
    assert (delivery.repo_id, delivery.revision) == (REPO, MAIN_SHA)
    assert (delivery.status_code, delivery.verdict) == (202, DeliveryVerdict.COALESCING)
    assert "new content on refs/heads/main" in delivery.reason
    assert AdaptationJob.objects.count() == 0  # no job before the upload settles


def test_repo_create_counts_as_main_at_head_sha(client, hub_endpoint, hub_watch, sent):
    response = post_hub(client, hub_endpoint, hub_body("repo_create"))

    assert response.status_code == 202 and response.json()["verdict"] == "coalescing"
    assert PendingUpload.objects.get().revision == CREATE_SHA
    assert only_delivery().event == "repo/create"


def test_content_update_without_refs_counts_as_main(client, hub_endpoint, hub_watch, sent):
    response = post_hub(client, hub_endpoint, hub_body("repo_content_update_no_refs"))

    assert response.status_code == 202
    assert PendingUpload.objects.get().revision == MAIN_SHA


def test_update_on_another_ref_is_ignored(client, hub_endpoint, hub_watch, sent):
    response = post_hub(client, hub_endpoint, hub_body("repo_content_update_other_ref"))

    assert response.status_code == 200
    assert response.json()["verdict"] == "ignored"
    assert response.json()["reason"] == "updated refs/pr/3, not refs/heads/main"
    assert PendingUpload.objects.count() == 0
    assert only_delivery().verdict == DeliveryVerdict.IGNORED


def test_config_update_with_empty_updated_config_is_ignored(client, hub_endpoint, hub_watch, sent):
    response = post_hub(client, hub_endpoint, hub_body("repo_config_update_empty"))

    assert response.status_code == 200
    assert response.json()["verdict"] == "ignored"
    assert "empty updatedConfig" in response.json()["reason"]
    assert PendingUpload.objects.count() == 0


def test_repo_made_public_is_taken(client, hub_endpoint, hub_watch, sent):
    response = post_hub(client, hub_endpoint, hub_body("repo_config_made_public"))

    assert response.status_code == 202
    assert "repo made public" in response.json()["reason"]
    assert PendingUpload.objects.get().revision == MAIN_SHA


def test_dataset_repo_is_ignored(client, hub_endpoint, hub_watch, sent):
    response = post_hub(client, hub_endpoint, hub_body("dataset_content_update"))

    assert response.status_code == 200
    assert response.json()["reason"] == "acme-ai/acme-instruct is a dataset repo, not a model"
    assert PendingUpload.objects.count() == 0


@pytest.mark.parametrize(
    ("fixture", "event"),
    [
        ("discussion_create", "discussion/create"),
        ("discussion_comment_create", "discussion.comment/create"),
    ],
)
def test_discussion_and_comment_events_are_ignored(
    client, hub_endpoint, hub_watch, sent, fixture, event
):
    # Community events carry no headSha (the Hub sends it on repo scopes only): not needed.
    assert "headSha" not in hub_payload(fixture)["repo"]
    response = post_hub(client, hub_endpoint, hub_body(fixture))

    assert response.status_code == 200
    assert response.json()["verdict"] == "ignored"
    assert response.json()["reason"] == f"{event.split('/')[0]} events are not repo content"
    assert only_delivery().event == event


def test_repo_delete_is_ignored(client, hub_endpoint, hub_watch, sent):
    response = post_hub(client, hub_endpoint, hub_body("repo_delete"))

    assert response.status_code == 200
    assert response.json()["reason"] == "repo delete: no new content to adapt"
    assert PendingUpload.objects.count() == 0 and sent.settles == []


def test_narrower_unknown_scope_reads_as_an_update_of_the_broader_one():
    event = HubEvent(scope="repo.config.dois", action="create", repo_type="model", repo_name=REPO)
    assert (event.known_scope, event.known_action) == ("repo.config", "update")
    assert not hub_event_triage(event).take
    content = HubEvent(
        scope="repo.content.lfs", action="whatever", repo_type="model", repo_name=REPO
    )
    assert hub_event_triage(content).take


# --- the secret ----------------------------------------------------------------------------


@pytest.mark.parametrize("secret", ["", "not-the-secret"])
def test_wrong_or_missing_secret_gets_401_and_no_upload(
    client, hub_endpoint, hub_watch, sent, secret
):
    response = post_hub(client, hub_endpoint, hub_body("repo_content_update_main"), secret=secret)

    assert response.status_code == 401
    assert response.json()["verdict"] == "rejected"
    assert response.json()["reason"] == (
        "missing or wrong X-Webhook-Secret, or the server's DAY0_SECRETS_KEY/SECRET_KEY "
        "changed since the secret was made (rotate it)"
    )
    assert PendingUpload.objects.count() == 0 and sent.settles == []
    delivery = only_delivery()
    assert (delivery.status_code, delivery.verdict) == (401, DeliveryVerdict.REJECTED)
    assert delivery.event == ""  # nothing of an unauthenticated body is believed


def test_secret_is_checked_before_the_body_is_parsed(client, hub_endpoint, sent):
    response = post_hub(client, hub_endpoint, b"{not json", secret="wrong")
    assert response.status_code == 401  # not 400: the body was never parsed


def test_stored_headers_leave_out_secrets(client, hub_endpoint, hub_watch, sent):
    post_hub(
        client,
        hub_endpoint,
        hub_body("repo_content_update_main"),
        **{"X-Request-Id": "req-77", "Authorization": "Bearer x", "Cookie": "a=b"},
    )
    delivery = only_delivery()
    stored = {name.lower() for name in delivery.headers}
    assert "x-request-id" in stored and "content-type" in stored
    assert not stored & {"x-webhook-secret", "authorization", "cookie"}
    assert hub_endpoint.secret not in json.dumps(delivery.headers)
    assert delivery.delivery_id == "req-77"
    assert json.loads(delivery.body_bytes)["repo"]["name"] == REPO
    assert delivery.remote_addr == "127.0.0.1"
    hub_endpoint.row.refresh_from_db()
    assert hub_endpoint.row.last_delivery_at == delivery.received_at


# --- size, parsing, method, endpoint ----------------------------------------------------------


@override_settings(DAY0_WEBHOOK_MAX_BODY_BYTES=2048)
def test_body_over_the_limit_gets_413_and_is_stored_empty(client, hub_endpoint, hub_watch, sent):
    payload = hub_payload("repo_content_update_main")
    payload["padding"] = "x" * 4096
    response = post_hub(client, hub_endpoint, json.dumps(payload).encode())

    assert response.status_code == 413
    assert "over the 2048-byte limit" in response.json()["reason"]
    delivery = only_delivery()
    assert (delivery.status_code, delivery.body_bytes) == (413, b"")
    assert PendingUpload.objects.count() == 0


def test_a_body_longer_than_declared_limit_is_not_read_past_it(rf):
    from adaptation.webhooks.deliveries import BodyTooLarge, read_body

    request = rf.post("/", data=b"x" * 5000, content_type="application/octet-stream")
    request.META["CONTENT_LENGTH"] = ""  # undeclared: the read itself is bounded
    with pytest.raises(BodyTooLarge):
        read_body(request, limit_bytes=1024)
    small = rf.post("/", data=b"y" * 1024, content_type="application/octet-stream")
    assert read_body(small, limit_bytes=1024) == b"y" * 1024


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"event": {"scope": "repo.content"', "body is not valid JSON"),
        (b"[1, 2]", "body is not a JSON object"),
        (b'{"event": {"scope": "repo.content"}, "repo": {"type": "model", "name": "a/b"}}',
         "event.action is missing"),
        (b'{"event": {"scope": "repo", "action": "create"}, "repo": {"name": "a/b"}}',
         "repo.type is missing"),
        (b'{"event": {"scope": "repo", "action": "create"}, "repo": {"type": "model"}}',
         "repo.name is missing"),
    ],
)  # fmt: skip
def test_malformed_body_gets_400_with_the_reason(
    client, hub_endpoint, hub_watch, sent, body, reason
):
    response = post_hub(client, hub_endpoint, body)

    assert response.status_code == 400
    assert response.json()["verdict"] == "rejected"
    assert reason in response.json()["reason"]
    assert only_delivery().verdict == DeliveryVerdict.REJECTED


def test_content_event_without_head_sha_gets_400(client, hub_endpoint, hub_watch, sent):
    payload = hub_payload("repo_content_update_main")
    del payload["repo"]["headSha"]
    response = post_hub(client, hub_endpoint, json.dumps(payload).encode())

    assert response.status_code == 400
    assert "repo.headSha is required on repo.content/update events" in response.json()["reason"]


def test_unknown_fields_are_ignored(client, hub_endpoint, hub_watch, sent):
    payload = hub_payload("repo_content_update_main")
    payload["somethingNew"] = {"nested": [1, 2]}
    payload["event"]["extra"] = True
    response = post_hub(client, hub_endpoint, json.dumps(payload).encode())
    assert response.status_code == 202


def test_get_is_405_and_not_stored(client, hub_endpoint):
    response = client.get(hub_endpoint.url)
    assert response.status_code == 405 and response["Allow"] == "POST"
    assert WebhookDelivery.objects.count() == 0


def test_unknown_endpoint_or_other_kind_is_404(client, hub_endpoint, generic_endpoint):
    unknown = reverse("webhooks:huggingface", kwargs={"endpoint_id": uuid.uuid4()})
    assert client.post(unknown, data=b"{}", content_type="application/json").status_code == 404
    # A generic endpoint's id under the Hub's path does not exist either.
    other = reverse("webhooks:huggingface", kwargs={"endpoint_id": generic_endpoint.row.pk})
    assert client.post(other, data=b"{}", content_type="application/json").status_code == 404
    assert WebhookDelivery.objects.count() == 0


def test_disabled_endpoint_is_404_and_the_delivery_stored(client, hub_endpoint, hub_watch, sent):
    hub_endpoint.row.enabled = False
    hub_endpoint.row.save()
    response = post_hub(client, hub_endpoint, hub_body("repo_content_update_main"))

    assert response.status_code == 404
    assert PendingUpload.objects.count() == 0
    assert "disabled" in only_delivery().reason


def test_posting_is_csrf_exempt(hub_endpoint, hub_watch, sent):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    assert post_hub(strict, hub_endpoint, hub_body("repo_content_update_main")).status_code == 202


def test_a_path_that_is_not_an_endpoint_id_is_a_json_404(client):
    for path in (
        "/webhooks/huggingface/not-a-uuid",
        "/webhooks/generic/1/2",
        "/webhooks/generic/x",
    ):
        response = client.post(path, data=b"{}", content_type="application/json")
        assert response.status_code == 404, path
        assert response["Content-Type"] == "application/json"
        assert response.json()["verdict"] == "rejected"
    assert WebhookDelivery.objects.count() == 0


# --- what is kept of a delivery whose sender was not authenticated --------------------------

BIG_BODY = json.dumps({**hub_payload("repo_content_update_main"), "padding": "x" * 5000}).encode()


def test_a_wrong_secret_keeps_only_the_first_kib_of_the_body(client, hub_endpoint, hub_watch, sent):
    response = post_hub(client, hub_endpoint, BIG_BODY, secret="not-the-secret")

    assert response.status_code == 401
    delivery = only_delivery()
    assert delivery.body_bytes == BIG_BODY[:1024]
    assert delivery.reason.endswith(
        f"[body_truncated: the sender was not authenticated; the first 1024 of {len(BIG_BODY)} "
        "bytes are kept]"
    )
    assert "body_truncated" not in response.json()["reason"]  # the sender's answer is as before


def test_a_disabled_endpoint_keeps_only_the_first_kib_of_the_body(
    client, hub_endpoint, hub_watch, sent
):
    hub_endpoint.row.enabled = False
    hub_endpoint.row.save()
    assert post_hub(client, hub_endpoint, BIG_BODY).status_code == 404
    delivery = only_delivery()
    assert len(delivery.body_bytes) == 1024 and "body_truncated" in delivery.reason


def test_a_wrong_secret_keeps_only_the_first_headers(client, hub_endpoint, hub_watch, sent):
    many = {f"X-Filler-{n:03d}": "y" * 1000 for n in range(40)}
    post_hub(client, hub_endpoint, hub_body("repo_content_update_main"), secret="no", **many)

    delivery = only_delivery()
    stored = sum(len(name) + len(value) for name, value in delivery.headers.items())
    assert 0 < stored <= 4096
    assert "Content-Type" in delivery.headers  # the first ones are kept
    assert "[headers_truncated: the sender was not authenticated;" in delivery.reason


def test_an_authenticated_delivery_keeps_its_whole_body(client, hub_endpoint, hub_watch, sent):
    assert post_hub(client, hub_endpoint, BIG_BODY).status_code == 202
    delivery = only_delivery()
    assert delivery.body_bytes == BIG_BODY and "body_truncated" not in delivery.reason


# --- bodies a parser chokes on, repo names that are not repo ids -----------------------------


def test_json_nested_too_deeply_is_a_400_and_stored(client, hub_endpoint, hub_watch, sent):
    body = b"[" * 100_000 + b"]" * 100_000
    response = post_hub(client, hub_endpoint, body)

    assert response.status_code == 400
    assert response.json()["reason"] == (
        "malformed Hub webhook: body is not valid JSON: nested too deeply"
    )
    delivery = only_delivery()
    assert (delivery.status_code, delivery.verdict) == (400, DeliveryVerdict.REJECTED)
    assert response.json()["delivery"] == delivery.pk


@pytest.mark.parametrize(
    "name",
    [
        f"{REPO}\n",  # a trailing newline
        f" {REPO}",
        "acme-ai/Acme-LLM-7B-café",  # not ASCII
        "acme-ai/Acme..LLM",
        "acme-ai/Acme--LLM",
        "acme-ai/-Acme-LLM",
        "acme-ai/Acme-LLM.",
        "acme-ai/Acme-LLM.git",
        "acme-ai/" + "x" * 97,
        "Acme-LLM-7B",  # no org
        "acme-ai/a/b",
    ],
)
def test_a_repo_name_that_is_not_a_repo_id_gets_400_and_opens_no_upload(
    client, hub_endpoint, hub_watch, sent, name
):
    payload = hub_payload("repo_content_update_main")
    payload["repo"]["name"] = name
    response = post_hub(client, hub_endpoint, json.dumps(payload).encode())

    assert response.status_code == 400
    assert response.json()["reason"].startswith(
        "malformed Hub webhook: repo.name must be a Hub repo id: org/name"
    )
    assert PendingUpload.objects.count() == 0 and sent.settles == []
    assert only_delivery().verdict == DeliveryVerdict.REJECTED


@pytest.mark.parametrize(
    "name", ["acme-ai/Acme-LLM-7B", "acme-ai/acme_llm.v2", "acme-ai/" + "x" * 96]
)
def test_repo_ids_the_hub_allows_are_taken(client, hub_endpoint, hub_watch, sent, name):
    payload = hub_payload("repo_content_update_main")
    payload["repo"]["name"] = name
    response = post_hub(client, hub_endpoint, json.dumps(payload).encode())
    assert response.status_code == 202
    assert PendingUpload.objects.get().repo_id == name


# --- watches, pools, duplicates ------------------------------------------------------------


def test_repo_of_an_unwatched_org_is_ignored(client, hub_endpoint, sent):
    make_watch(name="other", kind=HubKind.HUGGINGFACE, endpoint="", author="someone-else")
    response = post_hub(client, hub_endpoint, hub_body("repo_content_update_main"))

    assert response.status_code == 200
    assert response.json()["reason"] == (
        f"{REPO} is not in a watched org or pattern (no enabled Hub watch)"
    )


def test_a_disabled_or_mirror_watch_does_not_count(client, hub_endpoint, sent):
    make_watch(name="off", kind=HubKind.HUGGINGFACE, endpoint="", author="acme-ai", enabled=False)
    make_watch(name="mirror", kind=HubKind.MIRROR, endpoint="/srv/hub", author="acme-ai")
    response = post_hub(client, hub_endpoint, hub_body("repo_content_update_main"))
    assert response.json()["verdict"] == "ignored"


def test_a_pattern_watch_matches_ignoring_case(client, hub_endpoint, sent):
    watch = make_watch(
        name="llms", kind=HubKind.HUGGINGFACE, endpoint="", repo_pattern="*/acme-llm-*"
    )
    response = post_hub(client, hub_endpoint, hub_body("repo_content_update_main"))

    assert response.status_code == 202
    assert PendingUpload.objects.get().watch == watch


def test_the_endpoint_pool_overrides_the_watch_pool(client, hub_endpoint, hub_watch, sent):
    from adaptation.models import AcceleratorPool

    gpu = AcceleratorPool.objects.create(
        name="h200", backend="cuda", device="cuda", accelerator="h200", queue="pool.h200"
    )
    hub_endpoint.row.pool = gpu
    hub_endpoint.row.save()
    post_hub(client, hub_endpoint, hub_body("repo_content_update_main"))
    assert PendingUpload.objects.get().pool == gpu


def test_the_release_hub_is_the_watch_canonical_endpoint(client, hub_endpoint, sent, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.internal:8080/")
    make_watch(name="acme", kind=HubKind.HUGGINGFACE, endpoint="", author="acme-ai")
    post_hub(client, hub_endpoint, hub_body("repo_content_update_main"))
    assert PendingUpload.objects.get().hub_endpoint == "http://hub.internal:8080"


def test_a_revision_that_is_a_release_already_is_a_duplicate(client, hub_endpoint, hub_watch, sent):
    release = make_release(repo_id=REPO, revision=MAIN_SHA, hub_endpoint="https://huggingface.co")
    job = make_job(release=release)
    response = post_hub(client, hub_endpoint, hub_body("repo_content_update_main"))

    assert response.status_code == 200
    answer = response.json()
    assert (answer["verdict"], answer["release"], answer["job"]) == (
        "duplicate",
        release.pk,
        job.pk,
    )
    assert answer["job_url"].endswith(f"/releases/{release.pk}/#job-{job.pk}")
    assert PendingUpload.objects.count() == 0
    assert AdaptationJob.objects.count() == 1
    assert only_delivery().job == job


def test_the_same_delivery_twice_joins_one_upload(
    client, hub_endpoint, hub_watch, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        first = post_hub(client, hub_endpoint, hub_body("repo_content_update_main"))
        again = post_hub(client, hub_endpoint, hub_body("repo_content_update_main"))

    assert first.json()["pending_upload"] == again.json()["pending_upload"]
    upload = PendingUpload.objects.get()
    assert (upload.deliveries, upload.revision) == (2, MAIN_SHA)
    assert len(sent.settles) == 1  # one settle chain per upload, not one per delivery
    assert AdaptationJob.objects.count() == 0


def test_the_settle_is_queued_after_commit_for_the_quiet_period(
    client, hub_endpoint, hub_watch, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        post_hub(client, hub_endpoint, hub_body("repo_content_update_main"))
    assert sent.settles == []  # nothing leaves before the transaction commits
    for callback in callbacks:
        callback()
    upload = PendingUpload.objects.get()
    assert sent.settles == [{"args": [upload.pk], "countdown": 60.0}]


def test_with_no_quiet_period_the_job_still_waits_for_the_settle_task(
    client, hub_endpoint, hub_watch, sent, django_capture_on_commit_callbacks
):
    hub_endpoint.row.quiet_period_s = 0
    hub_endpoint.row.save()
    with django_capture_on_commit_callbacks(execute=True):
        response = post_hub(client, hub_endpoint, hub_body("repo_content_update_main"))

    assert response.status_code == 202
    assert sent.settles == [{"args": [PendingUpload.objects.get().pk], "countdown": 0.0}]
    assert AdaptationJob.objects.count() == 0 and sent.stages == []
