"""Request rates for anonymous callers and signed-in users (tokens and sessions alike).

DRF's own throttles read their rates once, when the module is imported; these read
`REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]` (set from `DAY0_API_THROTTLE_ANON` and
`DAY0_API_THROTTLE_USER`) on every request, so a changed setting applies at once. Counts
live in Django's default cache (`DAY0_CACHE_URL`): a per-process memory cache unless Redis
is configured, in which case every web process shares them.
"""

from __future__ import annotations

from rest_framework.settings import api_settings
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle


class _RateFromSettings:
    scope: str

    def get_rate(self) -> str | None:
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)


class AnonThrottle(_RateFromSettings, AnonRateThrottle):
    """Requests without credentials, per client address (scope "anon")."""


class UserThrottle(_RateFromSettings, UserRateThrottle):
    """Requests of one signed-in user, token or session (scope "user")."""
