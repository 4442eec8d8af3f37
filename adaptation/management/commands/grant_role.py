"""`python manage.py grant_role USER engineer|manager|admin [--create] [--revoke]`: give a
user a day0 role (its group; engineer and admin also set `is_staff` for the admin site), or
take it away. `--create` makes the user first when there is none: a bot that only uses an API
token, or a person who then sets a password with `manage.py changepassword USER`."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from adaptation.roles import ROLES, role_grant, role_revoke, user_roles


class Command(BaseCommand):
    help = (
        "Give USER a day0 role: engineer (trigger, cancel, re-run, watches), manager (read "
        "everything) or admin (everything, users, endpoints, pools); engineer and admin also "
        "set is_staff for the admin site. --revoke takes the role away."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("role", choices=ROLES)
        parser.add_argument(
            "--revoke", action="store_true", help="Take the role away instead of granting it."
        )
        parser.add_argument(
            "--create",
            action="store_true",
            help="Create the user when there is none, without a password (it cannot sign in "
            "until `manage.py changepassword USER`; an API token works at once).",
        )

    def handle(
        self, *args, username: str, role: str, revoke: bool, create: bool, **options
    ) -> None:
        model = get_user_model()
        try:
            user = model.objects.get(**{model.USERNAME_FIELD: username})
        except model.DoesNotExist:
            if not create or revoke:
                raise CommandError(
                    f"No user {username!r}; add --create to make one (or `manage.py "
                    "createsuperuser` for a superuser)."
                ) from None
            user = model.objects.create_user(**{model.USERNAME_FIELD: username})
            self.stdout.write(
                f"Created {username} without a password: `manage.py changepassword {username}` "
                "lets a person sign in; `manage.py create_api_token "
                f"{username}` gives a bot its API token."
            )
        if revoke:
            role_revoke(user=user, role=role)
        else:
            role_grant(user=user, role=role)
        user.refresh_from_db()
        held = ", ".join(user_roles(user)) or "none"
        staff = "yes" if user.is_staff else "no"
        self.stdout.write(f"{username}: roles {held}; staff (admin site) {staff}.")
