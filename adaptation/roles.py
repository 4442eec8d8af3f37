"""Who may do what: day0's roles as Django groups, kept in sync with the code on `migrate`.

- `engineer`: triggers, cancels and re-runs jobs; adds and edits hub watches (in the admin
  site) and known limitations (their own notes; a stage's only in status; another person's
  note is only an admin's to edit, `EDIT_ANY_LIMITATION`); edits the additions to release
  notes; reads everything else.
- `manager`: reads everything (pages, reports, the API); triggers nothing.

"Everything" leaves out the webhook endpoints and the notification subscriptions with their
deliveries (`ADMIN_ONLY_MODELS`): an endpoint's settings and a subscription's URL (a Slack
URL is itself the secret) are the admin's to see and manage.
- `admin`: every day0 permission (webhook endpoints, pools, accelerator kinds, teams and
  subscriptions included), user and group management, API tokens.

The admin site also needs `is_staff`, which a group cannot give: `role_grant` (and
`manage.py grant_role USER ROLE`) sets it for the roles that work there, engineer and admin.

`roles_sync` makes each group hold exactly its role's permissions: it runs after every
`migrate` (a `post_migrate` receiver connected in `AdaptationConfig.ready`), so a permission
added by a later migration is granted then, and a group edited by hand in the admin is put
back. Keep custom permission sets in groups of other names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.apps import AppConfig
from django.contrib.auth.models import Group, Permission
from django.db import transaction
from django.db.models import Q

ENGINEER = "engineer"
MANAGER = "manager"
ADMIN = "admin"
ROLES = (ENGINEER, MANAGER, ADMIN)
# Roles whose members work in the admin site (watches; everything of the admin's).
STAFF_ROLES = (ENGINEER, ADMIN)

APP_LABEL = "adaptation"

# The permissions each action needs ("app_label.codename"), as pages and the API check them.
TRIGGER_JOB = "adaptation.trigger_job"
CANCEL_JOB = "adaptation.cancel_job"
RERUN_STAGE = "adaptation.rerun_stage"
ADD_LIMITATION = "adaptation.add_knownlimitation"
CHANGE_LIMITATION = "adaptation.change_knownlimitation"
# Editing another person's note (the admin role's: not among the engineer's actions).
EDIT_ANY_LIMITATION = "adaptation.edit_any_knownlimitation"
CHANGE_NOTES_ADDITIONS = "adaptation.change_releasenotesadditions"

# Models only the admin role sees: the inbound webhook endpoints, and the notification
# subscriptions (their URLs are secrets) and their deliveries (which link them).
ADMIN_ONLY_MODELS = ("webhookendpoint", "notificationsubscription", "notificationdelivery")
# Engineers' own actions, beyond reading every day0 model: known limitations included
# (adding their own notes, editing them, marking a stage's note mitigated or resolved).
_ENGINEER_ACTIONS = (
    "trigger_job",
    "cancel_job",
    "rerun_stage",
    "add_hubwatch",
    "change_hubwatch",
    "add_knownlimitation",
    "change_knownlimitation",
    "change_releasenotesadditions",
)
# Apps whose every permission the admin role holds besides day0's own: the `auth` users and
# groups, and API tokens (knox's AuthToken: listed by digest, made for anyone but a
# superuser, revoked; adaptation/admin/tokens.py)...
_ADMIN_APPS = ("auth", "knox")
# ...but for editing groups and permissions: the roles' groups are defined here, in code, so an
# admin puts users in them and sees them, and only a superuser can change what a group may do.
_ADMIN_EXCLUDED = (
    "add_group",
    "change_group",
    "delete_group",
    "add_permission",
    "change_permission",
    "delete_permission",
)


def role_permissions(role: str) -> Q:
    """The query selecting `role`'s permissions among `Permission` rows.

    Raises `ValueError` for an unknown role.
    """
    ours = Q(content_type__app_label=APP_LABEL)
    readers = ours & Q(codename__startswith="view_") & ~Q(content_type__model__in=ADMIN_ONLY_MODELS)
    if role == MANAGER:
        return readers
    if role == ENGINEER:
        return readers | (ours & Q(codename__in=_ENGINEER_ACTIONS))
    if role == ADMIN:
        return ours | (
            Q(content_type__app_label__in=_ADMIN_APPS) & ~Q(codename__in=_ADMIN_EXCLUDED)
        )
    raise ValueError(f"Unknown role {role!r}; roles: {', '.join(ROLES)}.")


def roles_sync(roles: Iterable[str] = ROLES) -> dict[str, int]:
    """Create each role's group if missing and set its permissions to exactly the role's
    (those that exist now). Idempotent. Returns the number of permissions per role."""
    counts: dict[str, int] = {}
    with transaction.atomic():
        for role in roles:
            group, _ = Group.objects.get_or_create(name=role)
            permissions = list(Permission.objects.filter(role_permissions(role)))
            group.permissions.set(permissions)
            counts[role] = len(permissions)
    return counts


def sync_roles_after_migrate(sender: AppConfig, using: str = "default", **_: Any) -> None:
    """`post_migrate` receiver (sender: the adaptation app, whose permissions Django's own
    receiver has just created): bring the role groups in line with `role_permissions`."""
    if using != "default":
        return
    roles_sync()


def role_grant(*, user: Any, role: str) -> None:
    """Put `user` in `role`'s group (made, with its permissions, if missing). The engineer
    and admin roles also make the user staff, so the admin site lets them in (where each
    sees what its permissions allow). Raises `ValueError` for an unknown role."""
    if role not in ROLES:
        raise ValueError(f"Unknown role {role!r}; roles: {', '.join(ROLES)}.")
    with transaction.atomic():
        group = Group.objects.filter(name=role).first()
        if group is None:
            roles_sync([role])
            group = Group.objects.get(name=role)
        user.groups.add(group)
        if role in STAFF_ROLES and not user.is_staff:
            user.is_staff = True
            user.save(update_fields=["is_staff"])


def role_revoke(*, user: Any, role: str) -> None:
    """Take `user` out of `role`'s group. Leaving the last role that works in the admin site
    (`STAFF_ROLES`) also ends staff access, except for a superuser. Raises `ValueError` for
    an unknown role."""
    if role not in ROLES:
        raise ValueError(f"Unknown role {role!r}; roles: {', '.join(ROLES)}.")
    with transaction.atomic():
        user.groups.remove(*Group.objects.filter(name=role))
        still_staff = user.groups.filter(name__in=STAFF_ROLES).exists()
        if user.is_staff and not (still_staff or user.is_superuser):
            user.is_staff = False
            user.save(update_fields=["is_staff"])


def limitation_may_edit(*, user: Any, limitation: Any) -> bool:
    """Whether `user` may change known limitation `limitation`: with `CHANGE_LIMITATION`
    (engineers and admins), a stage's note (`key` set) in status, its other fields being the
    stage's; a person's note only as its author or with `EDIT_ANY_LIMITATION` (admins), so a
    note whose author is gone is an admin's."""
    if not user.has_perm(CHANGE_LIMITATION):
        return False
    if limitation.key:
        return True
    own = limitation.author_id is not None and limitation.author_id == user.pk
    return own or user.has_perm(EDIT_ANY_LIMITATION)


def user_roles(user: Any) -> list[str]:
    """The day0 roles `user` holds, in `ROLES` order."""
    names = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
    return [role for role in ROLES if role in names]
