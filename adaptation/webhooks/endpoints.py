"""Creating webhook endpoints: the one place a secret exists in the clear, once."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.urls import reverse

from adaptation.models import AcceleratorPool, WebhookEndpoint, WebhookKind
from adaptation.secrets import (
    new_shared_secret,
    new_signing_secret,
    secret_digest,
    secret_encrypt,
)


class EndpointError(ValueError):
    """An endpoint that cannot be created as asked (unknown kind, name taken), with why."""


def webhook_endpoint_create(
    *,
    name: str,
    kind: str,
    pool: AcceleratorPool | None = None,
    quiet_period_s: int | None = None,
    created_by: Any = None,
) -> tuple[WebhookEndpoint, str]:
    """Create an endpoint and its secret; return both. The secret is not kept in the clear
    (a digest for a Hub endpoint, Fernet ciphertext for a generic one) and cannot be shown
    again: the caller shows it once.

    A Hub secret is 256 random bits in URL-safe text (what the Hub's form takes); a generic
    one is a Standard Webhooks `whsec_…` key. Raises `EndpointError` for an unknown kind, a
    blank name or a name already used.
    """
    name = name.strip()
    if kind not in WebhookKind.values:
        raise EndpointError(f"Unknown kind {kind!r}; use one of {', '.join(WebhookKind.values)}.")
    if not name:
        raise EndpointError("An endpoint needs a name.")
    with transaction.atomic():
        if WebhookEndpoint.objects.filter(name=name).exists():
            raise EndpointError(f"An endpoint named {name!r} exists already.")
        endpoint = WebhookEndpoint(
            name=name,
            kind=kind,
            pool=pool,
            created_by=created_by if getattr(created_by, "pk", None) else None,
        )
        if quiet_period_s is not None:
            endpoint.quiet_period_s = quiet_period_s
        if kind == WebhookKind.HUGGINGFACE:
            secret = new_shared_secret()
            endpoint.secret_digest = secret_digest(secret)
        else:
            secret = new_signing_secret()
            endpoint.secret_ciphertext = secret_encrypt(secret)
        endpoint.save()
    return endpoint, secret


def webhook_url_path(endpoint: WebhookEndpoint) -> str:
    """The path deliveries are posted to: /webhooks/<kind>/<id>."""
    return reverse(f"webhooks:{endpoint.kind}", kwargs={"endpoint_id": endpoint.pk})


def webhook_endpoint_rotate_secret(*, endpoint: WebhookEndpoint) -> str:
    """Give `endpoint` a new secret and return it (the caller shows it once). The old secret
    stops working at once: deliveries signed with it get 401."""
    if endpoint.kind == WebhookKind.HUGGINGFACE:
        secret = new_shared_secret()
        endpoint.secret_digest, endpoint.secret_ciphertext = secret_digest(secret), ""
    else:
        secret = new_signing_secret()
        endpoint.secret_digest, endpoint.secret_ciphertext = "", secret_encrypt(secret)
    endpoint.save(update_fields=["secret_digest", "secret_ciphertext"])
    return secret


def webhook_setup_hint(endpoint: WebhookEndpoint, *, url: str) -> str:
    """How to point a sender at `endpoint` (`url`: its full URL, or its path): a Hub webhook
    (Target URL and Secret on the Hub's settings page) or a Standard Webhooks signer."""
    if endpoint.kind == WebhookKind.HUGGINGFACE:
        return (
            "On the Hugging Face Hub (https://huggingface.co/settings/webhooks), add a webhook "
            "watching the orgs or repos your hub watches cover, with the event 'Repo update': "
            f"Target URL = your day0 address + {url} (e.g. https://day0.example.com{url}), "
            "Secret = the secret above (sent back in X-Webhook-Secret)."
        )
    return (
        f'POST JSON such as {{"repo_id": "org/name", "revision": "<sha>"}} to your day0 '
        f"address + {url}, signed as Standard Webhooks (webhook-id, webhook-timestamp, "
        "webhook-signature) with the secret above: e.g. standardwebhooks' "
        "Webhook(secret).sign(msg_id, timestamp, body)."
    )
