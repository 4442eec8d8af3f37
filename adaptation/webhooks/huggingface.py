"""Hugging Face Hub webhooks: `POST /webhooks/huggingface/<endpoint-id>`.

The Hub sends JSON (https://huggingface.co/docs/hub/webhooks): `event.action` and
`event.scope`, `repo.type`/`repo.name`/`repo.headSha` (the sha of `main` after the event,
sent on `repo*` scopes), `updatedRefs` on content events, `updatedConfig` on `repo.config`
events, and the secret the webhook was given in the `X-Webhook-Secret` header.

The secret is checked (constant time, against its stored digest) before the body is parsed.
Parsing is tolerant: only `event.scope`, `event.action`, `repo.type` and `repo.name` are
required, plus `repo.headSha` on the events taken; unknown fields are ignored, and a scope
narrower than a known one (a future `repo.config.dois`) is read, as the Hub's documentation
says, as an update on the broader scope.

Taken: model repos of a watched org or pattern (an enabled Hugging Face `HubWatch`), when
`main` got new content: `repo.content` updates whose `updatedRefs` touch `refs/heads/main`
(or that name no refs), a repo's creation, and a repo made public (`repo.config` with
`updatedConfig.private` false: the moment a lab's private upload is released). Everything else
is acknowledged with 200 and "ignored", with the reason. A taken delivery does not start a job:
it joins the repo's `PendingUpload` (see `uploads`), which starts one job at the last revision
once the repo is quiet and the upload complete.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from adaptation.models import (
    AcceleratorPool,
    DeliveryVerdict,
    HubKind,
    HubWatch,
    ModelRelease,
    WebhookEndpoint,
)
from adaptation.secrets import secret_matches
from adaptation.selectors.releases import release_newest_job
from adaptation.services.hub_polling import hub_spec_for_watch
from adaptation.webhooks import uploads
from adaptation.webhooks.deliveries import (
    MAX_REVISION_CHARS,
    DeliveryRecorder,
    Incoming,
    Outcome,
    invalid_text_at,
    rejected,
)
from engine.hubs import canonical_endpoint
from engine.hubs.base import REPO_ID_RULES, is_valid_repo_id, repo_matches

SECRET_HEADER = "x-webhook-secret"
MAIN_REF = "refs/heads/main"
# Scopes the Hub documents; a narrower one is read as an update on the broader one.
KNOWN_SCOPES = ("repo", "repo.content", "repo.config", "discussion", "discussion.comment")
# Why a delivery's secret did not match: a wrong or missing one, or a server whose key
# changed since the secret was made (its digest is keyed with it; nothing tells them apart).
WRONG_SECRET_REASON = (
    "missing or wrong X-Webhook-Secret, or the server's DAY0_SECRETS_KEY/SECRET_KEY changed "
    "since the secret was made (rotate it)"
)


class PayloadError(ValueError):
    """A body that is not the Hub's webhook JSON, or lacks a required field: says which."""


@dataclass(frozen=True)
class HubEvent:
    """The parts of a Hub delivery day0 reads.

    `scope`/`action` are as sent; `known_scope`/`known_action` are what they mean (a
    narrower unknown scope is an update on the broader known one). `updated_refs` is None
    when the payload has no `updatedRefs` list; `updated_config` None without
    `updatedConfig`. `head_sha` is "" when absent.
    """

    scope: str
    action: str
    repo_type: str
    repo_name: str
    head_sha: str = ""
    updated_refs: tuple[tuple[str, str | None], ...] | None = None
    updated_config: dict[str, Any] | None = None

    @property
    def event(self) -> str:
        """ "scope/action", as deliveries store it."""
        return f"{self.scope}/{self.action}"

    @property
    def known_scope(self) -> str:
        scope = self.scope
        while scope and scope not in KNOWN_SCOPES:
            scope = scope.rpartition(".")[0]
        return scope

    @property
    def known_action(self) -> str:
        return self.action if self.known_scope == self.scope else "update"


@dataclass(frozen=True)
class Triage:
    """Whether a Hub event is one to adapt (`take`), and why (or why not)."""

    take: bool
    reason: str


def _text(container: dict[str, Any], key: str, where: str) -> str:
    value = container.get(key)
    if not isinstance(value, str) or not value.strip():
        raise PayloadError(f"{where}.{key} is missing or not a non-empty string")
    return value.strip()


