"""Roles as groups: what each holds, kept in sync on every migrate, and `grant_role`."""

from __future__ import annotations

import io

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import CommandError, call_command

from adaptation.models import AdaptationJob
from adaptation.roles import (
    ADMIN_ONLY_MODELS,
    ROLES,
    role_grant,
    role_revoke,
    roles_sync,
    user_roles,
)

pytestmark = pytest.mark.django_db


def perms(role: str) -> set[str]:
    return {
        f"{app}.{codename}"
        for app, codename in Group.objects.get(name=role).permissions.values_list(
            "content_type__app_label", "codename"
        )
    }


def adaptation_models() -> list[str]:
    return [m._meta.model_name for m in apps.get_app_config("adaptation").get_models()]


def test_migrate_made_the_three_groups():
    assert sorted(Group.objects.filter(name__in=ROLES).values_list("name", flat=True)) == [
        "admin",
        "engineer",
        "manager",
    ]


def test_a_manager_reads_every_day0_model_but_the_admin_only_ones_and_nothing_more():
    assert perms("manager") == {
        f"adaptation.view_{m}" for m in adaptation_models() if m not in ADMIN_ONLY_MODELS
    }
    assert "adaptation.view_webhookdelivery" in perms("manager")
    for model in ("webhookendpoint", "notificationsubscription", "notificationdelivery"):
        assert f"adaptation.view_{model}" not in perms("manager") | perms("engineer")
        assert f"adaptation.view_{model}" in perms("admin")


def test_an_engineer_reads_everything_and_triggers_cancels_reruns_and_edits_watches():
    actions = {
        "adaptation.trigger_job",
        "adaptation.cancel_job",
        "adaptation.rerun_stage",
        "adaptation.add_hubwatch",
        "adaptation.change_hubwatch",
        "adaptation.change_releasenotesadditions",  # people's additions to release notes
        "adaptation.add_knownlimitation",  # their own notes; a stage's only in status
        "adaptation.change_knownlimitation",
    }
    assert perms("engineer") == perms("manager") | actions


def test_an_admin_holds_every_day0_permission_users_and_tokens_but_not_group_edits():
    admin = perms("admin")
    ours = {
        f"adaptation.{codename}"
        for codename in Permission.objects.filter(content_type__app_label="adaptation").values_list(
            "codename", flat=True
        )
    }
    assert ours <= admin
    for perm in (
        "adaptation.add_webhookendpoint",
        "adaptation.delete_webhookendpoint",
        "adaptation.change_acceleratorpool",
        "adaptation.add_acceleratorkind",
        "adaptation.change_team",
        "adaptation.add_notificationsubscription",
        "auth.add_user",
        "auth.change_user",
        "auth.view_group",
        "knox.add_authtoken",
        "knox.delete_authtoken",
    ):
        assert perm in admin, perm
    # What a role may do is code (roles_sync): only a superuser edits groups and permissions.
    for perm in ("auth.add_group", "auth.change_group", "auth.delete_group",
                 "auth.change_permission"):  # fmt: skip
        assert perm not in admin, perm
    assert "adaptation.add_webhookendpoint" not in perms("engineer")
    assert "adaptation.change_acceleratorpool" not in perms("engineer")
    assert not any(p.startswith("django_celery_beat.") for p in admin)


def test_sync_is_idempotent_and_puts_back_a_group_edited_by_hand():
    before = {role: perms(role) for role in ROLES}
    engineer = Group.objects.get(name="engineer")
    engineer.permissions.add(Permission.objects.get(codename="delete_modelrelease"))
    engineer.permissions.remove(Permission.objects.get(codename="trigger_job"))

    roles_sync()
    roles_sync()

    assert {role: perms(role) for role in ROLES} == before
    assert Group.objects.filter(name="engineer").count() == 1


def test_a_permission_added_later_is_granted_on_the_next_migrate():
    job_type = ContentType.objects.get_for_model(AdaptationJob)
    Permission.objects.create(
        codename="view_reports", name="Can view reports", content_type=job_type
    )
    assert "adaptation.view_reports" not in perms("manager")

    call_command("migrate", verbosity=0)

    assert "adaptation.view_reports" in perms("manager")
    assert "adaptation.view_reports" in perms("admin")


def test_grant_and_revoke_roles(django_user_model):
    eli = django_user_model.objects.create_user(username="eli")
    role_grant(user=eli, role="engineer")
    eli = django_user_model.objects.get(pk=eli.pk)  # a fresh permission cache
    assert eli.has_perm("adaptation.trigger_job")
    assert eli.is_staff  # watches are edited in the admin site
    assert not eli.has_perm("adaptation.add_webhookendpoint")
    assert user_roles(eli) == ["engineer"]

    role_grant(user=eli, role="admin")
    eli = django_user_model.objects.get(pk=eli.pk)
    assert eli.is_staff and eli.has_perm("adaptation.add_webhookendpoint")
    role_revoke(user=eli, role="admin")
    eli = django_user_model.objects.get(pk=eli.pk)
    assert eli.is_staff and user_roles(eli) == ["engineer"]  # still an engineer
    role_revoke(user=eli, role="engineer")
    eli = django_user_model.objects.get(pk=eli.pk)
    assert not eli.is_staff and user_roles(eli) == []

    mona = django_user_model.objects.create_user(username="mona")
    role_grant(user=mona, role="manager")
    mona.refresh_from_db()
    assert not mona.is_staff  # managers read the pages and the API

    with pytest.raises(ValueError, match="Unknown role 'boss'"):
        role_grant(user=eli, role="boss")


def test_grant_makes_a_missing_group(django_user_model):
    Group.objects.filter(name="manager").delete()
    mona = django_user_model.objects.create_user(username="mona")
    role_grant(user=mona, role="manager")
    mona = django_user_model.objects.get(pk=mona.pk)
    assert mona.has_perm("adaptation.view_adaptationjob")
    assert not mona.has_perm("adaptation.trigger_job")


def test_grant_role_command(django_user_model):
    django_user_model.objects.create_user(username="ada")
    out = io.StringIO()
    call_command("grant_role", "ada", "admin", stdout=out)
    assert out.getvalue() == "ada: roles admin; staff (admin site) yes.\n"
    ada = django_user_model.objects.get(username="ada")
    assert ada.is_staff and ada.has_perm("auth.change_user")

    out = io.StringIO()
    call_command("grant_role", "ada", "admin", "--revoke", stdout=out)
    assert out.getvalue() == "ada: roles none; staff (admin site) no.\n"

    with pytest.raises(CommandError, match="No user 'nobody'"):
        call_command("grant_role", "nobody", "manager")
    with pytest.raises(CommandError, match="invalid choice: 'boss'"):
        call_command("grant_role", "ada", "boss")


def test_grant_role_creates_a_user_without_a_password_on_request(django_user_model):
    out = io.StringIO()
    call_command("grant_role", "ci-bot", "engineer", "--create", stdout=out)

    bot = django_user_model.objects.get(username="ci-bot")
    assert not bot.has_usable_password()
    assert bot.has_perm("adaptation.trigger_job")
    assert "Created ci-bot without a password" in out.getvalue()
    with pytest.raises(CommandError, match="add --create"):
        call_command("grant_role", "nobody", "manager", "--revoke", "--create")


def test_a_superuser_keeps_staff_when_leaving_the_admin_role(django_user_model):
    root = django_user_model.objects.create_user(username="root", is_staff=True, is_superuser=True)
    role_grant(user=root, role="admin")
    role_revoke(user=root, role="admin")
    root.refresh_from_db()
    assert root.is_staff
