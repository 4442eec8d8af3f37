"""Hostile bytes on both webhook endpoints: NUL characters and lone
surrogates in every string of a valid body (JSON escapes `\\u0000`, `\\ud800`), raw NUL
bytes, invalid UTF-8 and bodies at and over the size limit.

Each delivery is answered 4xx with a JSON reason or taken as usual, never 5xx, and stored
with the exact bytes received (the first KiB when the sender was not authenticated).
Signatures and secrets are still checked over the raw body first. CI runs this on
PostgreSQL, whose text columns refuse NUL (the `psycopg.DataError` the trial found) and
whose driver cannot encode a lone surrogate (the `UnicodeEncodeError`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from adaptation.models import (
    AdaptationJob,
    DeliveryVerdict,
    HubKind,
    PendingUpload,
    WebhookDelivery,
    WebhookKind,
)
from adaptation.webhooks.endpoints import webhook_endpoint_create
from tests.adaptation.webhooks.conftest import Endpoint, hub_payload, signed_headers
from tests.factories import cpu_pool, make_watch

pytestmark = pytest.mark.django_db

SHA = "5f1c0ffee0ddba11c0de5eedfacade0123456789"
# A generic request using every field it may have, one free field included.
GENERIC = {
    "repo_id": "acme-ai/Acme-LLM-7B",
    "revision": SHA,
    "hub": "acme",
    "pool": "cpu",
    "stages": ["fetch", "analyze", "plan"],
    "options": {"plan": {"context_tokens": 8192}},
    "note": "free text is ignored",
}
HOSTILE = {"nul": "\u0000", "surrogate": "\ud800"}
# The Hub payload fields the receiver reads; invalid text there is a 400.
HUB_FIELDS_READ = ("$.event.", "$.repo.type", "$.repo.name", "$.repo.headSha", "$.updatedRefs")


@pytest.fixture
def client() -> Client:
    """A client that answers a server error as a 500 (instead of raising it into the test),
    so a test sees exactly what a sender would."""
    return Client(raise_request_exception=False)


@pytest.fixture
def generic(queued) -> Endpoint:
    cpu_pool()
    make_watch(name="acme", kind=HubKind.HUGGINGFACE, endpoint="", author="acme-ai")
    return Endpoint(*webhook_endpoint_create(name="ci", kind=WebhookKind.GENERIC))


@pytest.fixture
def hub(queued) -> Endpoint:
    cpu_pool()
    make_watch(name="acme", kind=HubKind.HUGGINGFACE, endpoint="", author="acme-ai")
    return Endpoint(*webhook_endpoint_create(name="hub", kind=WebhookKind.HUGGINGFACE))


# -- the variants -----------------------------------------------------------------------------


def string_positions(value: Any, path: str = "$") -> Iterator[tuple[str, str]]:
    """(path, "value" or "key") for every string of a JSON value and every object key."""
    if isinstance(value, str):
        yield path, "value"
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield f"{path}.{key}", "key"
            yield from string_positions(inner, f"{path}.{key}")
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from string_positions(inner, f"{path}[{i}]")


def inject(payload: Any, path: str, where: str, text: str) -> Any:
    """`payload` with `text` put into the middle of the string (or key) at `path`."""
    out = copy.deepcopy(payload)
    steps = path[1:].replace("[", ".[").split(".")[1:]
    parent, last = out, steps[-1]
    for step in steps[:-1]:
        parent = parent[int(step[1:-1])] if step.startswith("[") else parent[step]

    def spiked(s: str) -> str:
        return s[: len(s) // 2] + text + s[len(s) // 2 :]

    if where == "key":
        parent[spiked(last)] = parent.pop(last)
    elif last.startswith("["):
        parent[int(last[1:-1])] = spiked(parent[int(last[1:-1])])
    else:
        parent[last] = spiked(parent[last])
    return out


def variants(payload: Any) -> list[Any]:
    """pytest params: one body per (string position, hostile text)."""
    return [
        pytest.param(path, where, text, id=f"{name}-{where}-{path}")
        for path, where in string_positions(payload)
        for name, text in HOSTILE.items()
    ]


def encoded(payload: Any) -> bytes:
    """JSON as a sender writes it: NUL and lone surrogates as `\\u` escapes (valid UTF-8)."""
    return json.dumps(payload).encode("ascii")


def post(client: Client, endpoint: Endpoint, body: bytes, **headers: str):
    return client.post(endpoint.url, data=body, content_type="application/json", headers=headers)


def stored(response) -> WebhookDelivery:
    """The delivery a JSON answer names; checks the answer is JSON with a reason."""
    assert response["Content-Type"] == "application/json"
    answer = response.json()
    assert answer["reason"]
    return WebhookDelivery.objects.get(pk=answer["delivery"])


# -- generic ----------------------------------------------------------------------------------


def test_control_the_generic_request_as_is_starts_a_job(client, generic):
    body = encoded(GENERIC)
    response = post(client, generic, body, **signed_headers(generic.secret, body))
    assert response.status_code == 202, response.json()
    assert stored(response).body_bytes == body


@pytest.mark.parametrize(("path", "where", "text"), variants(GENERIC))
def test_generic_invalid_text_anywhere_is_a_400_and_stored_whole(
    client, generic, queued, path, where, text
):
    body = encoded(inject(GENERIC, path, where, text))
    response = post(client, generic, body, **signed_headers(generic.secret, body))

    assert response.status_code == 400, response.content
    reason = response.json()["reason"]
    if where == "value":
        assert f"holds text no database takes at {path}: " in reason
    else:
        assert f"holds text no database takes at {path.rsplit('.', 1)[0]}: a key with" in reason
    delivery = stored(response)
    assert delivery.body_bytes == body  # signed: kept whole, byte for byte
    assert delivery.verdict == DeliveryVerdict.REJECTED
    assert not AdaptationJob.objects.exists() and queued == []


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_generic_signature_is_checked_before_the_text(client, generic, text):
    body = encoded({**GENERIC, "revision": SHA + text})
    other_key = signed_headers("whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY", body)
    tampered = body.replace(b"Acme", b"Evil")  # signed, then changed on the way

    for sent, headers in ((body, other_key), (tampered, signed_headers(generic.secret, body))):
        response = post(client, generic, sent, **headers)
        assert response.status_code == 401
        assert stored(response).body_bytes == sent[:1024]


@pytest.mark.parametrize(
    "body",
    [
        b'{"repo_id": "acme-ai/Acme-LLM-7B", "revision": "a\x00b"}',  # a raw NUL byte
        b"\x00" * 64,
        b'{"repo_id": "acme-ai/\xff\xfeAcme"}',  # invalid UTF-8
        b"\xed\xa0\x80",  # a surrogate encoded as UTF-8 bytes (invalid UTF-8)
    ],
    ids=["raw-nul-in-string", "raw-nuls", "invalid-utf8", "encoded-surrogate"],
)
def test_generic_raw_nul_and_invalid_utf8_get_a_400_and_are_stored(client, generic, body):
    try:
        headers = signed_headers(generic.secret, body)
    except UnicodeDecodeError:  # the library signs text only: such a body arrives unsigned
        headers = {}
    response = post(client, generic, body, **headers)

    assert response.status_code == 400
    assert stored(response).body_bytes == body


def test_generic_webhook_id_with_a_nul_is_a_400(client, generic):
    body = encoded(GENERIC)
    response = post(client, generic, body, **signed_headers(generic.secret, body, msg_id="a\0b"))
    assert response.status_code == 400
    delivery = stored(response)
    assert delivery.idempotency_key is None and "\x00" not in delivery.delivery_id
    assert delivery.delivery_id == "a\\u0000b"


def test_generic_body_of_nul_escapes_at_the_size_limit_is_stored_whole(client, generic, settings):
    prefix, suffix = b'{"note": "', b'"}'
    count = (settings.DAY0_WEBHOOK_MAX_BODY_BYTES - len(prefix) - len(suffix)) // 6
    body = prefix + b"\\u0000" * count + suffix
    limit = settings.DAY0_WEBHOOK_MAX_BODY_BYTES
    assert limit - 6 < len(body) <= limit
    response = post(client, generic, body, **signed_headers(generic.secret, body))

    assert response.status_code == 400
    assert stored(response).body_bytes == body


@pytest.mark.parametrize("kind", ["generic", "hub"])
def test_a_body_over_the_limit_is_a_413_and_stored(client, request, settings, kind):
    endpoint = request.getfixturevalue(kind)
    body = b"\x00" * (settings.DAY0_WEBHOOK_MAX_BODY_BYTES + 1)
    response = post(client, endpoint, body)

    assert response.status_code == 413
    delivery = stored(response)
    assert (delivery.status_code, delivery.body_bytes) == (413, b"")


# -- Hugging Face -----------------------------------------------------------------------------

HUB = hub_payload("repo_content_update_main")


def test_control_the_hub_payload_as_is_is_taken(client, hub):
    body = encoded(HUB)
    response = post(client, hub, body, **{"X-Webhook-Secret": hub.secret})
    assert response.status_code == 202, response.json()
    assert stored(response).body_bytes == body


@pytest.mark.parametrize(("path", "where", "text"), variants(HUB))
def test_hub_invalid_text_anywhere_is_never_a_5xx_and_is_stored_whole(
    client, hub, path, where, text
):
    body = encoded(inject(HUB, path, where, text))
    response = post(client, hub, body, **{"X-Webhook-Secret": hub.secret})

    if where == "value" and path.startswith(HUB_FIELDS_READ):  # a field the receiver reads
        assert response.status_code == 400, response.content
        if path != "$.repo.name":  # a repo id is checked against the Hub's rules
            assert f"holds text no database takes at {path}: " in response.json()["reason"]
    else:  # kept in the raw body only (a renamed key reads as a missing field)
        assert response.status_code in (200, 202, 400), response.content
    delivery = stored(response)
    assert delivery.body_bytes == body
    for value in (delivery.event, delivery.repo_id, delivery.revision, delivery.reason):
        assert "\x00" not in value
        value.encode("utf-8")  # no lone surrogate reached a text column
    if response.status_code == 202:
        upload = PendingUpload.objects.get()
        assert upload.revision == SHA and upload.repo_id == "acme-ai/Acme-LLM-7B"


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_hub_secret_is_checked_before_the_text(client, hub, text):
    payload = copy.deepcopy(HUB)
    payload["repo"]["headSha"] = SHA + text
    body = encoded(payload)
    response = post(client, hub, body, **{"X-Webhook-Secret": "not-the-secret"})

    assert response.status_code == 401
    assert stored(response).body_bytes == body[:1024]


@pytest.mark.parametrize(
    "body",
    [b'{"event": {"scope": "repo\x00"}}', b"\x00" * 64, b'{"repo": "\xff"}', b"\xed\xa0\x80"],
    ids=["raw-nul-in-string", "raw-nuls", "invalid-utf8", "encoded-surrogate"],
)
def test_hub_raw_nul_and_invalid_utf8_get_a_400_and_are_stored_whole(client, hub, body):
    response = post(client, hub, body, **{"X-Webhook-Secret": hub.secret})

    assert response.status_code == 400
    assert stored(response).body_bytes == body


def test_hub_request_id_with_a_nul_is_stored_escaped(client, hub):
    body = encoded(HUB)
    response = post(client, hub, body, **{"X-Webhook-Secret": hub.secret, "X-Request-Id": "r\0"})
    assert response.status_code == 202
    delivery = stored(response)
    assert delivery.delivery_id == "r\\u0000"
    assert delivery.headers["X-Request-Id"] == "r\\u0000"


# -- the migration to a binary body -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_migration_keeps_stored_bodies_byte_for_byte_both_ways():
    """0014 copies each stored text body into the binary column as UTF-8, backslashes (which
    PostgreSQL's text-to-bytea cast would read as escapes) and non-ASCII included, and back."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before = [("adaptation", "0013_limitation_status_changes")]
    after = [("adaptation", "0014_webhook_delivery_raw_body")]
    text = '{"a": "\\u0000 \\\\x00 caf\u00e9 \\"q\\" \U0001f600"}'
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(before)
        old = executor.loader.project_state(before).apps
        endpoint = old.get_model("adaptation", "WebhookEndpoint").objects.create(
            name="e", kind="generic"
        )
        deliveries = old.get_model("adaptation", "WebhookDelivery").objects
        kept = deliveries.create(endpoint=endpoint, body=text, status_code=400, verdict="rejected")
        empty = deliveries.create(endpoint=endpoint, body="", status_code=413, verdict="rejected")

        executor = MigrationExecutor(connection)
        executor.migrate(after)
        new = executor.loader.project_state(after).apps.get_model("adaptation", "WebhookDelivery")
        assert bytes(new.objects.get(pk=kept.pk).body) == text.encode("utf-8")
        assert bytes(new.objects.get(pk=empty.pk).body) == b""

        new.objects.create(
            endpoint_id=endpoint.pk, body=b"\x00\xff", status_code=400, verdict="rejected"
        )
        executor = MigrationExecutor(connection)
        executor.migrate(before)
        back = executor.loader.project_state(before).apps.get_model("adaptation", "WebhookDelivery")
        assert back.objects.get(pk=kept.pk).body == text
        assert back.objects.order_by("-pk").first().body == "\\u0000\ufffd"
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def test_the_admin_shows_a_stored_body_of_any_bytes(client, hub, cast):
    body = b'{"a": "\x00"}\xff'
    response = post(client, hub, body, **{"X-Webhook-Secret": hub.secret})
    delivery = stored(response)
    client.force_login(cast.ada)

    page = client.get(f"/admin/adaptation/webhookdelivery/{delivery.pk}/change/")

    assert page.status_code == 200
    assert "{&quot;a&quot;: &quot;\\u0000&quot;}\ufffd" in page.content.decode()
