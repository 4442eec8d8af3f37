"""Which hub endpoints receive the worker's hub tokens.

Each URL hub kind's token (`HubKindSpec.token_variable`: `HF_TOKEN`, or the login
`huggingface_hub` saved; `MODELSCOPE_API_TOKEN`) is a credential for the hub the operator
configured for that kind (`HubKindSpec.configured_endpoint`: `HF_ENDPOINT`, else
https://huggingface.co; `MODELSCOPE_ENDPOINT`, else https://modelscope.cn). A source sends it
to that endpoint, and to another one only when the registered check accepts it for that kind
(the Django app registers one reading its admin-managed allow-list, whose entries each serve
one kind, see `adaptation.models.hub_endpoints`). Any other endpoint is asked without a
token, so a watch or release pointing at a URL somebody typed never carries a credential
there, and one vendor's token never goes to another vendor's hub. A token put in a `HubSpec`
explicitly is the caller's own choice and is sent as given.

Redirects: `huggingface_hub` follows a redirect with the token only to the same origin or a
known Hub origin, and its HTTP client (`httpx2`) drops `Authorization` on any redirect to
another origin; tests/security/test_watch_endpoints.py checks that a redirect to another
host receives no token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from urllib.parse import urlsplit

from engine.hubs.kinds import hub_kind_spec

logger = logging.getLogger(__name__)

# A check the app registers: whether an endpoint other than the configured hub of a kind may
# receive that kind's token, called as check(endpoint, kind).
TokenCheck = Callable[[str, str], bool]

# Each hub scheme with its default port.
DEFAULT_PORTS = {"http": 80, "https": 443}

_token_check: TokenCheck | None = None


def hub_url_key(url: str) -> tuple[str, str, int, str] | None:
    """What identifies a hub URL: (scheme, host, port, path) with the scheme and host
    lower-cased, the scheme's default port filled in and the path's trailing slashes
    dropped; None for anything but an http(s) URL with a host and without credentials, a
    query or a fragment (or with a port out of range). Two spellings of one hub
    (`https://Hub.example:443/` and `https://hub.example`) have one key; the IP address
    spellings of a host (`127.1`, `2130706433`) are different keys, so they never match a
    configured name."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        return None
    return (scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme], parts.path.rstrip("/"))


def same_hub(url: str, other: str) -> bool:
    """Whether two hub URLs name one hub (`hub_url_key`); False when either is malformed."""
    key = hub_url_key(url)
    return key is not None and key == hub_url_key(other)


def token_check_set(check: TokenCheck | None) -> None:
    """Register (None: remove) the check that decides whether an endpoint other than a
    kind's configured hub may receive that kind's token: `check(endpoint, kind)`."""
    global _token_check
    _token_check = check


def token_allowed(endpoint: str, kind: str) -> bool:
    """Whether the token of hub kind `kind` may be sent to `endpoint` (a hub base URL): it is
    the kind's configured hub (`HubKindSpec.configured_endpoint`), or the registered check
    accepts it. A check that raises counts as a refusal (logged): no token rather than a
    token sent by mistake. Raises ValueError for a kind that is not a URL hub with a token."""
    spec = hub_kind_spec(kind)
    if not spec.token_variable:
        raise ValueError(f"hub kind {kind!r} takes no token")
    if same_hub(endpoint, spec.configured_endpoint()):
        return True
    check = _token_check
    if check is None:
        return False
    try:
        return bool(check(endpoint, kind))
    except Exception:
        logger.exception(
            "Checking whether %s may receive %s failed: none is sent", endpoint, spec.token_variable
        )
        return False
