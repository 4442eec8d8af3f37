"""Who may call what: each view names the permission every action needs
(`adaptation.roles` gives them to the engineer, manager and admin groups).

Reads need the model's `view_` permission (managers, engineers, admins); writes need their
own (`trigger_job`, `cancel_job`, `rerun_stage`, the webhook endpoint permissions). An
anonymous caller gets 401 with `WWW-Authenticate: Token`; a signed-in one without the
permission 403.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

# What reading the API needs at least: the releases' `view_` permission, which every role
# holds (each list needs its own model's `view_`).
READ_API = "adaptation.view_modelrelease"


def view_permission(model: Any) -> str:
    """ "app_label.view_<model>" for a model class."""
    return f"{model._meta.app_label}.view_{model._meta.model_name}"


class ActionPermission(BasePermission):
    """The permission the view's `action_permissions` names for the current action (a
    missing action falls back to `"*"`, then to the queryset model's `view_` permission
    for reads). Signed-in users only."""

    message = "Your account does not have the permission this needs."

    def required(self, view: Any, method: str) -> str | None:
        """The permission `view`'s current action needs; None refuses the action."""
        mapping: dict[str, str] = getattr(view, "action_permissions", {})
        action = getattr(view, "action", None)
        if action in mapping:
            return mapping[action]
        if "*" in mapping:
            return mapping["*"]
        if method in ("GET", "HEAD", "OPTIONS"):
            queryset = getattr(view, "queryset", None)
            if queryset is not None:
                return view_permission(queryset.model)
        return None

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if hasattr(view, "action_map") and getattr(view, "action", None) is None:
            return True  # a method the view does not have: let it answer 405
        perm = self.required(view, request.method)
        if perm is None:
            return False
        if not user.has_perm(perm):
            self.message = f"Your account does not have the {perm} permission this needs."
            return False
        return True


class ReadsApi(BasePermission):
    """Whoever may read the API (`READ_API`: every role holds it; an account without a role
    does not): the OpenAPI schema and its docs page (`SERVE_PERMISSIONS`)."""

    message = "Your account has no day0 role: the API and its schema are for those with one."

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.has_perm(READ_API))
