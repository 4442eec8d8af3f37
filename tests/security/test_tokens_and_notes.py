"""API tokens and known-limitation notes by role.

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
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.test import RequestFactory
from django.urls import reverse
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from adaptation.admin.tokens import ApiTokenAdmin
from adaptation.models import KnownLimitation
from adaptation.roles import EDIT_ANY_LIMITATION, ENGINEER, role_grant
from adaptation.services import limitations
from tests import dom
from tests.factories import make_release

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
    keys = [
        code.text
        for code in dom.find_all(html, "code")
        if code.parent and code.parent.text.startswith("Secret of the API token of ")
    ]
    assert keys, "no key shown"
    assert len(keys[0]) == 64 and set(keys[0]) <= set("0123456789abcdef"), keys[0]
    return keys[0]


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


# --- known-limitation notes -----------------------------------------------------------------

EDIT_FORM = {
    "limitation-title": "Rewritten",
    "limitation-severity": "minor",
    "limitation-pool": "",
    "limitation-status": "mitigated",
    "limitation-body": "Rewritten body.",
}


@pytest.fixture
def erin(django_user_model):
    """A second engineer."""
    user = django_user_model.objects.create_user(username="erin")
    role_grant(user=user, role=ENGINEER)
    return django_user_model.objects.get(pk=user.pk)


@pytest.fixture
def eli_note(cast):
    """eli's open note on a release."""
    return limitations.limitation_create(
        release=make_release(), author=cast.eli, title="Needs firmware 1.3", body="Hangs."
    )


def snapshot(note) -> tuple:
    note = KnownLimitation.objects.get(pk=note.pk)
    return (note.title, note.body, note.severity, note.status, note.updated_at, note.author_id)


def editor(who: str, cast, erin, root):
    return {"erin": erin, "root": root}.get(who) or cast.users[who]


@pytest.mark.parametrize(
    ("who", "allowed"),
    [("mona", False), ("erin", False), ("eli", True), ("ada", True), ("root", True)],
)
def test_who_edits_a_person_s_note_on_its_pages(client, cast, erin, root, eli_note, who, allowed):
    client.force_login(editor(who, cast, erin, root))
    edit = reverse("adaptation:limitation_edit", args=[eli_note.pk])
    before = snapshot(eli_note)

    page = client.get(edit)
    posted = client.post(edit, EDIT_FORM)

    note = KnownLimitation.objects.get(pk=eli_note.pk)
    if not allowed:
        assert (page.status_code, posted.status_code) == (403, 403)
        assert snapshot(note) == before
        assert not note.status_changes.exists()
        return
    assert page.status_code == 200 and posted.status_code == 302
    assert (note.title, note.body, note.severity, note.status) == (
        "Rewritten",
        "Rewritten body.",
        "minor",
        "mitigated",
    )
    assert note.author == cast.eli  # still eli's note, whoever edited it
    change = note.status_changes.get()
    assert (change.status, change.changed_by, change.changed_by_name) == (
        "mitigated",
        editor(who, cast, erin, root),
        editor(who, cast, erin, root).username,
    )


@pytest.mark.parametrize(("who", "allowed"), [("erin", False), ("eli", True), ("ada", True)])
def test_who_sets_a_person_s_note_s_status_with_the_quick_buttons(
    client, cast, erin, root, eli_note, who, allowed
):
    client.force_login(editor(who, cast, erin, root))
    before = snapshot(eli_note)
    started = timezone.now()

    response = client.post(
        reverse("adaptation:limitation_set_status", args=[eli_note.pk]), {"status": "resolved"}
    )

    note = KnownLimitation.objects.get(pk=eli_note.pk)
    if not allowed:
        assert response.status_code == 403
        assert snapshot(note) == before and not note.status_changes.exists()
        return
    assert response.status_code == 302
    assert note.status == "resolved"
    change = note.status_changes.get()
    assert change.changed_by == cast.users[who]
    assert started <= change.changed_at <= timezone.now()


