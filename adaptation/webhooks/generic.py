"""Generic webhooks: `POST /webhooks/generic/<endpoint-id>`, any system asking for a job.

Signed as the Standard Webhooks specification defines (https://www.standardwebhooks.com/):
headers `webhook-id`, `webhook-timestamp` (Unix seconds) and `webhook-signature`
(`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, several space-separated allowed),
keyed with the endpoint's `whsec_…` secret. The `standardwebhooks` library verifies the raw
body before anything is parsed, and refuses a timestamp more than 5 minutes off, so a
captured delivery cannot be replayed later.

The body: `{"repo_id": "org/name", "revision": "<sha>", "hub": optional, "pool": optional,
"stages": optional ["fetch", ...], "options": optional {"<stage>": {...}}}`; other keys are
ignored. `hub` is a Hugging Face-compatible base URL (http/https) or the name of a hub watch
(its kind and endpoint, its pool, and its job options unless the body gives `options`);
without it, `HF_ENDPOINT` or the public Hub. The pool is
the delivery's `pool`, else the endpoint's, else the named watch's, else `DAY0_DEFAULT_POOL`.

`webhook-id` is the idempotency key: the first accepted delivery claims it
(`WebhookDelivery.idempotency_key`, unique per endpoint, so concurrent repeats are decided by
the database, and a losing repeat's job is rolled back with its transaction); a repeat is
answered "duplicate" with the first delivery's job. A new id is an
explicit request: the release is created if new, and a job always starts (as `manage.py
adapt` does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from django.db import IntegrityError, transaction
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from adaptation.models import (
    AcceleratorPool,
    DeliveryVerdict,
    HubKind,
    HubWatch,
    Trigger,
    WebhookDelivery,
    WebhookEndpoint,
)
from adaptation.models.hub_endpoints import configured_hub_urls, hub_endpoint_unlisted_reason
from adaptation.secrets import SecretUnreadable, secret_decrypt
from adaptation.services.errors import ServiceError
from adaptation.services.hub_polling import hub_spec_for_watch
from adaptation.services.jobs import job_create
from adaptation.services.pools import pool_get
from adaptation.services.releases import release_get_or_create
from adaptation.webhooks.deliveries import (
    MAX_REVISION_CHARS,
    DeliveryRecorder,
    Incoming,
    Outcome,
    invalid_text_at,
    rejected,
)
from engine.hubs import HubSpec, canonical_endpoint
from engine.hubs.base import REPO_ID_RULES, is_valid_repo_id
from engine.registry import job_options_check, stage_list_check, stage_names

EVENT = "adapt"
MAX_REPO_ID_CHARS = 256
MAX_HUB_URL_CHARS = 512
MAX_WEBHOOK_ID_CHARS = 255


class RequestError(ValueError):
    """A signed body that does not ask for a job day0 can start: says why (answered 400)."""


@dataclass(frozen=True)
class AdaptRequest:
    """A checked generic delivery: what to adapt, where, and how."""

    repo_id: str
    revision: str
    hub_kind: str
    hub_endpoint: str
    pool: AcceleratorPool
    watch: HubWatch | None = None
    stages: list[str] | None = None
    options: dict[str, dict[str, Any]] = field(default_factory=dict)


def _hub(value: Any) -> tuple[str, str, HubWatch | None]:
    """(hub kind, canonical endpoint, watch) for the body's `hub`. Raises `RequestError`."""
    if value is None:
        return HubKind.HUGGINGFACE, canonical_endpoint(HubSpec(kind=HubKind.HUGGINGFACE)), None
    if not isinstance(value, str) or not value.strip():
        raise RequestError("hub must be a Hub base URL or the name of a hub watch")
    value = value.strip()
    if "://" in value:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RequestError(f"hub {value!r} is not an http(s) URL with a host")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise RequestError(f"hub {value!r}: give the base URL only (no credentials, query)")
        if len(value) > MAX_HUB_URL_CHARS:
            raise RequestError(f"hub URL is longer than {MAX_HUB_URL_CHARS} characters")
        endpoint = canonical_endpoint(HubSpec(kind=HubKind.HUGGINGFACE, endpoint=value))
        # Only a configured hub (HF_ENDPOINT or the admin's allow-list): the worker would
        # fetch from wherever a sender points it (cloud metadata, internal services).
        if hub_endpoint_unlisted_reason(endpoint):
            raise RequestError(
                f"hub {value!r} is not a hub this day0 reads; give a hub watch's name or one "
                f"of {', '.join(configured_hub_urls())}"
            )
        return HubKind.HUGGINGFACE, endpoint, None
    watch = HubWatch.objects.select_related("pool").filter(name=value).first()
    if watch is None:
        known = ", ".join(HubWatch.objects.values_list("name", flat=True)) or "none"
        raise RequestError(
            f"hub {value!r} is neither an http(s) URL nor a hub watch; watches: {known}"
        )
    # A watch saved before the rules (or changed in the database) names no hub a sender may use.
    refusal = watch.endpoint_refusal(resolve=False)
    if refusal:
        raise RequestError(f"hub watch {value!r}: {refusal}")
    return watch.kind, canonical_endpoint(hub_spec_for_watch(watch)), watch


