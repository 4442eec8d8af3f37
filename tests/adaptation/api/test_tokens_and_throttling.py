"""Token authentication (`create_api_token`, revocation, malformed keys) and request
throttling."""

from __future__ import annotations

import io
import re

import pytest
from django.core.cache import cache
from django.core.management import call_command
from knox.models import AuthToken
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

URL = "/api/v1/releases/"


def with_token(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def created_token(*args: str) -> str:
    out = io.StringIO()
    call_command("create_api_token", *args, stdout=out)
    *_, said, key = out.getvalue().splitlines()
    assert said.startswith("API token of ") and "shown only this once" in said, out.getvalue()
    assert re.fullmatch(r"[0-9a-f]{64}", key), key
    return key


def test_create_api_token_makes_a_working_token_and_replace_revokes_the_others(cast):
    AuthToken.objects.filter(user=cast.mona).delete()
    first = created_token("mona")
    assert with_token(first).get(URL).status_code == 200
    assert AuthToken.objects.get(user=cast.mona).expiry is None

    second = created_token("--replace", "mona")
    assert second != first
    assert with_token(second).get(URL).status_code == 200
    old = with_token(first).get(URL)
    assert old.status_code == 401
    assert old.json()["error"] == {"code": "authentication_failed", "message": "Invalid token."}
    assert AuthToken.objects.filter(user=cast.mona).count() == 1


def test_create_api_token_days_sets_an_expiry_and_an_expired_token_fails(cast):
    from datetime import timedelta

    from django.utils import timezone

    key = created_token("--days", "30", "eli")
    token = AuthToken.objects.get(user=cast.eli, token_key=key[:15])
    left = token.expiry - timezone.now()
    assert timedelta(days=29, hours=23) < left <= timedelta(days=30)
    token.expiry = timezone.now() - timedelta(seconds=1)
    token.save()
    assert with_token(key).get(URL).status_code == 401
    assert not AuthToken.objects.filter(pk=token.pk).exists()  # knox deletes it on sight


def test_create_api_token_refuses_an_unknown_user_and_a_bad_days(cast):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="No user 'ghost'"):
        call_command("create_api_token", "ghost", stdout=io.StringIO())
    with pytest.raises(CommandError, match="must be 1 day or more"):
        call_command("create_api_token", "eli", "--days", "0", stdout=io.StringIO())


@pytest.mark.parametrize(
    "header",
    [b"Token \x00abc", "Token caf\u00e9".encode(), b"Token \xff\xfe", b"Token a'b;--"],
    ids=["nul", "non-ascii", "not-utf8", "quote"],
)
def test_a_malformed_key_is_an_invalid_token_not_a_500(cast, header):
    client = APIClient()
    response = client.get(URL, HTTP_AUTHORIZATION=header.decode("latin-1"))
    assert response.status_code == 401
    invalid = {"code": "authentication_failed", "message": "Invalid token."}
    assert response.json()["error"] == invalid


def test_a_token_may_be_sent_as_a_bearer_token(cast):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {cast.token('mona')}")
    assert client.get(URL).status_code == 200
    client.credentials(HTTP_AUTHORIZATION="Bearer not-a-token")
    wrong = client.get(URL)
    assert wrong.status_code == 401
    assert wrong.json()["error"] == {"code": "authentication_failed", "message": "Invalid token."}
    assert wrong["WWW-Authenticate"] == "Token"  # the scheme the docs name first


def test_the_schema_names_both_token_schemes(cast):
    schema = cast.api("mona").get("/api/schema/", {"format": "json"}).json()
    schemes = schema["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "The API token as a bearer token: `Authorization: Bearer <key>`.",
    }
    assert schemes["tokenAuth"] == {
        "type": "apiKey",
        "in": "header",
        "name": "Authorization",
        "description": "The API token, prefixed `Token `: `Authorization: Token <key>`.",
    }


def test_a_revoked_token_stops_working(cast):
    client = cast.api("eli")
    assert client.get(URL).status_code == 200
    AuthToken.objects.filter(user=cast.eli).delete()  # what the admin's API tokens page does
    response = client.get(URL)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


def test_a_deactivated_user_s_token_stops_working(cast):
    cast.eli.is_active = False
    cast.eli.save()
    response = cast.api("eli").get(URL)
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "User inactive or deleted."


@pytest.fixture
def low_rates(settings):
    """Two anonymous and three signed-in requests a minute; the counts start empty."""
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"anon": "2/min", "user": "3/min"},
    }
    cache.clear()
    yield
    cache.clear()


def test_signed_in_callers_are_throttled_per_user(cast, low_rates):
    mona = cast.api("mona")
    assert [mona.get(URL).status_code for _ in range(3)] == [200, 200, 200]
    throttled = mona.get(URL)
    assert throttled.status_code == 429
    assert throttled.json()["error"]["code"] == "throttled"
    assert 0 < int(throttled["Retry-After"]) <= 60
    # Another user has a count of their own.
    assert cast.api("eli").get(URL).status_code == 200


def test_anonymous_callers_and_bad_tokens_are_throttled(cast, low_rates):
    anonymous = APIClient()
    assert [anonymous.get(URL).status_code for _ in range(2)] == [401, 401]
    assert anonymous.get(URL).status_code == 429
    # Guessing tokens from the same address counts as anonymous too.
    assert with_token("0" * 40).get(URL).status_code == 429


def test_refused_calls_count_against_the_users_rate(cast, low_rates):
    nina = cast.api("nina")
    assert [nina.get(URL).status_code for _ in range(4)] == [403, 403, 403, 429]


def test_default_rates_come_from_the_environment_helpers(settings):
    rates = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]
    assert rates == {"anon": "60/min", "user": "1200/min"}


@pytest.mark.parametrize("value", ["60", "sixty/min", "0/min", "60/week"])
def test_a_malformed_rate_stops_start_up(monkeypatch, value):
    from django.core.exceptions import ImproperlyConfigured

    from day0web.env import env_rate

    monkeypatch.setenv("DAY0_API_THROTTLE_ANON", value)
    with pytest.raises(ImproperlyConfigured, match="DAY0_API_THROTTLE_ANON"):
        env_rate("DAY0_API_THROTTLE_ANON", "60/min")


def test_the_cache_url_selects_redis_or_memory(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from day0web.env import env_cache

    monkeypatch.delenv("DAY0_CACHE_URL", raising=False)
    assert env_cache("DAY0_CACHE_URL")["BACKEND"].endswith("LocMemCache")
    monkeypatch.setenv("DAY0_CACHE_URL", "redis://127.0.0.1:6379/3")
    assert env_cache("DAY0_CACHE_URL") == {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://127.0.0.1:6379/3",
    }
    monkeypatch.setenv("DAY0_CACHE_URL", "memcached://x")
    with pytest.raises(ImproperlyConfigured, match="DAY0_CACHE_URL"):
        env_cache("DAY0_CACHE_URL")