def test_the_panel_offers_edits_only_on_notes_the_viewer_may_edit(client, cast, erin, eli_note):
    own = limitations.limitation_create(release=eli_note.release, author=erin, title="Erin's")
    stage = KnownLimitation.objects.create(
        release=eli_note.release, title="found", key="analyze:mtp", stage="analyze"
    )
    client.force_login(erin)
    html = client.get(f"/releases/{eli_note.release_id}/").content.decode()
    assert f'id="limitation-{eli_note.pk}-edit"' not in html
    assert f'id="limitation-{eli_note.pk}-resolved"' not in html
    assert f'id="limitation-{own.pk}-edit"' in html and f'id="limitation-{own.pk}-resolved"' in html
    assert f'id="limitation-{stage.pk}-resolved"' in html  # a stage's note: status, any engineer

    client.force_login(cast.ada)
    html = client.get(f"/releases/{eli_note.release_id}/").content.decode()
    assert f'id="limitation-{eli_note.pk}-edit"' in html


def test_another_engineer_sees_the_note_read_only_in_the_admin_and_cannot_change_it(
    client, cast, erin, eli_note
):
    url = f"/admin/adaptation/knownlimitation/{eli_note.pk}/change/"
    before = snapshot(eli_note)
    client.force_login(erin)
    page = client.get(url)
    assert page.status_code == 200
    assert 'name="title"' not in page.content.decode()  # a view, not a form
    posted = client.post(url, {"title": "Erin was here", "severity": "info", "status": "resolved"})
    assert posted.status_code == 403
    assert snapshot(eli_note) == before


def test_an_admin_changes_the_status_in_the_admin_and_it_is_recorded(client, cast, eli_note):
    url = f"/admin/adaptation/knownlimitation/{eli_note.pk}/change/"
    client.force_login(cast.ada)
    data = {
        "release": eli_note.release_id,
        "pool": "",
        "title": eli_note.title,
        "severity": eli_note.severity,
        "status": "resolved",
        "body": eli_note.body,
    }
    assert client.post(url, data).status_code == 302
    note = KnownLimitation.objects.get(pk=eli_note.pk)
    assert note.status == "resolved" and note.author == cast.eli
    change = note.status_changes.get()
    assert (change.status, change.changed_by) == ("resolved", cast.ada)
    page = client.get(url).content.decode()
    assert "Resolved by ada, " in page  # the note's status history

    # Saving again without a new status records nothing more.
    assert client.post(url, data | {"title": "Same status"}).status_code == 302
    assert note.status_changes.count() == 1


def test_the_service_refuses_another_engineer_s_edit(cast, erin, eli_note):
    with pytest.raises(PermissionDenied, match="Only its author or an admin"):
        limitations.limitation_update(limitation=eli_note, by=erin, status="resolved")
    assert KnownLimitation.objects.get(pk=eli_note.pk).status == "open"


def test_a_note_whose_author_is_gone_is_an_admin_s_to_edit(client, cast, erin, eli_note):
    cast.eli.delete()
    edit = reverse("adaptation:limitation_edit", args=[eli_note.pk])
    client.force_login(erin)
    assert client.post(edit, EDIT_FORM).status_code == 403
    client.force_login(cast.ada)
    assert client.post(edit, EDIT_FORM).status_code == 302


def test_only_admins_hold_the_edit_anyone_s_note_permission(cast, erin, root):
    assert cast.ada.has_perm(EDIT_ANY_LIMITATION) and root.has_perm(EDIT_ANY_LIMITATION)
    assert not erin.has_perm(EDIT_ANY_LIMITATION)
    assert not cast.mona.has_perm(EDIT_ANY_LIMITATION)


def test_the_release_page_and_the_api_show_who_changed_the_status_and_when(client, cast, eli_note):
    status_url = reverse("adaptation:limitation_set_status", args=[eli_note.pk])
    client.force_login(cast.eli)
    client.post(status_url, {"status": "mitigated"})
    client.force_login(cast.ada)
    client.post(status_url, {"status": "open"})
    first, latest = eli_note.status_changes.order_by("changed_at", "id")
    assert (first.changed_by_name, latest.changed_by_name) == ("eli", "ada")

    client.force_login(cast.mona)
    html = client.get(f"/releases/{eli_note.release_id}/").content.decode()
    text = dom.text(html, f'li[class^="limitation"]#limitation-{eli_note.pk}')
    assert "written by eli" in text
    assert f"reopened by ada {latest.changed_at:%Y-%m-%d %H:%M} UTC" in text

    # The API's release detail lists open notes, with the latest change.
    body = cast.api("mona").get(f"/api/v1/releases/{eli_note.release_id}/").json()
    (note,) = body["limitations"]
    assert (note["author"], note["status"], note["status_changed_by"]) == ("eli", "open", "ada")
    assert datetime.fromisoformat(note["status_changed_at"]) == latest.changed_at
