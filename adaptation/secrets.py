"""Secrets that day0 must keep but never show again: webhook endpoint and notification
subscription secrets.

A Hub endpoint's secret only has to be compared (the Hub sends it verbatim), so only an
HMAC-SHA256 digest is kept. A Standard Webhooks secret (`whsec_` + base64 of 24 random bytes,
as the specification's reference libraries make them) is the signing key itself, so it is kept
encrypted with Fernet (AES-128-CBC + HMAC-SHA256, `cryptography`) under `DAY0_SECRETS_KEY`,
or a key derived from `SECRET_KEY` when that is blank.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

_DIGEST_CONTEXT = b"day0 webhook secret digest v1"
_FERNET_CONTEXT = b"day0 stored secrets v1"


class SecretUnreadable(Exception):
    """A stored secret that the current key cannot decrypt (the key was changed)."""


def new_shared_secret() -> str:
    """A random secret for a Hub webhook (URL-safe text, 256 bits)."""
    return secrets.token_urlsafe(32)


def new_signing_secret() -> str:
    """A Standard Webhooks signing secret: "whsec_" + base64 of 24 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def _key_material() -> bytes:
    return (settings.DAY0_SECRETS_KEY or settings.SECRET_KEY).encode()


def secret_digest(secret: str) -> str:
    """HMAC-SHA256 of `secret` under the secrets key, hex (64 characters)."""
    key = hmac.new(_key_material(), _DIGEST_CONTEXT, hashlib.sha256).digest()
    return hmac.new(key, secret.encode(), hashlib.sha256).hexdigest()


def secret_matches(candidate: str, digest: str) -> bool:
    """Whether `candidate` is the secret whose digest is `digest`; constant time in the
    secret's content (`hmac.compare_digest`). False for an empty digest."""
    if not digest:
        return False
    return hmac.compare_digest(secret_digest(candidate), digest)


def _fernet() -> Fernet:
    configured = settings.DAY0_SECRETS_KEY
    if configured:
        try:
            return Fernet(configured.encode())
        except ValueError:
            # Not a Fernet key itself: derive one from it, as from SECRET_KEY.
            pass
    derived = hmac.new(_key_material(), _FERNET_CONTEXT, hashlib.sha256).digest()
    return Fernet(base64.urlsafe_b64encode(derived))


def secret_encrypt(secret: str) -> str:
    """`secret` encrypted for storage (a Fernet token, text)."""
    return _fernet().encrypt(secret.encode()).decode()


def secret_decrypt(ciphertext: str) -> str:
    """The secret `secret_encrypt` stored. Raises `SecretUnreadable` when the key changed
    since (the endpoint or subscription must be given a new secret)."""
    try:
        return _fernet().decrypt(ciphertext.encode()).decode()
    except (InvalidToken, ValueError) as exc:
        raise SecretUnreadable(
            "The stored secret cannot be decrypted with the current DAY0_SECRETS_KEY / "
            "SECRET_KEY; create a new secret."
        ) from exc