def _stages(value: Any) -> list[str] | None:
    """The requested stages in the order a job runs them, or None (all). Raises
    `RequestError` for anything but a non-empty list of known stage names holding the stages
    each one needs (`engine.registry.stage_list_check`)."""
    if value is None:
        return None
    known = stage_names()
    if not isinstance(value, list) or not value or not all(isinstance(s, str) for s in value):
        raise RequestError(f"stages must be a non-empty list of stage names ({', '.join(known)})")
    # Later stages read earlier ones' results: in the registry's order, with what each needs.
    try:
        return stage_list_check(value)
    except ValueError as exc:
        raise RequestError(str(exc)) from exc


def adapt_request_parse(payload: Any, *, endpoint: WebhookEndpoint) -> AdaptRequest:
    """Check a generic delivery's parsed JSON body (see the module). Raises `RequestError`
    with a one-line reason: a malformed repo id or revision, an unknown hub, pool or stage,
    options a stage refuses (the reasons `pool_get` and `job_options_check` give)."""
    if not isinstance(payload, dict):
        raise RequestError("body must be a JSON object")
    repo_id = payload.get("repo_id")
    if not is_valid_repo_id(repo_id):
        raise RequestError(f"repo_id must be a Hub repo id: {REPO_ID_RULES}")
    revision = payload.get("revision")
    if not isinstance(revision, str) or not revision.strip():
        raise RequestError("revision must be a non-empty string (a commit sha)")
    revision = revision.strip()
    if len(revision) > MAX_REVISION_CHARS or any(c.isspace() for c in revision):
        raise RequestError(f"revision must be at most {MAX_REVISION_CHARS} chars, no spaces")
    hub_kind, hub_endpoint, watch = _hub(payload.get("hub"))
    stages = _stages(payload.get("stages"))
    options = payload.get("options")
    if options is not None and not isinstance(options, dict):
        raise RequestError('options must map stage names to objects: {"plan": {...}}')
    pool_name = payload.get("pool")
    if pool_name is not None and (not isinstance(pool_name, str) or not pool_name.strip()):
        raise RequestError("pool must be a pool name")
    if options is None and watch is not None and watch.job_options:
        # The named watch's options, as its polls give them, for the stages this job runs.
        options = {k: v for k, v in watch.job_options.items() if stages is None or k in stages}
    try:
        checked = job_options_check(options=options or None, stages=stages)
        if pool_name is not None:
            pool = pool_get(name=pool_name.strip())
        else:
            pool = endpoint.pool or (watch.pool if watch else None) or pool_get()
            if not pool.enabled:
                raise ServiceError(f"pool {pool.name!r} is disabled; name an enabled pool")
    except (ServiceError, ValueError) as exc:
        raise RequestError(str(exc)) from exc
    return AdaptRequest(
        repo_id=repo_id,
        revision=revision,
        hub_kind=hub_kind,
        hub_endpoint=hub_endpoint,
        pool=pool,
        watch=watch,
        stages=stages,
        options=checked,
    )


