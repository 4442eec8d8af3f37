"""Where hub watches may point: each URL hub kind's configured hub and its allow-list entries,
and the mirror roots for folder kinds. Every rule here is written once and reads the kind's
row (`engine.hubs.kinds.HubKindSpec`).

A URL hub watch's endpoint (Hugging Face, ModelScope) is the worker's configured hub of its
kind (blank, or that URL: `HF_ENDPOINT`, `MODELSCOPE_ENDPOINT`, the vendor's public hub when
unset) or a URL on the admin-managed allow-list (`AllowedHubEndpoint`) as an entry of that
kind. An allow-list entry goes through the same private-address guard as outbound
notifications (`adaptation.outbound_http.resolve_checked`) unless a superuser set its
`allow_private_network`; the configured hub is not guarded, since the operator configured it
(a site mirror on the internal network, the test suite's local fake Hub). Only those hubs
receive the kind's token (`HF_TOKEN`, `MODELSCOPE_API_TOKEN`); an allow-list entry serves one
kind of hub, so no token is ever sent to another vendor's entries.

A folder watch's endpoint (a mirror) must be one of `DAY0_MIRROR_ROOTS` or inside one, after
symlinks and `..` are resolved.

These rules are checked when a watch is saved (`HubWatch.clean`), again before each poll
(a row saved before the rules, or changed in the database, is refused then), and when a
source decides whether to send its kind's token (`hub_token_allowed`, registered with
`engine.hubs.trust` when the app starts).
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from adaptation.outbound_http import OutboundError, resolve_checked
from engine.hubs.kinds import allow_list_kind_choices, hub_kind_spec
from engine.hubs.trust import DEFAULT_PORTS, hub_url_key, same_hub

# Where the allow-list is managed, as refusals name it.
ALLOW_LIST_PLACE = "the admin's Allowed hub endpoints"

# The kind of an allow-list entry saved without one: entries made before they had kinds were
# Hugging Face hubs.
HUGGINGFACE = "huggingface"


def configured_endpoint(kind: str = HUGGINGFACE) -> str:
    """The hub the operator configured for URL hub kind `kind`: its endpoint variable
    (`HF_ENDPOINT`, `MODELSCOPE_ENDPOINT`; read now), else the vendor's public hub. Raises
    ValueError for an unknown kind."""
    return hub_kind_spec(kind).configured_endpoint()


class AllowedHubEndpoint(models.Model):
    """A hub of one URL kind (besides its configured one, `HF_ENDPOINT` for Hugging Face) that
    watches of that kind may poll and that receives the worker's token of that kind
    (`HF_TOKEN` for Hugging Face). Managed in the admin by the admin role.

    Its address must not resolve to a private, loopback, link-local or otherwise internal
    network unless `allow_private_network` is set: that is a superuser's decision to let the
    worker (and its token) reach an internal host (the admin site shows it read-only to
    anyone else, `AllowedHubEndpointAdmin`).
    """

    hub_kind = models.CharField(
        max_length=32,
        choices=allow_list_kind_choices,
        default=HUGGINGFACE,
        help_text="Which kind of hub it is: only watches of that kind may use it, and only "
        "that kind's token (such as HF_TOKEN) is sent to it.",
    )
    url = models.CharField(
        max_length=512,
        unique=True,
        help_text="The hub's base URL, http(s) with a host, without credentials, query or "
        "fragment, e.g. https://hub.example.com.",
    )
    allow_private_network = models.BooleanField(
        default=False,
        help_text="Allow it even when it resolves to a private or loopback address (an "
        "admin's decision: the worker and its HF_TOKEN then reach the internal network).",
    )
    note = models.CharField(max_length=256, blank=True, help_text="What this hub is.")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["url"]
        verbose_name = "allowed hub endpoint"

    def __str__(self) -> str:
        return self.url

    def clean(self) -> None:
        """The URL, canonical (scheme and host lower-cased, no trailing slash), must be a hub
        URL (`hub_url_key`) and pass the address guard unless private networks are allowed.
        Raises `ValidationError` on `url` naming why."""
        key = hub_url_key(self.url or "")
        if key is None:
            raise ValidationError({"url": _malformed(self.url)})
        self.url = _url_from_key(key)
        if not self.allow_private_network:
            reason = _address_refusal(key)
            if reason:
                raise ValidationError({"url": reason})


def _malformed(url: str) -> str:
    return (
        f"{url or '(blank)'!r} is not a hub base URL: give http(s)://host[:port][/path], "
        "without credentials, query or fragment."
    )


def _url_from_key(key: tuple[str, str, int, str]) -> str:
    scheme, host, port, path = key
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}{'' if port == DEFAULT_PORTS[scheme] else f':{port}'}{path}"


def _address_refusal(key: tuple[str, str, int, str]) -> str:
    """Why the guard refuses the hub's host ("" when it does not): an internal address or a
    name that does not resolve (its address cannot be checked)."""
    _scheme, host, port, _path = key
    try:
        resolve_checked(host, port, allow_private_network=False)
    except OutboundError as exc:
        return exc.reason
    return ""


def _allow_list_entry(endpoint: str, kind: str = HUGGINGFACE) -> AllowedHubEndpoint | None:
    key = hub_url_key(endpoint)
    if key is None:
        return None
    # The list is short; comparing keys also finds a row whose URL was edited in the database.
    for entry in AllowedHubEndpoint.objects.filter(hub_kind=kind):
        if hub_url_key(entry.url) == key:
            return entry
    return None


def configured_hub_urls(kind: str = HUGGINGFACE) -> list[str]:
    """The hubs a watch of URL hub kind `kind` may use, for messages: its configured hub
    (`configured_endpoint`) first, then the allow-list's entries of that kind."""
    listed = AllowedHubEndpoint.objects.filter(hub_kind=kind).values_list("url", flat=True)
    return [configured_endpoint(kind), *listed]


