"""Outbound HTTP: the one way day0 makes a request to a URL somebody else chose (notification
subscriptions; a pool's attached serving engine is checked by `resolve_checked` here and
called by the worker's serve stage).

Every request goes through `post`, which

- takes only `http` and `https` URLs;
- resolves the host once (`socket.getaddrinfo`) and refuses the request when ANY resolved
  address is private, loopback, link-local, multicast, reserved, unspecified or otherwise
  not globally routable, including such an IPv4 address inside an IPv6 one (IPv4-mapped
  `::ffff:a.b.c.d`, 6to4 `2002::/16`, NAT64 `64:ff9b::/96`, Teredo), unless the caller
  allows private networks (an admin's decision per subscription);
- connects to the address it checked, not to whatever the name resolves to a moment later
  (so DNS rebinding between check and connect cannot reach an internal address): the
  request URL's host is replaced by the checked IP while the `Host` header and, for https,
  the TLS server name (SNI, and so certificate verification) keep the original name;
- never follows redirects (a 3xx is returned to the caller as is: following it would
  bypass the address check), ignores proxy and netrc settings from the environment, says
  `User-Agent: day0/<version>`, and waits at most `DAY0_NOTIFY_TIMEOUT_S` seconds for each of
  connect, write and read.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx
from django.conf import settings

from engine.hubs.http import USER_AGENT

ALLOWED_SCHEMES = ("http", "https")

# Bytes of a response body kept for the delivery log (the body itself is not needed).
RESPONSE_EXCERPT_BYTES = 1024

# Resolved addresses tried in turn when connecting to one fails.
MAX_ADDRESSES_TRIED = 3

_NAT64 = ipaddress.ip_network("64:ff9b::/96")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class OutboundError(Exception):
    """A request that could not be made or did not complete: a malformed URL, a name that
    does not resolve, a refused connection, a timeout. `reason` says which, in words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class OutboundBlocked(OutboundError):
    """A request refused before any connection was opened: a scheme other than http/https,
    or a host resolving to a private, loopback or otherwise internal address."""