def hub_event_parse(body: bytes) -> HubEvent:
    """The `HubEvent` in a delivery's raw body. Raises `PayloadError` naming what is wrong:
    not UTF-8 JSON (or JSON nested too deeply to read), not an object, or a required field
    missing (`event.scope`, `event.action`, `repo.type`, `repo.name`, which must be a Hub
    repo id, `is_valid_repo_id`; `repo.headSha` when present must be a string of at most 128
    characters), or one of those (or `updatedRefs`) holding a NUL character or a lone
    surrogate (`invalid_text_at`)."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise PayloadError("body is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise PayloadError(
            f"body is not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise PayloadError("body is not valid JSON: nested too deeply") from None
    if not isinstance(payload, dict):
        raise PayloadError("body is not a JSON object")
    event, repo = payload.get("event"), payload.get("repo")
    if not isinstance(event, dict):
        raise PayloadError("event is missing or not an object")
    if not isinstance(repo, dict):
        raise PayloadError("repo is missing or not an object")
    # The fields read reach queries and text columns: no NUL, no lone surrogate (other
    # fields, a comment's text, are kept only in the raw body).
    for where, value in (
        ("event.scope", event.get("scope")),
        ("event.action", event.get("action")),
        ("repo.type", repo.get("type")),
        ("repo.headSha", repo.get("headSha")),
        ("updatedRefs", payload.get("updatedRefs")),
    ):
        invalid = invalid_text_at(value, f"$.{where}")
        if invalid:
            raise PayloadError(f"body holds text no database takes at {invalid}")
    head_sha = repo.get("headSha")
    if head_sha is not None and (
        not isinstance(head_sha, str) or len(head_sha.strip()) > MAX_REVISION_CHARS
    ):
        raise PayloadError(f"repo.headSha must be a string of at most {MAX_REVISION_CHARS} chars")
    repo_name = _text(repo, "name", "repo")
    if not is_valid_repo_id(repo.get("name")):
        raise PayloadError(f"repo.name must be a Hub repo id: {REPO_ID_RULES}")
    refs = payload.get("updatedRefs")
    updated_refs = None
    if isinstance(refs, list):
        updated_refs = tuple(
            (str(ref["ref"]), ref.get("newSha") if isinstance(ref.get("newSha"), str) else None)
            for ref in refs
            if isinstance(ref, dict) and isinstance(ref.get("ref"), str)
        )
    config = payload.get("updatedConfig")
    return HubEvent(
        scope=_text(event, "scope", "event"),
        action=_text(event, "action", "event"),
        repo_type=_text(repo, "type", "repo"),
        repo_name=repo_name,
        head_sha=(head_sha or "").strip(),
        updated_refs=updated_refs,
        updated_config=config if isinstance(config, dict) else None,
    )


def hub_event_triage(event: HubEvent) -> Triage:
    """Whether `event` announces new content on a model repo's `main` (pure: no database,
    no watch matching). The reason names the event and why it is taken or ignored."""
    if event.repo_type != "model":
        return Triage(False, f"{event.repo_name} is a {event.repo_type} repo, not a model")
    scope, action = event.known_scope, event.known_action
    if scope == "repo":
        if action == "create":
            return Triage(True, "repo created")
        return Triage(False, f"repo {action}: no new content to adapt")
    if scope == "repo.content":
        if action not in ("create", "update"):
            return Triage(False, f"repo.content {action}: no new content to adapt")
        if event.updated_refs:
            main = [sha for ref, sha in event.updated_refs if ref == MAIN_REF]
            if not main:
                refs = ", ".join(ref for ref, _ in event.updated_refs)
                return Triage(False, f"updated {refs}, not {MAIN_REF}")
            if main[0] is None:
                return Triage(False, f"{MAIN_REF} was deleted")
        return Triage(True, f"new content on {MAIN_REF}")
    if scope == "repo.config":
        if not event.updated_config:
            return Triage(False, "repo.config update with an empty updatedConfig: nothing changed")
        if event.updated_config.get("private") is False:
            return Triage(True, "repo made public")
        keys = ", ".join(sorted(event.updated_config))
        return Triage(False, f"repo.config update of {keys}: no new content to adapt")
    return Triage(False, f"{event.scope} events are not repo content")


def watch_for_repo(repo_id: str) -> HubWatch | None:
    """The first enabled Hugging Face watch (by name) whose org (`author`, compared as the
    Hub compares repo ids: ignoring case) and `repo_pattern` both admit `repo_id`; a watch
    with neither watches every repo, as its listing would."""
    org = repo_id.partition("/")[0].lower() if "/" in repo_id else ""
    for watch in HubWatch.objects.filter(kind=HubKind.HUGGINGFACE, enabled=True).select_related(
        "pool"
    ):
        if watch.author and watch.author.lower() != org:
            continue
        if repo_matches(repo_id, watch.repo_pattern):
            return watch
    return None


def huggingface_delivery_handle(*, endpoint: WebhookEndpoint, incoming: Incoming) -> Outcome:
    """Verify, parse, triage and record one Hub delivery to `endpoint`; return its outcome.

    401 (wrong or missing `X-Webhook-Secret`), 400 (malformed body, missing field), 200
    "ignored" (not a model's main, not watched, the pool disabled, the watch's endpoint not
    a configured hub), 200 "duplicate" (the
    revision is a release already: its latest job), 202 "coalescing" (joined the repo's
    pending upload; the settle task is queued after commit). Every delivery is stored.
    Raises nothing of its own (database errors propagate).
    """
    record = DeliveryRecorder(
        endpoint=endpoint,
        incoming=incoming,
        delivery_id=incoming.raw_headers.get("x-request-id", ""),
    )
    # The secret first: nothing of an unauthenticated body is believed, parsed or kept whole.
    if not secret_matches(incoming.raw_headers.get(SECRET_HEADER, ""), endpoint.secret_digest):
        return record(rejected(401, WRONG_SECRET_REASON))
    record = record.authenticated_()
    try:
        event = hub_event_parse(incoming.body)
        triage = hub_event_triage(event)
        if triage.take and not event.head_sha:
            raise PayloadError(f"repo.headSha is required on {event.event} events")
    except PayloadError as exc:
        return record(rejected(400, f"malformed Hub webhook: {exc}"))

    fields = {"event": event.event, "repo_id": event.repo_name, "revision": event.head_sha}
    if not triage.take:
        return record(Outcome(200, DeliveryVerdict.IGNORED, triage.reason), **fields)
    watch = watch_for_repo(event.repo_name)
    if watch is None:
        reason = f"{event.repo_name} is not in a watched org or pattern (no enabled Hub watch)"
        return record(Outcome(200, DeliveryVerdict.IGNORED, reason), **fields)
    pool = endpoint.pool or watch.pool
    if not pool.enabled:
        reason = f"pool {pool.name!r} is disabled: enable it, or give the endpoint another pool"
        return record(Outcome(200, DeliveryVerdict.IGNORED, reason), **fields)
    refusal = watch.endpoint_refusal(resolve=False)
    if refusal:  # a watch saved before the rules, or changed in the database
        reason = f"watch {watch.name!r} cannot be used: {refusal}"
        return record(Outcome(200, DeliveryVerdict.IGNORED, reason), **fields)
    hub_endpoint = canonical_endpoint(hub_spec_for_watch(watch))
    return _coalesce(
        endpoint=endpoint,
        incoming=incoming,
        event=event,
        why=triage.reason,
        watch=watch,
        pool=pool,
        hub_endpoint=hub_endpoint,
        record=record,
        fields=fields,
    )


def _coalesce(
    *,
    endpoint: WebhookEndpoint,
    incoming: Incoming,
    event: HubEvent,
    why: str,
    watch: HubWatch,
    pool: AcceleratorPool,
    hub_endpoint: str,
    record: DeliveryRecorder,
    fields: dict[str, str],
) -> Outcome:
    """A taken delivery: "duplicate" when its revision is a release already, else it joins
    (or opens) the repo's pending upload; recorded with `fields` (event, repo, revision)."""
    repo_id, revision = event.repo_name, event.head_sha
    release = ModelRelease.objects.filter(
        hub_kind=HubKind.HUGGINGFACE, hub_endpoint=hub_endpoint, repo_id=repo_id, revision=revision
    ).first()
    if release is not None:
        job = release_newest_job(release)
        reason = f"{repo_id}@{revision[:12]} is a release already" + (
            f" (job {job.pk}): no new job" if job else ": no new job"
        )
        outcome = Outcome(200, DeliveryVerdict.DUPLICATE, reason, release=release, job=job)
        return record(outcome, **fields)
    with transaction.atomic():
        upload, created = uploads.pending_upload_record(
            endpoint=endpoint,
            watch=watch,
            pool=pool,
            hub_endpoint=hub_endpoint,
            repo_id=repo_id,
            revision=revision,
            at=incoming.received_at,
        )
        quiet_s = endpoint.quiet_period_s
        reason = (
            f"{why}; waiting for {repo_id} to be quiet for {quiet_s} s and complete at "
            f"{revision[:12]} ({upload.deliveries} deliveries so far)"
        )
        outcome = record(
            Outcome(202, DeliveryVerdict.COALESCING, reason, extra={"pending_upload": upload.pk}),
            **fields,
        )
        if created:
            # One settle chain per upload: later deliveries only move its quiet period on.
            uploads.pending_upload_schedule(pending_upload_id=upload.pk, countdown_s=quiet_s)
    return outcome
