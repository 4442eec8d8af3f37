"""`HF_TOKEN` goes only to the configured hub or one a registered check accepts
(`engine.hubs.trust`), through the real Hugging Face source and the local fake Hub."""

from __future__ import annotations

import pytest

from engine.hubs import HubAuthError, HubSpec, trust
from engine.hubs.huggingface import HuggingFaceSource
from tests.fakehub import FakeHub

TOKEN = "hf_fake_valid_token"  # the one the fake Hub grants
REPO = "acme/gated-7b"


@pytest.fixture
def no_app_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine alone: no check registered by the app (restored after the test)."""
    monkeypatch.setattr(trust, "_token_check", None)


@pytest.fixture
def gated(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    fake_hub.add_repo(REPO, {"config.json": b'{"model_type": "llama"}'}, gated=True)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return fake_hub


def authorizations(hub: FakeHub) -> list[str | None]:
    return [r.headers.get("authorization") for r in hub.requests]


def test_hf_token_is_not_sent_to_an_endpoint_other_than_hf_endpoint(gated, no_app_check):
    source = HuggingFaceSource(HubSpec(kind="huggingface", endpoint=gated.url))

    assert source.sends_hf_token is False
    with pytest.raises(HubAuthError):
        source.fetch_release(REPO, "main")
    assert gated.requests  # it was asked, without the token
    assert authorizations(gated) == [None] * len(gated.requests)


def test_hf_token_is_sent_to_hf_endpoint_however_it_is_spelled(gated, no_app_check, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", gated.url.replace("http://", "HTTP://") + "/")
    source = HuggingFaceSource(HubSpec(kind="huggingface", endpoint=gated.url))

    assert source.sends_hf_token is True
    assert source.fetch_release(REPO, "main").files["config.json"]
    assert set(authorizations(gated)) == {f"Bearer {TOKEN}"}


def test_a_registered_check_decides_for_other_endpoints(gated, no_app_check):
    asked: list[str] = []

    def check(endpoint: str, kind: str) -> bool:
        asked.append(endpoint)
        return True

    trust.token_check_set(check)
    source = HuggingFaceSource(HubSpec(kind="huggingface", endpoint=gated.url))
    assert source.fetch_release(REPO, "main").files["config.json"]
    assert asked == [gated.url.rstrip("/")]
    assert set(authorizations(gated)) == {f"Bearer {TOKEN}"}


def test_a_check_that_fails_sends_no_token(gated, no_app_check):
    def broken(endpoint: str, kind: str) -> bool:
        raise RuntimeError("database unreachable")

    trust.token_check_set(broken)
    source = HuggingFaceSource(HubSpec(kind="huggingface", endpoint=gated.url))
    assert source.sends_hf_token is False


def test_an_explicit_token_is_the_callers_choice(gated, no_app_check):
    source = HuggingFaceSource(HubSpec(kind="huggingface", endpoint=gated.url, token="hf_given"))
    with pytest.raises(HubAuthError):  # the fake Hub grants only its valid token
        source.fetch_release(REPO, "main")
    assert set(authorizations(gated)) == {"Bearer hf_given"}


@pytest.mark.parametrize(
    ("url", "other", "same"),
    [
        ("https://hub.example", "HTTPS://Hub.Example:443/", True),
        ("http://hub.example", "https://hub.example", False),
        ("http://127.0.0.1:8197", "http://127.1:8197", False),  # spellings never match a name
        ("http://127.0.0.1:8197", "http://2130706433:8197", False),
        ("https://hub.example", "https://user:pw@hub.example", False),  # credentials: malformed
        ("https://hub.example", "https://hub.example/?x=1", False),
        ("https://hub.example/mirror", "https://hub.example/mirror/", True),
        ("https://hub.example", "ftp://hub.example", False),
    ],
)
def test_same_hub_compares_scheme_host_port_and_path(url, other, same):
    assert trust.same_hub(url, other) is same
