"""What every inbound provider shares: the request as received (bounded body, headers without
secrets), the stored `WebhookDelivery` row, and the outcome a view turns into its JSON answer.

Providers (`huggingface`, `generic`) verify the request first, then parse, then decide; each
ends by recording one delivery through a `DeliveryRecorder`, whatever the verdict. A delivery
refused before its sender proved itself (unknown secret or signature, a disabled endpoint, a
body over the limit) keeps only the first `UNAUTHENTICATED_BODY_BYTES` of its body, so knowing
an endpoint's URL is not enough to fill the disk; `webhook_deliveries_prune` (the daily
`day0.prune_webhook_deliveries`) deletes old deliveries that started nothing.

Bytes: the body is stored as received (`WebhookDelivery.body` is binary), whatever it holds.
Text taken from it is stored through `storable_text` (NUL and lone surrogates escaped:
PostgreSQL's text columns refuse the one and UTF-8 cannot encode the other); a provider
refuses a body whose fields it uses hold such text (`invalid_text_at`) with a 400, before any
query sees them.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
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
# Revisions (a commit sha, a content hash) are at most this long: `WebhookDelivery.revision`
# and `PendingUpload.revision` hold no more.
MAX_REVISION_CHARS = 128
# A delivery refused before its sender proved itself keeps this many bytes of its body, and
# its headers (names and values) up to this many characters in all.
UNAUTHENTICATED_BODY_BYTES = 1024
UNAUTHENTICATED_HEADERS_CHARS = 4096
# Verdicts of deliveries that started nothing: pruned after DAY0_WEBHOOK_DELIVERY_RETENTION_DAYS.
PRUNED_VERDICTS = (DeliveryVerdict.REJECTED, DeliveryVerdict.IGNORED, DeliveryVerdict.DUPLICATE)
# Deliveries deleted per statement when pruning (SQLite caps a statement's variables).
PRUNE_BATCH = 500


def storable_text(value: str) -> str:
    """`value` as a text column can hold it: NUL as the six characters `\\u0000` (PostgreSQL
    refuses NUL in text) and each lone surrogate as its `\\udXXX` escape (not encodable as
    UTF-8); anything else unchanged."""
    value = value.replace("\x00", "\\u0000")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", errors="backslashreplace").decode("utf-8")
    return value


def _text_problem(text: str) -> str:
    if "\x00" in text:
        return "a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"a lone surrogate (\\u{ord(text[exc.start]):04x})"
    return ""


def invalid_text_at(value: Any, path: str = "$") -> str:
    """Where parsed JSON `value` holds text no database column takes, and what: the first
    string (object keys included) with a NUL character or a lone surrogate (JSON escapes
    such as `\\u0000` and `\\ud800` parse to them), as "$.repo.headSha: a NUL character";
    "" when there is none. Walks nested lists and objects (as deep as `json.loads` went)."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            problem = _text_problem(item)
            if problem:
                return f"{where}: {problem}"
        elif isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                problem = _text_problem(key)
                if problem:
                    return f"{where}: a key with {problem}"
                stack.append((f"{where}.{key}", inner))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", inner) for i, inner in reversed(list(enumerate(item))))
    return ""


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
    authenticated: bool = False,
) -> WebhookDelivery:
    """Store one delivery as received and decided (`received_at` is when it arrived, so the
    deliveries of a coalesced upload can be found from the upload's first event).

    The body is stored as the bytes received. Unless the sender proved itself
    (`authenticated`: its secret or signature checked), only the first
    `UNAUTHENTICATED_BODY_BYTES` of the body and the first headers up to
    `UNAUTHENTICATED_HEADERS_CHARS` are kept, and the stored reason says so
    ("body_truncated", "headers_truncated"). Text fields and headers go through
    `storable_text`, so no bytes a sender chose make the insert fail."""
    body, headers, reason = incoming.body, incoming.headers, outcome.reason
    if not authenticated and len(incoming.body) > UNAUTHENTICATED_BODY_BYTES:
        body = incoming.body[:UNAUTHENTICATED_BODY_BYTES]
        reason = (
            f"{reason} [body_truncated: the sender was not authenticated; the first "
            f"{UNAUTHENTICATED_BODY_BYTES} of {len(incoming.body)} bytes are kept]"
        )
    if not authenticated:
        headers, budget = {}, UNAUTHENTICATED_HEADERS_CHARS
        for name, value in incoming.headers.items():
            budget -= len(name) + len(value)
            if budget < 0:
                break
            headers[name] = value
        if len(headers) < len(incoming.headers):
            reason = (
                f"{reason} [headers_truncated: the sender was not authenticated; "
                f"{len(headers)} of {len(incoming.headers)} headers are kept]"
            )
    return WebhookDelivery.objects.create(
        endpoint=endpoint,
        received_at=incoming.received_at,
        delivery_id=storable_text(delivery_id)[:255],
        idempotency_key=idempotency_key,
        remote_addr=incoming.remote_addr,
        headers={storable_text(k): storable_text(v) for k, v in headers.items()},
        body=body,
        event=storable_text(event)[:64],
        repo_id=storable_text(repo_id)[:256],
        revision=storable_text(revision)[:MAX_REVISION_CHARS],
        status_code=outcome.status_code,
        verdict=outcome.verdict,
        reason=storable_text(reason),
        release=outcome.release,
        job=outcome.job,
    )


@dataclass(frozen=True)
class DeliveryRecorder:
    """Records a provider's outcome as the endpoint's delivery, with the fields every
    delivery of one request shares (`event`, `delivery_id`), and puts the delivery's id in
    the answer. `authenticated` starts False (a body kept only in part, see
    `delivery_record`); a provider that has checked the sender's secret or signature goes on
    with `recorder.authenticated_()`."""

    endpoint: WebhookEndpoint
    incoming: Incoming
    event: str = ""
    delivery_id: str = ""
    authenticated: bool = False

    def authenticated_(self) -> DeliveryRecorder:
        """This recorder, for a sender that proved itself (the whole body is kept)."""
        return replace(self, authenticated=True)

    def __call__(self, outcome: Outcome, **fields: Any) -> Outcome:
        """Store `outcome` (`fields`: `delivery_record`'s `event`, `repo_id`, `revision`,
        `idempotency_key`) and return it with `extra["delivery"]` set."""
        fields.setdefault("event", self.event)
        delivery = delivery_record(
            endpoint=self.endpoint,
            incoming=self.incoming,
            outcome=outcome,
            delivery_id=self.delivery_id,
            authenticated=self.authenticated,
            **fields,
        )
        outcome.extra.setdefault("delivery", delivery.pk)
        return outcome


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


def webhook_deliveries_prune(*, now: datetime | None = None) -> int:
    """Delete the deliveries older than `DAY0_WEBHOOK_DELIVERY_RETENTION_DAYS` that started
    nothing (`PRUNED_VERDICTS`: rejected, ignored, duplicate); accepted and coalescing ones,
    which link the job they started or joined, are kept. Returns how many were deleted."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.DAY0_WEBHOOK_DELIVERY_RETENTION_DAYS)
    old = WebhookDelivery.objects.filter(received_at__lt=cutoff, verdict__in=PRUNED_VERDICTS)
    deleted = 0
    while ids := list(old.order_by().values_list("pk", flat=True)[:PRUNE_BATCH]):
        deleted += WebhookDelivery.objects.filter(pk__in=ids).delete()[0]
    return deleted
