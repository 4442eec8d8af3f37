"""`POST /webhooks/generic/<id>`: Standard Webhooks signatures (signed here with the
`standardwebhooks` library's own `sign`), the body's checks, and `webhook-id` idempotency,
concurrent repeats included."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    AllowedHubEndpoint,
    DeliveryVerdict,
    HubKind,
    ModelRelease,
    WebhookDelivery,
)
from adaptation.secrets import secret_encrypt
from tests.adaptation.webhooks.conftest import post_generic, signed_headers
from tests.factories import make_release, make_watch

pytestmark = pytest.mark.django_db

SHA = "3c1e4f2a9b8d7c6e5f4a3b2c1d0e9f8a7b6c5d4e"
REQUEST = {"repo_id": "acme-ai/Acme-LLM-7B", "revision": SHA}


def test_a_signed_request_starts_a_job(client, generic_endpoint, sent, settings):
    settings.DAY0_PUBLIC_URL = "https://day0.example.com"  # where people reach the pages
    response = post_generic(client, generic_endpoint, REQUEST)

    assert response.status_code == 202
    answer = response.json()
    job = AdaptationJob.objects.get()
    release = job.release
    assert answer == {
        "delivery": WebhookDelivery.objects.get().pk,
        "verdict": "accepted",
        "reason": answer["reason"],
        "release": release.pk,
        "job": job.pk,
        "job_url": f"https://day0.example.com/releases/{release.pk}/#job-{job.pk}",
    }
    assert (release.repo_id, release.revision) == (REQUEST["repo_id"], SHA)
    assert (release.hub_kind, release.hub_endpoint) == (
        HubKind.HUGGINGFACE,
        "https://huggingface.co",
    )
    assert release.found_by == "webhook" and job.trigger == "webhook"
    assert job.pool.name == "cpu"  # DAY0_DEFAULT_POOL
    delivery = WebhookDelivery.objects.get()
    assert (delivery.verdict, delivery.status_code, delivery.job) == ("accepted", 202, job)
    assert delivery.idempotency_key == delivery.delivery_id == "msg_2xQ9"
    assert delivery.event == "adapt"
    assert "webhook-signature" not in {h.lower() for h in delivery.headers}
    assert "webhook-id" in {h.lower() for h in delivery.headers}
    assert sent.stages == []  # queued only once the transaction commits


def test_the_first_stage_is_queued_after_commit(
    client, generic_endpoint, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = post_generic(client, generic_endpoint, REQUEST)
    assert response.status_code == 202
    assert [m["stage"] for m in sent.stages] == ["fetch"]


def test_stages_options_pool_and_hub_url_are_taken(client, generic_endpoint, sent):
    gpu = AcceleratorPool.objects.create(
        name="h200", backend="cuda", device="cuda", accelerator="h200", queue="pool.h200"
    )
    # A hub URL is taken when it is a configured hub (here on the admin's allow-list).
    AllowedHubEndpoint.objects.create(url="https://hub.internal.example")
    payload = {
        **REQUEST,
        "hub": "https://hub.internal.example/",
        "pool": "h200",
        "stages": ["analyze", "fetch", "plan"],  # run in the registry's order
        "options": {"plan": {"context_tokens": 8192}},
        "note": "unknown keys are ignored",
    }
    response = post_generic(client, generic_endpoint, payload)

    assert response.status_code == 202, response.json()
    job = AdaptationJob.objects.get()
    assert job.pool == gpu
    assert job.stages == ["fetch", "analyze", "plan"]
    assert job.options["plan"]["context_tokens"] == 8192
    assert job.release.hub_endpoint == "https://hub.internal.example"


@pytest.mark.parametrize(
    "hub", ["http://169.254.169.254", "http://127.0.0.1:6379", "https://attacker.example/"]
)
def test_a_hub_url_day0_does_not_read_is_refused(client, generic_endpoint, sent, hub):
    """A sender cannot point the worker (and its HF_TOKEN) at an arbitrary URL."""
    response = post_generic(client, generic_endpoint, {**REQUEST, "hub": hub})

    assert response.status_code == 400
    assert "is not a hub this day0 reads" in response.json()["reason"]
    assert "https://huggingface.co" in response.json()["reason"]
    assert not AdaptationJob.objects.exists() and sent.stages == []


def test_a_hub_watch_name_gives_its_hub_and_pool(client, generic_endpoint, sent, tmp_path):
    gpu = AcceleratorPool.objects.create(
        name="mi300", backend="manifest", accelerator="mi300x", queue="pool.mi300"
    )
    watch = make_watch(name="mirror", kind=HubKind.MIRROR, endpoint=str(tmp_path), pool=gpu)
    response = post_generic(client, generic_endpoint, {**REQUEST, "hub": "mirror"})

    assert response.status_code == 202, response.json()
    job = AdaptationJob.objects.get()
    assert job.pool == gpu
    assert (job.release.hub_kind, job.release.hub_endpoint) == (HubKind.MIRROR, str(tmp_path))
    assert job.release.watch == watch


def test_a_watch_gives_its_job_options_unless_the_body_has_some(client, generic_endpoint, sent):
    make_watch(
        name="acme",
        kind=HubKind.HUGGINGFACE,
        endpoint="",
        job_options={"plan": {"context_tokens": 4096}, "stability": {"duration_s": 5}},
    )
    watch_options = post_generic(
        client, generic_endpoint, {**REQUEST, "hub": "acme", "stages": ["fetch", "analyze", "plan"]}
    )
    own_options = post_generic(
        client,
        generic_endpoint,
        {**REQUEST, "hub": "acme", "options": {"plan": {"context_tokens": 2048}}},
        msg_id="msg_own",
    )

    assert (watch_options.status_code, own_options.status_code) == (202, 202)
    first, second = AdaptationJob.objects.order_by("pk")
    # Only the stages the job runs: the watch's stability options are left out.
    assert set(first.options) == {"plan"} and first.options["plan"]["context_tokens"] == 4096
    assert set(second.options) == {"plan"} and second.options["plan"]["context_tokens"] == 2048


def test_a_known_release_gets_a_new_job(client, generic_endpoint, sent):
    release = make_release(repo_id=REQUEST["repo_id"], revision=SHA)
    response = post_generic(client, generic_endpoint, REQUEST)

    assert response.status_code == 202
    assert response.json()["release"] == release.pk
    assert ModelRelease.objects.count() == 1 and AdaptationJob.objects.count() == 1


# --- signatures --------------------------------------------------------------------------------


def test_a_bad_signature_gets_401_and_no_job(client, generic_endpoint, sent):
    body = json.dumps(REQUEST).encode()
    headers = signed_headers("whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY", body)
    response = client.post(
        generic_endpoint.url, data=body, content_type="application/json", headers=headers
    )

    assert response.status_code == 401
    assert (
        response.json()["reason"]
        == "Standard Webhooks signature refused: No matching signature found"
    )
    assert AdaptationJob.objects.count() == 0
    delivery = WebhookDelivery.objects.get()
    assert (delivery.verdict, delivery.idempotency_key) == (DeliveryVerdict.REJECTED, None)


def test_a_body_changed_after_signing_gets_401(client, generic_endpoint, sent):
    body = json.dumps(REQUEST).encode()
    headers = signed_headers(generic_endpoint.secret, body)
    tampered = body.replace(b"Acme-LLM-7B", b"Acme-LLM-8B")
    response = client.post(
        generic_endpoint.url, data=tampered, content_type="application/json", headers=headers
    )
    assert response.status_code == 401 and AdaptationJob.objects.count() == 0


def test_a_timestamp_six_minutes_old_gets_401(client, generic_endpoint, sent):
    stale = datetime.now(tz=UTC) - timedelta(minutes=6)
    response = post_generic(client, generic_endpoint, REQUEST, at=stale)

    assert response.status_code == 401
    assert response.json()["reason"].endswith("Message timestamp too old")
    assert AdaptationJob.objects.count() == 0


def test_a_timestamp_four_minutes_old_is_accepted(client, generic_endpoint, sent):
    recent = datetime.now(tz=UTC) - timedelta(minutes=4)
    assert post_generic(client, generic_endpoint, REQUEST, at=recent).status_code == 202


@pytest.mark.parametrize("drop", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_a_missing_signature_header_gets_401(client, generic_endpoint, sent, drop):
    body = json.dumps(REQUEST).encode()
    headers = signed_headers(generic_endpoint.secret, body)
    del headers[drop]
    response = client.post(
        generic_endpoint.url, data=body, content_type="application/json", headers=headers
    )
    assert response.status_code == 401
    assert AdaptationJob.objects.count() == 0


def test_a_malformed_signature_header_gets_401(client, generic_endpoint, sent):
    body = json.dumps(REQUEST).encode()
    headers = {**signed_headers(generic_endpoint.secret, body), "webhook-signature": "garbage"}
    response = client.post(
        generic_endpoint.url, data=body, content_type="application/json", headers=headers
    )
    assert response.status_code == 401


def test_an_undecryptable_secret_is_a_500_saying_so(client, generic_endpoint, sent, settings):
    generic_endpoint.row.secret_ciphertext = secret_encrypt("whsec_x")
    generic_endpoint.row.save()
    settings.DAY0_SECRETS_KEY = "another key entirely"
    response = post_generic(client, generic_endpoint, REQUEST)

    assert response.status_code == 500
    assert "cannot be decrypted" in response.json()["reason"]


# --- idempotency -----------------------------------------------------------------------------


def test_the_same_webhook_id_twice_makes_one_job(client, generic_endpoint, sent):
    first = post_generic(client, generic_endpoint, REQUEST, msg_id="msg_once")
    again = post_generic(client, generic_endpoint, REQUEST, msg_id="msg_once")

    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["verdict"] == "duplicate"
    assert again.json()["job"] == first.json()["job"]
    assert again.json()["first_delivery"] == first.json()["delivery"]
    assert AdaptationJob.objects.count() == 1
    duplicate = WebhookDelivery.objects.get(pk=again.json()["delivery"])
    assert (duplicate.verdict, duplicate.idempotency_key) == ("duplicate", None)
    assert duplicate.job_id == first.json()["job"]


def test_a_new_webhook_id_is_a_new_request(client, generic_endpoint, sent):
    post_generic(client, generic_endpoint, REQUEST, msg_id="msg_a")
    post_generic(client, generic_endpoint, REQUEST, msg_id="msg_b")
    assert AdaptationJob.objects.count() == 2 and ModelRelease.objects.count() == 1


def test_a_rejected_request_does_not_claim_its_id(client, generic_endpoint, sent):
    bad = post_generic(client, generic_endpoint, {**REQUEST, "pool": "nope"}, msg_id="msg_fix")
    fixed = post_generic(client, generic_endpoint, REQUEST, msg_id="msg_fix")
    assert (bad.status_code, fixed.status_code) == (400, 202)
    assert AdaptationJob.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_repeats_of_one_webhook_id_make_one_job(generic_endpoint, sent):
    body = json.dumps(REQUEST).encode()
    headers = signed_headers(generic_endpoint.secret, body, msg_id="msg_race")
    senders = 6
    barrier = threading.Barrier(senders)
    answers: list[tuple[int, dict]] = []
    errors: list[BaseException] = []

    def send() -> None:
        try:
            barrier.wait(timeout=10)
            response = Client().post(
                generic_endpoint.url, data=body, content_type="application/json", headers=headers
            )
            answers.append((response.status_code, response.json()))
        except BaseException as exc:  # reported below; a thread cannot fail the test itself
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert sorted(status for status, _ in answers) == [200] * (senders - 1) + [202]
    jobs = {answer["job"] for _, answer in answers}
    assert len(jobs) == 1 and AdaptationJob.objects.count() == 1
    assert WebhookDelivery.objects.count() == senders
    assert WebhookDelivery.objects.filter(idempotency_key="msg_race").count() == 1
    assert len(sent.stages) == 1  # the losers' jobs rolled back, their messages never sent


# --- the body's checks ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"revision": SHA}, "repo_id must be a Hub repo id: org/name"),
        ({**REQUEST, "repo_id": "no-org"}, "repo_id must be a Hub repo id: org/name"),
        ({**REQUEST, "repo_id": "a/b/c"}, "repo_id must be a Hub repo id: org/name"),
        # The whole id must match: no trailing newline, ASCII only, Hub rules.
        ({**REQUEST, "repo_id": "acme-ai/Acme-LLM-7B\n"}, "repo_id must be a Hub repo id"),
        ({**REQUEST, "repo_id": "acme-ai/Café-7B"}, "repo_id must be a Hub repo id"),
        ({**REQUEST, "repo_id": "acme-ai/-Acme"}, "repo_id must be a Hub repo id"),
        ({**REQUEST, "repo_id": "acme-ai/Acme--7B"}, "repo_id must be a Hub repo id"),
        ({**REQUEST, "repo_id": f"acme-ai/{'x' * 97}"}, "repo_id must be a Hub repo id"),
        ({**REQUEST, "revision": ""}, "revision must be a non-empty string"),
        ({**REQUEST, "revision": "x" * 129}, "revision must be at most 128 chars"),
        ({**REQUEST, "revision": 7}, "revision must be a non-empty string"),
        ({**REQUEST, "pool": "tpu"}, "No enabled pool 'tpu'; enabled pools: cpu"),
        ({**REQUEST, "stages": ["fetch", "dance"]}, "Unknown stage 'dance'; known stages: fetch,"),
        ({**REQUEST, "stages": ["plan"]}, "plan needs analyze: add what it needs"),
        ({**REQUEST, "stages": []}, "stages must be a non-empty list"),
        ({**REQUEST, "options": {"fetch": {"x": 1}}}, "fetch options: the fetch stage takes no"),
        ({**REQUEST, "options": [1]}, "options must map stage names"),
        ({**REQUEST, "hub": "ftp://hub"}, "is not an http(s) URL with a host"),
        ({**REQUEST, "hub": "no-such-watch"}, "neither an http(s) URL nor a hub watch"),
        ([REQUEST], "body must be a JSON object"),
    ],
)
def test_a_request_day0_cannot_run_gets_400_naming_why(
    client, generic_endpoint, sent, payload, reason
):
    response = post_generic(client, generic_endpoint, payload)

    assert response.status_code == 400
    assert response.json()["verdict"] == "rejected"
    assert reason in response.json()["reason"]
    assert AdaptationJob.objects.count() == 0
    assert WebhookDelivery.objects.get().verdict == DeliveryVerdict.REJECTED


def test_a_body_that_is_not_json_gets_400_after_the_signature(client, generic_endpoint, sent):
    body = b'{"repo_id": '
    headers = signed_headers(generic_endpoint.secret, body)
    response = client.post(
        generic_endpoint.url, data=body, content_type="application/json", headers=headers
    )
    assert response.status_code == 400
    assert response.json()["reason"].startswith("body is not valid JSON")


def test_json_nested_too_deeply_gets_400_and_is_stored(client, generic_endpoint, sent):
    body = b"[" * 100_000 + b"]" * 100_000
    headers = signed_headers(generic_endpoint.secret, body)
    response = client.post(
        generic_endpoint.url, data=body, content_type="application/json", headers=headers
    )

    assert response.status_code == 400
    assert response.json()["reason"] == "body is not valid JSON: nested too deeply"
    delivery = WebhookDelivery.objects.get()
    assert (delivery.status_code, delivery.verdict) == (400, DeliveryVerdict.REJECTED)
    assert delivery.body_bytes == body  # signed: kept whole, as received
    assert AdaptationJob.objects.count() == 0


def test_a_bad_signature_keeps_only_the_first_kib_of_the_body(client, generic_endpoint, sent):
    body = json.dumps({**REQUEST, "padding": "x" * 4000}).encode()
    headers = signed_headers("whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY", body)  # another key
    response = client.post(
        generic_endpoint.url, data=body, content_type="application/json", headers=headers
    )

    assert response.status_code == 401
    delivery = WebhookDelivery.objects.get()
    assert delivery.body_bytes == body[:1024]
    assert "[body_truncated: the sender was not authenticated" in delivery.reason