@dataclass(frozen=True)
class OutboundResponse:
    """What came back: the status code, the headers (names lower-cased), the first
    `RESPONSE_EXCERPT_BYTES` bytes of the body as text, and the address connected to."""

    status_code: int
    headers: dict[str, str] = field(default_factory=dict)
    body_excerpt: str = ""
    address: str = ""


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses carried inside an IPv6 address (mapped, 6to4, NAT64, Teredo)."""
    embedded = [ip.ipv4_mapped, ip.sixtofour]
    if ip in _NAT64:
        embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip.teredo:
        embedded.extend(ip.teredo)
    return [address for address in embedded if address is not None]


def address_blocked_reason(ip: IPAddress) -> str:
    """Why a connection to `ip` must not be made without the admin's leave ("loopback",
    "private", ...), or "" for a globally routable address."""
    if isinstance(ip, ipaddress.IPv6Address):
        for inner in _embedded_ipv4(ip):
            reason = address_blocked_reason(inner)
            if reason:
                return f"{reason} ({inner} inside {ip})"
    for flag, words in (
        ("is_unspecified", "unspecified"),
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
    ):
        if getattr(ip, flag):
            return words
    if not ip.is_global:
        return "not globally routable"
    return ""


def resolve_checked(host: str, port: int, *, allow_private_network: bool) -> list[str]:
    """The addresses `host` resolves to (IP text, in the resolver's order, each once).

    Raises `OutboundBlocked` when any of them is internal (`address_blocked_reason`) and
    `allow_private_network` is False, naming the address and why; `OutboundError` when the
    name does not resolve.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise OutboundError(f"{host} does not resolve: {exc}") from exc
    addresses: list[str] = []
    for _family, _type, _proto, _canonname, sockaddr in infos:
        # An IPv6 sockaddr may carry a zone ("fe80::1%eth0"); the zone is not the address.
        text = str(sockaddr[0]).split("%", 1)[0]
        if text not in addresses:
            addresses.append(text)
    if not addresses:
        raise OutboundError(f"{host} resolves to no address.")
    if not allow_private_network:
        for text in addresses:
            reason = address_blocked_reason(ipaddress.ip_address(text))
            if reason:
                raise OutboundBlocked(
                    f"{host} resolves to {text}, a {reason} address; requests to private "
                    "networks are refused unless an admin allows them (for this subscription, "
                    "or this pool's engine)."
                )
    return addresses


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def check_url(url: str) -> httpx.URL:
    """`url` parsed, if it is an absolute http(s) URL with a host. Raises `OutboundBlocked`
    for another scheme, `OutboundError` for a malformed URL. Resolves nothing."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise OutboundError(f"Malformed URL {url!r}: {exc}") from exc
    if parsed.scheme not in ALLOWED_SCHEMES:
        raise OutboundBlocked(
            f"Only http and https URLs are allowed, not {parsed.scheme or 'none'!r}."
        )
    if not parsed.raw_host:
        raise OutboundError(f"The URL {url!r} has no host.")
    return parsed


def post(
    url: str,
    *,
    body: bytes,
    headers: Mapping[str, str],
    allow_private_network: bool = False,
    timeout_s: float | None = None,
) -> OutboundResponse:
    """POST `body` with `headers` to `url` under the rules of this module (see its
    docstring); `timeout_s` (seconds, for each of connect, write and read) defaults to
    `DAY0_NOTIFY_TIMEOUT_S`.

    Returns the response whatever its status (a 3xx is not followed). Raises
    `OutboundBlocked` when the URL's scheme or address is refused (nothing was sent), and
    `OutboundError` when the name does not resolve, no address accepts a connection, or the
    request times out or breaks off.
    """
    parsed = check_url(url)
    host = parsed.raw_host.decode("ascii")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    addresses = resolve_checked(host, port, allow_private_network=allow_private_network)
    timeout = float(timeout_s if timeout_s is not None else settings.DAY0_NOTIFY_TIMEOUT_S)
    request_headers = {"User-Agent": USER_AGENT, **headers, "Host": parsed.netloc.decode("ascii")}
    extensions = {}
    if parsed.scheme == "https" and not _is_ip_literal(host):
        extensions["sni_hostname"] = host
    last_error = ""
    with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        for address in addresses[:MAX_ADDRESSES_TRIED]:
            request = client.build_request(
                "POST",
                parsed.copy_with(host=address),
                content=body,
                headers=request_headers,
                extensions=extensions,
            )
            try:
                return _send(client, request, address)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                why = str(exc) or type(exc).__name__
                last_error = f"cannot connect to {host} at {address}: {why}"
            except httpx.TimeoutException as exc:
                raise OutboundError(
                    f"{host} at {address} did not answer within {timeout:g} s "
                    f"({type(exc).__name__})."
                ) from exc
            except httpx.HTTPError as exc:
                raise OutboundError(
                    f"Request to {host} at {address} failed: {type(exc).__name__}: {exc}"
                ) from exc
    raise OutboundError(last_error or f"cannot connect to {host}.")


def _send(client: httpx.Client, request: httpx.Request, address: str) -> OutboundResponse:
    """Send `request` and read at most `RESPONSE_EXCERPT_BYTES` of the answer's body."""
    response = client.send(request, stream=True)
    try:
        excerpt = b""
        for chunk in response.iter_bytes():
            excerpt += chunk
            if len(excerpt) >= RESPONSE_EXCERPT_BYTES:
                break
    finally:
        response.close()
    return OutboundResponse(
        status_code=response.status_code,
        headers={name.lower(): value for name, value in response.headers.items()},
        body_excerpt=excerpt[:RESPONSE_EXCERPT_BYTES].decode("utf-8", errors="replace"),
        address=address,
    )
