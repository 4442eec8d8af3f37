"""Fixtures for the inbound webhook tests.

The Hub payloads under tests/data/webhooks/huggingface/ follow the Hub's documented format
(https://huggingface.co/docs/hub/webhooks: `event`, `repo` with `headSha`, `updatedRefs`,
`updatedConfig`, `discussion`, `comment`, `webhook`), one file per event kind, all about the
model repo `acme-ai/Acme-LLM-7B` (the dataset one about `acme-ai/acme-instruct`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from django.urls import reverse
from standardwebhooks.webhooks import Webhook

from adaptation.models import HubKind, WebhookEndpoint, WebhookKind
from adaptation.webhooks.endpoints import webhook_endpoint_create
from tests.conftest import DATA_DIR
from tests.factories import cpu_pool, make_watch

HUB_FIXTURES = DATA_DIR / "webhooks" / "huggingface"
REPO = "acme-ai/Acme-LLM-7B"


def hub_payload(name: str, **repo_fields: Any) -> dict[str, Any]:
    """A documented Hub payload from tests/data/webhooks/huggingface/<name>.json, with
    `repo_fields` (e.g. headSha=..., name=...) replaced in its `repo` object."""
    payload = json.loads((HUB_FIXTURES / f"{name}.json").read_text())
    payload["repo"].update(repo_fields)
    return payload


def hub_body(name: str, **repo_fields: Any) -> bytes:
    return json.dumps(hub_payload(name, **repo_fields)).encode()


@dataclass
class Endpoint:
    """An endpoint with its one-time secret, and how to post to it."""

    row: WebhookEndpoint
    secret: str

    @property
    def url(self) -> str:
        return reverse(f"webhooks:{self.row.kind}", kwargs={"endpoint_id": self.row.pk})


@pytest.fixture
def hub_watch(db):
    """An enabled Hugging Face watch of the org `acme-ai` (blank endpoint: HF_ENDPOINT)."""
    return make_watch(name="acme", kind=HubKind.HUGGINGFACE, endpoint="", author="acme-ai")


@pytest.fixture
def hub_endpoint(db) -> Endpoint:
    row, secret = webhook_endpoint_create(name="hub", kind=WebhookKind.HUGGINGFACE)
    return Endpoint(row, secret)


@pytest.fixture
def generic_endpoint(db) -> Endpoint:
    cpu_pool()
    row, secret = webhook_endpoint_create(name="ci", kind=WebhookKind.GENERIC)
    return Endpoint(row, secret)


def post_hub(client, endpoint: Endpoint, body: bytes, *, secret: str | None = None, **headers):
    """POST `body` to a Hub endpoint with its secret (or `secret`; "" sends none)."""
    secret = endpoint.secret if secret is None else secret
    if secret:
        headers["X-Webhook-Secret"] = secret
    return client.post(endpoint.url, data=body, content_type="application/json", headers=headers)


def signed_headers(
    secret: str, body: bytes, *, msg_id: str = "msg_2xQ9", at: datetime | None = None
) -> dict[str, str]:
    """Standard Webhooks headers for `body`, signed with the library's own `sign`."""
    at = at or datetime.now(tz=UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, at, body.decode()),
    }


def post_generic(client, endpoint: Endpoint, payload: Any, **sign: Any):
    body = json.dumps(payload).encode()
    headers = signed_headers(endpoint.secret, body, **sign)
    return client.post(endpoint.url, data=body, content_type="application/json", headers=headers)


@dataclass
class Sent:
    """Celery messages the code under test sent (`apply_async` patched)."""

    settles: list[dict[str, Any]] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def sent(monkeypatch) -> Sent:
    """Record instead of sending: `day0.settle_upload` messages and stage messages."""
    from adaptation.services import queueing
    from workers import tasks

    record = Sent()

    def settle_apply_async(args=None, kwargs=None, **options):
        record.settles.append({"args": args, **options})

    def send_stage_message(**kwargs):
        record.stages.append(kwargs)

    monkeypatch.setattr(tasks.settle_upload, "apply_async", settle_apply_async)
    monkeypatch.setattr(queueing, "stage_message_send", send_stage_message)
    return record
