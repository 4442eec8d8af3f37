"""API tokens and known-limitation notes by role (issue 18, parts 4 and 5).

Tokens (django-rest-knox): who lists them in the admin, what the list and a token's page
show (never a key, nor its stored first characters), who may make one for a superuser (only a
superuser), that a key made in the admin works and is shown once, that its row holds only
the digest, and that migration 0011 carries DRF's clear keys over as digests.

Notes: a person's note is edited only by its author or an admin (the page, the quick status
buttons and the admin site), and each status change records who made it and when.

The cast (`tests.cast`): mona (manager, a reader), eli (engineer), ada (admin), and `root`,
a superuser made here.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.test import RequestFactory
from django.urls import reverse
from knox.models import AuthToken
from rest_framework.test import APIClient

from adaptation.admin.tokens import ApiTokenAdmin

pytestmark = pytest.mark.django_db

TOKENS = "/admin/knox/authtoken/"
ADD_TOKEN = "/admin/knox/authtoken/add/"
API = "/api/v1/releases/"


@pytest.fixture
def root(django_user_model):
    """A superuser (no password: tests sign in with force_login)."""
    return django_user_model.objects.create_user(username="root", is_staff=True, is_superuser=True)


def api_status(key: str) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client.get(API).status_code


def shown_key(html: str) -> str:
    """The key in the admin's one-time message ("Secret of the API token of …")."""
    found = re.search(r"Secret of the API token of .*?<code>([0-9a-f]{64})</code>", html, re.S)
    assert found, "no key shown"
    return found[1]


def mint_in_admin(client, minter, user):
    """`minter` submits the admin's add form for `user`; the followed response."""
    client.force_login(minter)
    data = {"user": user.pk, "expiry_0": "", "expiry_1": ""}
    return client.post(ADD_TOKEN, data, follow=True)


# --- tokens -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "expected"), [("mona", "login"), ("eli", 403), ("ada", 200), ("root", 200)]
)
def test_who_lists_tokens_and_the_list_shows_no_key(client, cast, root, who, expected):
    root_key = AuthToken.objects.create(user=root)[1]
    user = root if who == "root" else cast.users[who]
    client.force_login(user)
    response = client.get(TOKENS)
    if expected == "login":
        assert response.status_code == 302 and response.url.startswith("/admin/login/")
        return
    assert response.status_code == expected
    if expected != 200:
        return
    html = response.content.decode()
    for key in [*cast.tokens.values(), root_key]:
        assert key not in html and key[:15] not in html
    for token in AuthToken.objects.all():
        assert f"{token.digest[:12]}…" in html  # each listed by the start of its digest
    assert html.count('class="field-digest_prefix"') == AuthToken.objects.count()


def test_a_token_s_own_page_shows_no_key_and_cannot_be_edited(client, cast):
    token = AuthToken.objects.get(user=cast.eli)
    client.force_login(cast.ada)
    page = client.get(reverse("admin:knox_authtoken_change", args=[token.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert cast.token("eli") not in html and token.token_key not in html
    assert 'name="expiry' not in html and 'name="user"' not in html  # read-only
    posted = client.post(reverse("admin:knox_authtoken_change", args=[token.pk]), {"user": 1})
    assert posted.status_code == 403


def test_an_admin_cannot_mint_a_token_for_a_superuser(client, cast, root):
    client.force_login(cast.ada)
    form = client.get(ADD_TOKEN).content.decode()
    assert f'<option value="{cast.eli.pk}">eli</option>' in form
    assert f'<option value="{root.pk}">' not in form  # superusers are not offered

    response = mint_in_admin(client, cast.ada, root)
    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()
    assert not AuthToken.objects.filter(user=root).exists()


def test_the_admin_refuses_a_superuser_s_token_whatever_the_form_held(cast, root):
    """The save itself refuses, should a form ever let a superuser through."""
    request = RequestFactory().post(ADD_TOKEN)
    request.user = cast.ada
    token = AuthToken(user=root)
    with pytest.raises(PermissionDenied, match="Only a superuser"):
        ApiTokenAdmin(AuthToken, admin.site).save_model(request, token, form=None, change=False)
    assert not AuthToken.objects.filter(user=root).exists()


def test_a_superuser_mints_for_a_superuser_the_key_works_once_shown_and_is_not_stored(
    client, cast, root
):
    response = mint_in_admin(client, root, root)
    assert response.status_code == 200
    key = shown_key(response.content.decode())
    assert api_status(key) == 200

    token = AuthToken.objects.get(user=root)
    assert token.digest == hashlib.sha512(key.encode()).hexdigest()
    stored = [str(value) for value in AuthToken.objects.filter(pk=token.pk).values().get().values()]
    assert not any(key in value for value in stored)
    # Shown once: the next page no longer has it, and nothing can show it again.
    assert key not in client.get(TOKENS).content.decode()


def test_an_admin_mints_for_an_engineer_and_the_key_works(client, cast):
    response = mint_in_admin(client, cast.ada, cast.eli)
    key = shown_key(response.content.decode())
    assert key != cast.token("eli")
    assert api_status(key) == 200
    assert AuthToken.objects.filter(user=cast.eli).count() == 2  # the cast's and this one


def test_an_engineer_cannot_mint_a_token(client, cast):
    response = mint_in_admin(client, cast.eli, cast.eli)
    assert response.status_code == 403
    assert AuthToken.objects.filter(user=cast.eli).count() == 1


def test_drf_keys_are_carried_over_as_digests_and_keep_working(cast):
    """Migration 0011 on a database that had DRF's authtoken table."""
    migration = __import__(
        "adaptation.migrations.0011_drf_tokens_to_knox", fromlist=["drf_tokens_to_knox"]
    )
    key = "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"  # DRF's key: 40 hex characters
    created = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    stamp = "timestamp with time zone" if connection.vendor == "postgresql" else "datetime"
    with connection.cursor() as cursor:
        cursor.execute(
            f'CREATE TABLE authtoken_token ("key" varchar(40) PRIMARY KEY, created {stamp} '
            "NOT NULL, user_id integer NOT NULL)"
        )
        cursor.execute(
            'INSERT INTO authtoken_token ("key", created, user_id) VALUES (%s, %s, %s)',
            [key, connection.ops.adapt_datetimefield_value(created), cast.mona.pk],
        )
    assert api_status(key) == 401  # not a knox token yet

    migration.drf_tokens_to_knox(apps, SimpleNamespace(connection=connection))

    assert api_status(key) == 200
    token = AuthToken.objects.get(digest=hashlib.sha512(key.encode()).hexdigest())
    assert (token.user, token.token_key, token.expiry) == (cast.mona, key[:15], None)
    assert token.created == created
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM authtoken_token")
        assert cursor.fetchone()[0] == 0  # the clear keys are gone
