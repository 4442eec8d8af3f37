"""API token authentication through django-rest-knox: a key is shown once, when it is made
(`manage.py create_api_token USER`, or the admin's API tokens page), and day0 keeps only its
digest (SHA-512) and its first 15 characters, to find the row. Keys come as
`Authorization: Token <key>` (`TokenAuthentication`, tried first, so a 401 still says
`WWW-Authenticate: Token`) or, for HTTP clients and CI tools that only know bearer tokens,
`Authorization: Bearer <key>`."""

from __future__ import annotations

import re
from typing import Any

from django.utils.translation import gettext_lazy as _
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from rest_framework import exceptions

# What a key is made of: knox's hex keys (64 characters) and the 40 hex characters of the
# DRF tokens migration 0011 carried over. Anything else (a NUL, non-ASCII bytes) is an invalid
# token, refused before the database sees it: knox would decode it as UTF-8 (a 500 on
# non-UTF-8 bytes) and PostgreSQL refuses NUL characters in a query.
_KEY = re.compile(rb"[0-9A-Za-z_-]{1,128}")


class TokenAuthentication(KnoxTokenAuthentication):
    """knox's token authentication (`Authorization: Token <key>`), with a malformed key
    answered 401 "Invalid token." like an unknown one."""

    def authenticate_credentials(self, token: bytes) -> tuple[Any, Any]:
        """The user and token row of `token`; raises `AuthenticationFailed` for a malformed,
        unknown or expired key, or an inactive user."""
        if not _KEY.fullmatch(token):
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        return super().authenticate_credentials(token)


class BearerTokenAuthentication(TokenAuthentication):
    """The same API tokens, sent as `Authorization: Bearer <key>`."""

    def authenticate_header(self, request: Any) -> str:
        return "Bearer"


class TokenScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme of `TokenAuthentication`: an API key in the Authorization
    header, prefixed `Token ` (the name DRF's own token scheme had, so clients keep it)."""

    target_class = "adaptation.api.authentication.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "The API token, prefixed `Token `: `Authorization: Token <key>`.",
        }


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme of `BearerTokenAuthentication` (HTTP bearer)."""

    target_class = "adaptation.api.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "The API token as a bearer token: `Authorization: Bearer <key>`.",
        }
