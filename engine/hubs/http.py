"""Outbound-HTTP settings shared by hub sources: who we say we are, how long we wait, and
how long a hub asks us to back off.

`huggingface_hub` does its own HTTP; the Hugging Face source hands it these values through
its API (`library_name`/`library_version`, `timeout=`) instead of replacing its client.

`network_failure_reason` / `unreachable_message` say, in words people read on the board and in
the admin, why a hub could not be reached: the exception's classes, URLs and errno numbers
stay in the log.
"""

from __future__ import annotations

import re
import socket
import ssl
from collections.abc import Iterator, Mapping
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


# Why a connection failed, most telling first: a proxy in the way is named before the refusal
# it passes on, a name that does not resolve before the timeout class urllib3 gives it.
_PROXY = "the proxy refused the connection"
_NAME = "the name does not resolve"
_CERTIFICATE = "its TLS certificate was not accepted"
_TLS = "the TLS handshake failed"
_REFUSED = "the connection was refused"
_RESET = "the connection was reset"
_TIMEOUT = "no answer in time"
_GENERIC = "the connection failed"
_REASONS_BY_PRIORITY = (_PROXY, _NAME, _CERTIFICATE, _TLS, _REFUSED, _RESET, _TIMEOUT)

# Wrapper classes of requests, urllib3, httpx and httpx2 (the same names across them), matched
# by exact class name so that this module imports none of four HTTP stacks. Exact, not along
# the MRO: urllib3's NewConnectionError and NameResolutionError subclass ConnectTimeoutError.
_CLASS_NAMES = {
    "ProxyError": _PROXY,
    "NameResolutionError": _NAME,
    "SSLError": _TLS,
    "ConnectTimeoutError": _TIMEOUT,
    "ReadTimeoutError": _TIMEOUT,
    "ConnectTimeout": _TIMEOUT,
    "ReadTimeout": _TIMEOUT,
    "WriteTimeout": _TIMEOUT,
    "PoolTimeout": _TIMEOUT,
    "Timeout": _TIMEOUT,
}

# Last resort, for a client that re-wraps the error as text and drops the chain
# (modelscope-hub's OpenAPI client: `NetworkError(f"Connection error: {exc}")`): phrases
# urllib3, requests and the C library put in their messages, lower-cased.
_TEXT_MARKERS = (
    (_PROXY, ("proxyerror", "unable to connect to proxy")),
    (
        _NAME,
        (
            "nameresolutionerror",
            "failed to resolve",
            "name or service not known",
            "temporary failure in name resolution",
            "nodename nor servname",
            "no address associated with hostname",
            "getaddrinfo failed",
        ),
    ),
    (_CERTIFICATE, ("certificate_verify_failed", "certificate verify failed")),
    (_TLS, ("sslerror", "ssl:")),
    (_REFUSED, ("connection refused", "actively refused")),
    (_RESET, ("connection reset", "connection aborted", "remote end closed connection")),
    (_TIMEOUT, ("timed out", "timeout")),
)


def _linked_exceptions(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every exception reachable from it: `__cause__`, `__context__`, a wrapper's
    `reason` (urllib3's MaxRetryError) or `original_error` (its ProxyError), and exceptions
    among its `args` (requests' ConnectionError holds the MaxRetryError there). Each once."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        link = pending.pop(0)
        if id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        nearby = [
            link.__cause__,
            link.__context__,
            getattr(link, "reason", None),
            getattr(link, "original_error", None),
            *link.args,
        ]
        pending.extend(item for item in nearby if isinstance(item, BaseException))


def _reason_of_link(link: BaseException) -> str | None:
    """What one exception says about why the connection failed, from its type; None if its
    type does not say."""
    if isinstance(link, socket.gaierror):
        return _NAME
    if isinstance(link, ssl.SSLCertVerificationError):
        return _CERTIFICATE
    if isinstance(link, ssl.SSLError):
        return _TLS
    if isinstance(link, ConnectionRefusedError):
        return _REFUSED
    if isinstance(link, ConnectionResetError | ConnectionAbortedError | BrokenPipeError):
        return _RESET
    if isinstance(link, TimeoutError):  # socket.timeout too
        return _TIMEOUT
    return _CLASS_NAMES.get(type(link).__name__)


def network_failure_reason(exc: BaseException) -> str:
    """A short reason why a connection failed, for people: "the name does not resolve", "the
    connection was refused", "the connection was reset", "no answer in time", "its TLS
    certificate was not accepted", "the TLS handshake failed", "the proxy refused the
    connection", else "the connection failed".

    Reads the whole exception chain (see `_linked_exceptions`) by type; only when no link's
    type tells, the links' messages. Never returns a class name, URL or errno number.
    """
    links = list(_linked_exceptions(exc))
    found = {_reason_of_link(link) for link in links}
    if not found - {None}:
        texts = " ".join(str(link).lower() for link in links)
        found = {reason for reason, markers in _TEXT_MARKERS if any(m in texts for m in markers)}
    for reason in _REASONS_BY_PRIORITY:
        if reason in found:
            return reason
    return _GENERIC


def unreachable_message(endpoint: str, exc: BaseException, *, endpoint_setting: str) -> str:
    """What people read when a hub could not be reached: `cannot reach <endpoint>: <reason>.
    The hub or the network is at fault, not the release: check the network, proxy and
    <endpoint_setting>; retry later.` (`endpoint_setting`: the variable naming the hub, such
    as HF_ENDPOINT; the reason from `network_failure_reason`)."""
    return (
        f"cannot reach {endpoint}: {network_failure_reason(exc)}. The hub or the network is at"
        f" fault, not the release: check the network, proxy and {endpoint_setting}; retry later."
    )
