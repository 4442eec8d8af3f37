"""`python manage.py create_api_token USER [--replace] [--days N]`: make an API token for USER
and print its key, once: day0 keeps only its digest (django-rest-knox), so a lost key cannot
be shown again; make another. `--replace` first revokes USER's other tokens; `--days N` makes
the token expire after N days (default: it lasts until revoked).

The command runs with the server's own credentials (it could read and write the database
directly), so it is the operator's, and it makes a token for any user, a superuser included;
in the admin, only a superuser may make a token for a superuser. An unknown user exits 1.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from knox.models import AuthToken

from adaptation.management.arguments import number_of
from engine import formatting as fmt


class Command(BaseCommand):
    help = "Make an API token for USER and print its key (shown once; day0 keeps its digest)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--replace", action="store_true", help="Revoke USER's other API tokens first."
        )
        parser.add_argument(
            "--days",
            type=number_of("days", minimum=1),
            default=None,
            help="Expire after N days (default: never).",
        )

    def handle(self, *args, username: str, replace: bool, days: int | None, **options) -> None:
        model = get_user_model()
        try:
            user = model.objects.get(**{model.USERNAME_FIELD: username})
        except model.DoesNotExist:
            raise CommandError(
                f"No user {username!r}; `manage.py grant_role {username} ROLE --create` makes "
                "one with a role."
            ) from None
        with transaction.atomic():
            revoked = AuthToken.objects.filter(user=user).delete()[0] if replace else 0
            expiry = timedelta(days=days) if days else None
            _, key = AuthToken.objects.create(user=user, expiry=expiry)
        if revoked:
            self.stdout.write(f"Revoked {fmt.counted(revoked, 'earlier API token')} of {username}.")
        lasts = f"expires in {fmt.counted(days, 'day')}" if days else "lasts until revoked"
        self.stdout.write(
            f"API token of {username} ({lasts}); it is shown only this once, day0 keeps its digest:"
        )
        self.stdout.write(key)
