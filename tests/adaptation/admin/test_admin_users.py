"""The admin's user pages: the admin role manages users and their roles (groups), but only a
superuser grants superuser status or single permissions, or changes a superuser."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from django.urls import reverse

pytestmark = pytest.mark.django_db


def change_url(user) -> str:
    return reverse("admin:auth_user_change", args=[user.pk])


def form(user, **fields) -> dict:
    """The user change form's fields, as the page posts them."""
    data = {
        "username": user.username,
        "first_name": "",
        "last_name": "",
        "email": "",
        "is_active": "on",
        "is_staff": "on",
        "groups": [str(g.pk) for g in user.groups.all()],
        "last_login_0": "",
        "last_login_1": "",
        "date_joined_0": user.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": user.date_joined.strftime("%H:%M:%S"),
    }
    data.update(fields)
    return data


def test_an_admin_cannot_make_itself_superuser_or_grant_itself_permissions(client, cast):
    ada = cast.ada
    client.force_login(ada)
    page = client.get(change_url(ada)).content.decode()
    assert 'name="is_superuser"' not in page and 'name="user_permissions"' not in page

    every = [str(pk) for pk in Permission.objects.values_list("pk", flat=True)]
    response = client.post(
        change_url(ada), form(ada, is_superuser="on", user_permissions=every, first_name="Ada")
    )

    assert response.status_code == 302
    ada.refresh_from_db()
    assert ada.first_name == "Ada"  # the rest of the form saved
    assert ada.is_superuser is False
    assert ada.user_permissions.count() == 0


def test_an_admin_still_gives_roles_through_groups(client, cast):
    client.force_login(cast.ada)
    nina = cast.nina
    engineer = Group.objects.get(name="engineer")
    response = client.post(change_url(nina), form(nina, groups=[str(engineer.pk)]))
    assert response.status_code == 302
    assert list(nina.groups.values_list("name", flat=True)) == ["engineer"]


def test_an_admin_cannot_change_or_delete_a_superuser(client, cast, django_user_model):
    root = django_user_model.objects.create_superuser(username="root", password="x" * 12)
    client.force_login(cast.ada)

    page = client.get(change_url(root))
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()  # view only
    assert client.post(change_url(root), form(root, is_staff="")).status_code == 403
    password = reverse("admin:auth_user_password_change", args=[root.pk])
    assert client.post(password, {"password1": "y" * 12, "password2": "y" * 12}).status_code == 403
    delete = reverse("admin:auth_user_delete", args=[root.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    root.refresh_from_db()
    assert root.is_staff and root.check_password("x" * 12)


def test_a_superuser_still_grants_superuser_status(client, cast, django_user_model):
    root = django_user_model.objects.create_superuser(username="root", password="x" * 12)
    client.force_login(root)
    ada = cast.ada
    assert 'name="is_superuser"' in client.get(change_url(ada)).content.decode()
    assert client.post(change_url(ada), form(ada, is_superuser="on")).status_code == 302
    ada.refresh_from_db()
    assert ada.is_superuser is True
