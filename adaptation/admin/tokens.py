"""The admin's API tokens (django-rest-knox's `AuthToken`), replacing knox's own page.

A token's key is shown once, in the message after it is made (`secret_show_once`); the row
keeps only its SHA-512 digest and the key's first characters (to find the row), and the list
shows only the start of the digest. Tokens cannot be edited: revoke one (delete) and make
another. Only a superuser may make a token for a superuser: for anyone else the user field
leaves superusers out and saving one is refused, so the admin role cannot act as a superuser
through the API.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from knox.models import AuthToken, get_digest_token
from knox.settings import CONSTANTS

from adaptation.admin.messages import secret_show_once

# How much of a token's digest the admin shows: enough to tell tokens apart.
DIGEST_SHOWN_CHARS = 12
_ADD_FIELDS = ("user", "expiry")
_VIEW_FIELDS = ("user", "digest_prefix", "created", "expiry")


def may_mint_for(*, minter: Any, user: Any) -> bool:
    """Whether `minter` may make an API token for `user`: a superuser's only a superuser."""
    return minter.is_superuser or not user.is_superuser


if admin.site.is_registered(AuthToken):
    admin.site.unregister(AuthToken)


@admin.register(AuthToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens by user, newest first, with the start of their digest; made here with a user and
    an optional expiry, the key shown once."""

    list_display = ("user", "digest_prefix", "created", "expiry")
    list_select_related = ("user",)
    search_fields = ("user__username",)
    ordering = ("-created",)

    @admin.display(description="digest (start)")
    def digest_prefix(self, token: AuthToken) -> str:
        return f"{token.digest[:DIGEST_SHOWN_CHARS]}…"

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return _ADD_FIELDS if obj is None else _VIEW_FIELDS

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return () if obj is None else _VIEW_FIELDS

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a token is made or revoked, never edited

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "user":
            users = get_user_model().objects.order_by("username")
            if not request.user.is_superuser:
                users = users.filter(is_superuser=False)
            kwargs["queryset"] = users
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request: HttpRequest, obj: AuthToken, form: Any, change: bool) -> None:
        """Make the token's key, store its digest, and show the key once. Raises
        `PermissionDenied` for a superuser's token made by anyone else (the form's choices
        already leave superusers out; this holds whatever the form was given)."""
        if change:
            raise PermissionDenied("API tokens cannot be edited: revoke one and make another.")
        if not may_mint_for(minter=request.user, user=obj.user):
            raise PermissionDenied("Only a superuser may make an API token for a superuser.")
        digest, key = get_digest_token()
        obj.digest, obj.token_key = digest, key[: CONSTANTS.TOKEN_KEY_LENGTH]
        super().save_model(request, obj, form, change)
        secret_show_once(
            request,
            owner=f"the API token of {obj.user.get_username()!r}",
            secret=key,
            then="Send it as “Authorization: Token <key>”; day0 keeps only its digest.",
        )
