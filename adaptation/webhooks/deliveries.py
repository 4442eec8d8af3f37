"""What every inbound provider shares: the request as received (bounded body, headers without
secrets), the stored `WebhookDelivery` row, and the outcome a view turns into its JSON answer.

Providers (`huggingface`, `generic`) verify the request first, then parse, then decide; each
ends by recording one delivery through `delivery_record`, whatever the verdict.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.http import HttpRequest
from django.utils import timezone

from adaptation.models import (
    AdaptationJob,
    DeliveryVerdict,
    ModelRelease,
    WebhookDelivery,
    WebhookEndpoint,
)

# Headers never stored: shared secrets, signatures and credentials (compared lower-case).
SECRET_HEADERS = frozenset(
    {"x-webhook-secret", "webhook-signature", "authorization", "proxy-authorization", "cookie"}
)
# `WebhookEndpoint.last_delivery_at` is kept to this many seconds (see `endpoint_touch`).
LAST_DELIVERY_RESOLUTION_S = 1
# Stored headers are cut to this many characters each (a header is not a place for data).
MAX_HEADER_CHARS = 1024


class BodyTooLarge(Exception):
    """The request's body is over `DAY0_WEBHOOK_MAX_BODY_BYTES` (declared or as read)."""


@dataclass(frozen=True)
class Incoming:
    """One request as received, before anything is believed: its raw body (bounded), its
    headers with the secret ones removed (`SECRET_HEADERS`), the header values a provider
    verifies (`raw_headers`, lower-case names, never stored), and where it came from."""

    body: bytes
    headers: dict[str, str]
    raw_headers: dict[str, str]
    remote_addr: str | None
    received_at: datetime

    @property
    def body_text(self) -> str:
        """The body as text for storage (undecodable bytes replaced)."""
        return self.body.decode("utf-8", errors="replace")


@dataclass
class Outcome:
    """What a provider made of a delivery: the HTTP status, verdict and reason, and what the
    delivery points at. `extra` adds provider fields to the JSON answer."""

    status_code: int
    verdict: str
    reason: str
    release: ModelRelease | None = None
    job: AdaptationJob | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def rejected(status_code: int, reason: str) -> Outcome:
    """A refused delivery (4xx/5xx), with why."""
    return Outcome(status_code=status_code, verdict=DeliveryVerdict.REJECTED, reason=reason)


def read_body(request: HttpRequest, *, limit_bytes: int) -> bytes:
    """The request's body, at most `limit_bytes`. Raises `BodyTooLarge` when Content-Length
    says more (before anything is read) or when more arrives than that: at most
    `limit_bytes + 1` bytes are ever read, whatever the client declares."""
    declared = request.META.get("CONTENT_LENGTH") or ""
    if declared.strip().isdigit() and int(declared) > limit_bytes:
        raise BodyTooLarge(f"body of {int(declared)} bytes is over the {limit_bytes}-byte limit")
    body = request.read(limit_bytes + 1)
    if len(body) > limit_bytes:
        raise BodyTooLarge(f"body is over the {limit_bytes}-byte limit")
    return body


def _remote_addr(request: HttpRequest) -> str | None:
    """The peer's address when it is an IP address (the model field refuses anything else)."""
    value = (request.META.get("REMOTE_ADDR") or "").strip()
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return None


def incoming_from(request: HttpRequest, body: bytes = b"") -> Incoming:
    """The `Incoming` for a Django request whose (bounded) body has been read."""
    raw = {name.lower(): value for name, value in request.headers.items()}
    stored = {
        name: value[:MAX_HEADER_CHARS]
        for name, value in request.headers.items()
        if name.lower() not in SECRET_HEADERS
    }
    return Incoming(
        body=body,
        headers=stored,
        raw_headers=raw,
        remote_addr=_remote_addr(request),
        received_at=timezone.now(),
    )


def delivery_record(
    *,
    endpoint: WebhookEndpoint,
    incoming: Incoming,
    outcome: Outcome,
    event: str = "",
    repo_id: str = "",
    revision: str = "",
    delivery_id: str = "",
    idempotency_key: str | None = None,
) -> WebhookDelivery:
    """Store one delivery as received and decided (`received_at` is when it arrived, so the
    deliveries of a coalesced upload can be found from the upload's first event)."""
    return WebhookDelivery.objects.create(
        endpoint=endpoint,
        received_at=incoming.received_at,
        delivery_id=delivery_id[:255],
        idempotency_key=idempotency_key,
        remote_addr=incoming.remote_addr,
        headers=incoming.headers,
        body=incoming.body_text,
        event=event[:64],
        repo_id=repo_id[:256],
        revision=revision[:128],
        status_code=outcome.status_code,
        verdict=outcome.verdict,
        reason=outcome.reason,
        release=outcome.release,
        job=outcome.job,
    )


def endpoint_touch(*, endpoint: WebhookEndpoint, at: datetime) -> None:
    """Record that the endpoint received a delivery at `at`, to the second
    (`LAST_DELIVERY_RESOLUTION_S`; a later time never goes back).

    Every delivery to an endpoint would otherwise update its one row: under a burst the
    requests would queue on that row's lock and commit. Outside the delivery's transaction,
    and skipped (no lock, no write) while the stored time is less than a second old.
    """
    recent = at - timedelta(seconds=LAST_DELIVERY_RESOLUTION_S)
    if endpoint.last_delivery_at is not None and endpoint.last_delivery_at > recent:
        return  # as loaded with the request: not even a query
    WebhookEndpoint.objects.filter(pk=endpoint.pk).exclude(last_delivery_at__gt=recent).update(
        last_delivery_at=at
    )
