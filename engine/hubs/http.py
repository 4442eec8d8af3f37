"""Outbound-HTTP settings shared by hub sources: who we say we are, how long we wait, and
how long a hub asks us to back off.

`huggingface_hub` does its own HTTP; the Hugging Face source hands it these values through
its API (`library_name`/`library_version`, `timeout=`) instead of replacing its client.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from importlib.metadata import PackageNotFoundError, version

try:
    DAY0_VERSION = version("day0")
except PackageNotFoundError:  # running from a source tree that was never pip-installed
    DAY0_VERSION = "0+source"

USER_AGENT = f"day0/{DAY0_VERSION}"

# Seconds to wait for a hub to connect and to send each chunk; hubs answer metadata
# requests in well under a second, so 10 s only trips on a stalled connection.
DEFAULT_TIMEOUT_S = 10.0

# Seconds to wait after a 429 that says nothing about when to come back.
DEFAULT_RETRY_AFTER_S = 60.0

# IETF RateLimit header (draft 9, what the Hub sends): `"api";r=0;t=55`, t = seconds to reset.
_RATELIMIT_RESET_RE = re.compile(r";\s*t\s*=\s*(\d+)")


def _header(headers: Mapping[str, str], name: str) -> str | None:
    lowered = name.lower()
    for key, value in headers.items():
        if key.lower() == lowered:
            return value.strip()
    return None


def retry_after_seconds(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """Seconds a 429/503 response asks us to wait, or None when it does not say.

    Reads, in order: `Retry-After` as seconds or as an HTTP date (RFC 9110), the IETF
    `RateLimit` header's `t=` (seconds until the window resets), and the older
    `RateLimit-Reset` (seconds). A date in the past gives 0.
    """
    retry_after = _header(headers, "Retry-After")
    if retry_after:
        try:
            return max(0.0, float(retry_after))
        except ValueError:
            pass
        try:
            when = parsedate_to_datetime(retry_after)
        except (TypeError, ValueError):
            when = None
        if when is not None:
            if when.tzinfo is None:  # RFC 9110 dates are GMT
                when = when.replace(tzinfo=UTC)
            return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
    ratelimit = _header(headers, "RateLimit")
    if ratelimit and (match := _RATELIMIT_RESET_RE.search(ratelimit)):
        return float(match.group(1))
    reset = _header(headers, "RateLimit-Reset")
    if reset:
        try:
            return max(0.0, float(reset))
        except ValueError:
            return None
    return None
