"""Stored secrets: digests compare, ciphertexts round-trip, a changed key is refused clearly."""

from __future__ import annotations

import base64

import pytest

from adaptation.secrets import (
    SecretUnreadable,
    new_shared_secret,
    new_signing_secret,
    secret_decrypt,
    secret_digest,
    secret_encrypt,
    secret_matches,
)


def test_digest_matches_only_the_same_secret() -> None:
    secret = new_shared_secret()
    digest = secret_digest(secret)
    assert secret not in digest
    assert secret_matches(secret, digest)
    assert not secret_matches(secret + "x", digest)
    assert not secret_matches(secret, "")


def test_signing_secret_has_the_standard_webhooks_form() -> None:
    secret = new_signing_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"))) == 24


def test_ciphertext_round_trips_and_hides_the_secret() -> None:
    secret = new_signing_secret()
    token = secret_encrypt(secret)
    assert secret not in token
    assert secret_decrypt(token) == secret


def test_changed_key_is_refused_with_the_reason(settings) -> None:
    token = secret_encrypt("whsec_abc")
    settings.DAY0_SECRETS_KEY = "another key"
    with pytest.raises(SecretUnreadable, match="DAY0_SECRETS_KEY"):
        secret_decrypt(token)
    assert not secret_matches("whsec_abc", secret_digest("whsec_abc") + "0")
