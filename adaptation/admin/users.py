"""The admin's user pages, with what only a superuser may grant kept from everyone else.

The admin role manages users and groups (`adaptation.roles`), so without this its members
could tick "Superuser status" or hand themselves any single permission, on their own account
or another's, and take over a superuser's account by changing its password. Here, for a
user who is not a superuser, `is_superuser` and `user_permissions` are read-only (roles are
given through groups, which stay editable), and superusers' accounts can be seen but not
changed or deleted.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.http import HttpRequest

User = get_user_model()

# What only a superuser may change on a user.
SUPERUSER_ONLY_FIELDS = ("is_superuser", "user_permissions")


class Day0UserAdmin(UserAdmin):
    """Django's user admin; for non-superusers `SUPERUSER_ONLY_FIELDS` are read-only and
    superusers' accounts (their password included) cannot be changed or deleted."""

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        fields = tuple(super().get_readonly_fields(request, obj))
        if request.user.is_superuser:
            return fields
        return fields + tuple(f for f in SUPERUSER_ONLY_FIELDS if f not in fields)

    def _touches_a_superuser(self, request: HttpRequest, obj: Any) -> bool:
        return obj is not None and obj.is_superuser and not request.user.is_superuser

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if self._touches_a_superuser(request, obj):
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if self._touches_a_superuser(request, obj):
            return False
        return super().has_delete_permission(request, obj)


if admin.site.is_registered(User):
    admin.site.unregister(User)
admin.site.register(User, Day0UserAdmin)
