"""The named cast of permission tests: one user per role, and one with none.

- nina: signed in, no role (reads nothing in the API, no page);
- eli: engineer (triggers, cancels, re-runs; reads everything);
- mona: manager (reads everything; triggers nothing);
- ada: admin (everything, webhook endpoints included; staff for the admin site).

Each has an API token (`Cast.token`); `Cast.api(name)` is an API client sending it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from django.core.cache import cache
from knox.models import AuthToken
from rest_framework.test import APIClient

from adaptation.roles import ADMIN, ENGINEER, MANAGER, role_grant

ROLES_OF = {"nina": None, "eli": ENGINEER, "mona": MANAGER, "ada": ADMIN}


@dataclass
class Cast:
    users: dict[str, Any]
    tokens: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["users"][name]
        except KeyError:
            raise AttributeError(name) from None

    def token(self, name: str) -> str:
        return self.tokens[name]

    def api(self, name: str | None) -> APIClient:
        """An API client with `name`'s token (anonymous for None)."""
        client = APIClient()
        if name is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Token {self.tokens[name]}")
        return client


@pytest.fixture
def cast(django_user_model) -> Cast:
    """nina, eli, mona and ada, each with a token; the throttle counts are cleared."""
    cache.clear()
    users: dict[str, Any] = {}
    tokens: dict[str, str] = {}
    for name, role in ROLES_OF.items():
        # No password (hashing one costs ~0.5 s): tests sign in with force_login or tokens.
        user = django_user_model.objects.create_user(username=name)
        if role is not None:
            role_grant(user=user, role=role)
        user.refresh_from_db()
        users[name] = user
        tokens[name] = AuthToken.objects.create(user=user)[1]  # the key; the row has its digest
    return Cast(users=users, tokens=tokens)