def hub_endpoint_unlisted_reason(endpoint: str, kind: str = HUGGINGFACE) -> str:
    """Why `endpoint` (a watch's of URL hub kind `kind`; blank means the configured hub) is
    not a configured hub, or "" when it is: the kind's configured hub (`configured_endpoint`)
    or on the allow-list for that kind. Resolves nothing (cheap enough for a webhook);
    `hub_endpoint_refusal` adds the guard."""
    if not endpoint.strip() or same_hub(endpoint, configured_endpoint(kind)):
        return ""
    if hub_url_key(endpoint) is None:
        return _malformed(endpoint)
    if _allow_list_entry(endpoint, kind) is not None:
        return ""
    spec = hub_kind_spec(kind)
    return (
        f"{endpoint} is not a configured hub: use {spec.endpoint_variable} "
        f"({spec.configured_endpoint()}, or leave the endpoint blank) or a "
        f"{spec.label} on {ALLOW_LIST_PLACE} "
        f"({', '.join(configured_hub_urls(kind)[1:]) or 'none yet'})."
    )


def hub_endpoint_refusal(endpoint: str, kind: str = HUGGINGFACE) -> str:
    """Why a watch of `kind` may not use `endpoint` (or its worker send that kind's token
    there), or "" when it may: not a configured hub (`hub_endpoint_unlisted_reason`), or an
    allow-list entry whose host resolves to an internal address (or not at all) while its
    `allow_private_network` is off. Resolves the host of an allow-list entry."""
    reason = hub_endpoint_unlisted_reason(endpoint, kind)
    if reason or not endpoint.strip() or same_hub(endpoint, configured_endpoint(kind)):
        return reason
    entry, key = _allow_list_entry(endpoint, kind), hub_url_key(endpoint)
    if entry is None or key is None or entry.allow_private_network:
        return ""
    refusal = _address_refusal(key)
    return f"{endpoint}: {refusal}" if refusal else ""


def hub_token_allowed(endpoint: str, kind: str) -> bool:
    """Whether the worker may send the token of URL hub kind `kind` to `endpoint` (besides
    the configured hub of that kind, which `engine.hubs.trust` accepts itself): registered
    with `engine.hubs.trust.token_check_set` by `AdaptationConfig.ready`."""
    return not hub_endpoint_refusal(endpoint, kind)


def mirror_roots() -> list[Path]:
    """`DAY0_MIRROR_ROOTS`, each resolved (symlinks followed)."""
    return [Path(root).expanduser().resolve() for root in settings.DAY0_MIRROR_ROOTS]


def mirror_root_refusal(folder: str) -> str:
    """Why a mirror watch may not read `folder`, or "" when it may: the folder, with
    symlinks and `..` resolved, must be one of `DAY0_MIRROR_ROOTS` or inside one. Does not
    require the folder to exist (the poll reports a missing one)."""
    if not folder.strip():
        return "a mirror watch needs its root folder as the endpoint."
    try:
        resolved = Path(folder).expanduser().resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL in the path
        return f"{folder!r} cannot be resolved: {exc}"
    roots = mirror_roots()
    if any(resolved == root or resolved.is_relative_to(root) for root in roots):
        return ""
    shown = ", ".join(str(root) for root in roots) or "none"
    return (
        f"{folder} (resolved: {resolved}) is outside the mirror roots ({shown}); an operator "
        "adds roots with DAY0_MIRROR_ROOTS."
    )
