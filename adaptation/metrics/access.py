"""Who may read /metrics: a request carrying the bearer token `DAY0_METRICS_TOKEN`, or one
from a network of `DAY0_METRICS_ALLOWED_NETWORKS`. Either suffices; with neither configured
nobody may (the endpoint answers 404, as if it did not exist: never open by default).

The network is the connection's own address (`REMOTE_ADDR`): an `X-Forwarded-For` header is
whatever the client wrote, so it is never read. Behind a proxy every request comes from the
proxy's address: allow-list the proxy only if it is the one that scrapes, else use the token.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network, ip_address

from django.http import HttpRequest


@dataclass(frozen=True)
class Refusal:
    """Why a request may not read /metrics: the HTTP `status` (404 when metrics are off, 401
    when a token would let it in, 403 when only the network could) and a one-line reason."""

    status: int
    reason: str


def _bearer(request: HttpRequest) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _from_networks(request: HttpRequest, networks: Sequence[IPv4Network | IPv6Network]) -> bool:
    try:
        address = ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # "::ffff:10.0.0.5" on a dual-stack socket
    return any(address in network for network in networks)


def metrics_refusal(
    request: HttpRequest, *, token: str, networks: Sequence[IPv4Network | IPv6Network]
) -> Refusal | None:
    """None when `request` may read /metrics, else why not. `token` is compared in constant
    time; "" and [] mean not configured."""
    if not token and not networks:
        return Refusal(
            404, "Metrics are off: set DAY0_METRICS_TOKEN or DAY0_METRICS_ALLOWED_NETWORKS."
        )
    if networks and _from_networks(request, networks):
        return None
    if token:
        given = _bearer(request)
        if given is not None and hmac.compare_digest(given.encode(), token.encode()):
            return None
        if given is None:
            return Refusal(401, "This needs Authorization: Bearer <DAY0_METRICS_TOKEN>.")
        return Refusal(401, "The bearer token is not valid.")
    return Refusal(403, "This address is not on DAY0_METRICS_ALLOWED_NETWORKS.")
