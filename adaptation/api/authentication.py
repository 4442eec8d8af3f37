"""Token authentication as `Authorization: Bearer <key>` too: many HTTP clients and CI tools
only know bearer tokens. It is tried after DRF's `TokenAuthentication` (`Token <key>`), which
stays first, so a 401 still says `WWW-Authenticate: Token`."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import TokenAuthentication


class BearerTokenAuthentication(TokenAuthentication):
    """The same API tokens, sent as `Authorization: Bearer <key>`."""

    keyword = "Bearer"


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme of `BearerTokenAuthentication` (HTTP bearer), beside the
    `tokenAuth` scheme drf-spectacular gives `TokenAuthentication`."""

    target_class = "adaptation.api.authentication.BearerTokenAuthentication"
    name = "bearerAuth"
    priority = 1  # before drf-spectacular's own scheme for TokenAuthentication's subclasses

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "The API token as a bearer token: `Authorization: Bearer <key>`.",
        }
