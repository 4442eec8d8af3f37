"""Admin classes for rows something other than the admin writes (the stages, the receivers,
the workers, the notifier): the admin shows them, and adds or edits none."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest


class NoAddAdmin(admin.ModelAdmin):
    """Rows made elsewhere (a job by its release's page, the API or `manage.py adapt`; a
    release by a poll, a webhook or the API): the admin adds none."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


class ReadOnlyAdmin(NoAddAdmin):
    """Rows written elsewhere: viewable (and deletable, to prune), never added or edited."""

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