def generic_delivery_handle(*, endpoint: WebhookEndpoint, incoming: Incoming) -> Outcome:
    """Verify, parse and act on one generic delivery to `endpoint`; return its outcome.

    401 (signature missing or wrong, timestamp more than 5 minutes off), 400 (body not
    UTF-8 JSON or nested too deeply, a string in it holding a NUL character or a lone
    surrogate, a `webhook-id` with control characters, not a request day0 can run), 500
    (the endpoint's stored secret cannot be decrypted: the secrets key changed), 200
    "duplicate" (the `webhook-id` was accepted before: the first delivery's job), 202
    "accepted" (release found or created, job created; its first stage is queued after
    commit). Every delivery is stored, its raw bytes (whole only once the signature is
    checked). Raises nothing of its own (database errors propagate).
    """
    webhook_id = incoming.raw_headers.get("webhook-id", "")
    record = DeliveryRecorder(
        endpoint=endpoint, incoming=incoming, event=EVENT, delivery_id=webhook_id
    )
    try:
        secret = secret_decrypt(endpoint.secret_ciphertext)
    except SecretUnreadable as exc:
        return record(rejected(500, str(exc)))
    try:
        body_text = incoming.body.decode("utf-8")
    except UnicodeDecodeError:
        return record(rejected(400, "body is not UTF-8 text"))
    try:
        Webhook(secret).verify(body_text, incoming.raw_headers, json_parse=False)
    except WebhookVerificationError as exc:
        return record(rejected(401, f"Standard Webhooks signature refused: {exc}"))
    except ValueError:  # a malformed signature header (no "v1,", bad base64)
        return record(rejected(401, "Standard Webhooks signature refused: malformed header"))
    record = record.authenticated_()
    if len(webhook_id) > MAX_WEBHOOK_ID_CHARS:
        return record(rejected(400, f"webhook-id is longer than {MAX_WEBHOOK_ID_CHARS} chars"))
    if not webhook_id.isprintable():  # it becomes the stored idempotency key
        return record(rejected(400, "webhook-id must be printable text (no control characters)"))

    first = endpoint.deliveries.filter(idempotency_key=webhook_id).first()
    if first is not None:
        return record(_duplicate(webhook_id, first))
    payload: Any = None
    try:
        payload = json.loads(body_text)
        # Before any field reaches a query: PostgreSQL refuses NUL, UTF-8 lone surrogates.
        invalid = invalid_text_at(payload)
        if invalid:
            payload = None  # nothing of it is stored as fields
            raise RequestError(f"body holds text no database takes at {invalid}")
        request = adapt_request_parse(payload, endpoint=endpoint)
    except json.JSONDecodeError as exc:
        reason = f"body is not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})"
        return record(rejected(400, reason))
    except RecursionError:
        return record(rejected(400, "body is not valid JSON: nested too deeply"))
    except RequestError as exc:
        fields = {}
        if isinstance(payload, dict):
            fields = {
                "repo_id": str(payload.get("repo_id") or "")[:MAX_REPO_ID_CHARS],
                "revision": str(payload.get("revision") or "")[:MAX_REVISION_CHARS],
            }
        return record(rejected(400, str(exc)), **fields)
    return _accept(endpoint=endpoint, record=record, webhook_id=webhook_id, request=request)


def _duplicate(webhook_id: str, first: WebhookDelivery) -> Outcome:
    reason = f"webhook-id {webhook_id!r} was accepted before (delivery {first.pk})" + (
        f": its job is {first.job_id}" if first.job_id else ""
    )
    return Outcome(
        200,
        DeliveryVerdict.DUPLICATE,
        reason,
        release=first.release,
        job=first.job,
        extra={"first_delivery": first.pk},
    )


def _accept(
    *,
    endpoint: WebhookEndpoint,
    record: DeliveryRecorder,
    webhook_id: str,
    request: AdaptRequest,
) -> Outcome:
    """Record the release, create the job and store the delivery that claims `webhook_id`,
    in one transaction. The claim is the last insert: when a concurrent delivery with the
    same id committed first, the unique constraint refuses it and the whole transaction,
    job included, rolls back; this delivery is then answered as that one's duplicate."""
    fields = {"repo_id": request.repo_id, "revision": request.revision}
    try:
        with transaction.atomic():
            release, created = release_get_or_create(
                hub_kind=request.hub_kind,
                hub_endpoint=request.hub_endpoint,
                repo_id=request.repo_id,
                revision=request.revision,
                published_at=None,
                found_by=Trigger.WEBHOOK,
                watch=request.watch,
            )
            job = job_create(
                release=release,
                pool=request.pool,
                trigger=Trigger.WEBHOOK,
                stages=request.stages,
                options=request.options or None,
            )
            reason = (
                f"job {job.pk} for {request.repo_id}@{request.revision[:12]} on pool "
                f"{request.pool.name} ({'new' if created else 'known'} release {release.pk})"
            )
            outcome = Outcome(202, DeliveryVerdict.ACCEPTED, reason, release=release, job=job)
            record(outcome, idempotency_key=webhook_id, **fields)
    except IntegrityError:
        first = endpoint.deliveries.filter(idempotency_key=webhook_id).first()
        if first is None:  # not the claim that failed
            raise
        outcome = record(_duplicate(webhook_id, first), **fields)
    return outcome
