"""Which Hub endpoints receive the worker's Hugging Face token.

`HF_TOKEN` (or the login `huggingface_hub` saved) is a credential for the hub the operator
configured: `HF_ENDPOINT`, else https://huggingface.co. The Hugging Face source sends it to
that endpoint, and to another one only when a registered check accepts it (the Django app
registers one reading its admin-managed allow-list, see `adaptation.models.hub_endpoints`).
Any other endpoint is asked without a token, so a watch or release pointing at a URL
somebody typed never carries the credential there. A token put in a `HubSpec` explicitly is
the caller's own choice and is sent as given.

Redirects: `huggingface_hub` follows a redirect with the token only to the same origin or a
known Hub origin, and its HTTP client (`httpx2`) drops `Authorization` on any redirect to
another origin; tests/security/test_watch_endpoints.py checks that a redirect to another
host receives no token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from urllib.parse import urlsplit

from engine.hubs.base import configured_hub_endpoint, configured_modelscope_endpoint

logger = logging.getLogger(__name__)

# A check the app registers: whether a (non-default) endpoint may receive HF_TOKEN.
TokenCheck = Callable[[str], bool]

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
    """Register (None: remove) the check that decides whether an endpoint other than the
    configured hub may receive `HF_TOKEN`."""
    global _token_check
    _token_check = check


def hf_token_allowed(endpoint: str) -> bool:
    """Whether `HF_TOKEN` may be sent to `endpoint` (a Hub base URL): it is the configured
    hub (`configured_hub_endpoint`), or the registered check accepts it. A check that
    raises counts as a refusal (logged): no token rather than a token sent by mistake."""
    return _token_allowed(
        endpoint, configured=configured_hub_endpoint(), check=_token_check, token="HF_TOKEN"
    )


def _token_allowed(endpoint: str, *, configured: str, check: TokenCheck | None, token: str) -> bool:
    """The rule both hubs' tokens follow: `endpoint` is the `configured` one, or `check`
    accepts it; a check that raises refuses (logged, naming the `token` variable)."""
    if same_hub(endpoint, configured):
        return True
    if check is None:
        return False
    try:
        return bool(check(endpoint))
    except Exception:
        logger.exception("Checking whether %s may receive %s failed: none is sent", endpoint, token)
        return False


# -- ModelScope -------------------------------------------------------------------------------
# `MODELSCOPE_API_TOKEN` is a credential for the ModelScope the operator configured
# (`MODELSCOPE_ENDPOINT`, else https://modelscope.cn), by the same rule as `HF_TOKEN`: another
# endpoint receives it only when the app's registered check accepts it (a ModelScope entry of
# its allow-list), never a URL somebody typed into a watch.

_modelscope_token_check: TokenCheck | None = None


def modelscope_token_check_set(check: TokenCheck | None) -> None:
    """Register (None: remove) the check that decides whether an endpoint other than the
    configured ModelScope may receive `MODELSCOPE_API_TOKEN`."""
    global _modelscope_token_check
    _modelscope_token_check = check


def modelscope_token_allowed(endpoint: str) -> bool:
    """Whether `MODELSCOPE_API_TOKEN` may be sent to `endpoint`: the configured ModelScope
    (`configured_modelscope_endpoint`), or the registered check accepts it. A check that
    raises counts as a refusal (logged)."""
    return _token_allowed(
        endpoint,
        configured=configured_modelscope_endpoint(),
        check=_modelscope_token_check,
        token="MODELSCOPE_API_TOKEN",
    )
