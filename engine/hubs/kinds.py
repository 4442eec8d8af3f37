"""The hub kinds day0 knows, one row each: everything the engine and the app say per kind.

A hub kind is a source module beside this one (`engine/hubs/<kind>.py`, implementing
`HubSource`) and one `HubKindSpec` in `HUB_KIND_SPECS`. Everything else reads the row:
`hub_source` imports the source, `canonical_endpoint` and the token rule
(`engine.hubs.trust`) read the endpoint and token variables, and the app builds its
`HubKind` choices, its allow-list kinds, its watch checks, its repo links and its
publication-time rules from it (docs/extending.md, "Adding a hub kind").

Two shapes of kind:

- a **URL hub** (Hugging Face, ModelScope): its endpoint is an http(s) base URL. A blank one
  is the hub the operator configured (`endpoint_variable`, read when asked) or the vendor's
  `public_endpoint`; any other must be on the admin's allow-list as an entry of that kind.
  Its token (`token_variable`) goes only to those hubs.
- a **folder** (a mirror): its endpoint is a folder on the worker's disk, inside
  `DAY0_MIRROR_ROOTS`; no token, no allow-list.

Plain Python (no Django, no hub client): importing this module is cheap, and Django's model
fields take their choices from `hub_kind_choices` / `allow_list_kind_choices` (callables, so a
new row needs no migration).
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from typing import Literal

from engine.hubs.base import HubSource, HubSpec

# A kind as the fields store it (CharField max_length=32) and as `HubKind` names its member.
_KIND_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")


@dataclass(frozen=True)
class HubKindSpec:
    """One hub kind.

    `kind`: the value stored in watches, releases and allow-list entries (never renamed: rows
    hold it), a lower-case identifier of at most 32 characters (the fields' length; the app's
    `HubKind` member is it upper-cased); `label`: its name on pages and in messages. `source`:
    the dotted path of its `HubSource` class, imported on first use (hub clients are heavy: a
    process imports one only when it reads that kind). `endpoint`: "url" for a hub, "folder"
    for a mirror-style folder.

    A URL hub has `endpoint_variable` (the environment variable naming the operator's hub, as
    the vendor's client reads it), `public_endpoint` (its base URL when that is unset) and,
    when it takes one, `token_variable` (the credential sent only to the configured hub or an
    allow-list entry of this kind). `repo_url` is the repo page's address, with `{endpoint}`
    (no trailing slash) and `{repo_id}` filled in; "" when the kind has no pages.
    `publishes_time`: whether the hub says when a release was published (a folder's file
    times say when it was copied, so a mirror release's clock starts at its discovery).

    Raises ValueError for a kind that is no such identifier, a URL hub without its endpoint
    variable or public endpoint, or a folder that names either, or a token.
    """

    kind: str
    label: str
    source: str
    endpoint: Literal["url", "folder"]
    endpoint_variable: str = ""
    public_endpoint: str = ""
    token_variable: str = ""
    repo_url: str = ""
    publishes_time: bool = True

    def __post_init__(self) -> None:
        if not _KIND_RE.fullmatch(self.kind):
            raise ValueError(
                f"hub kind {self.kind!r}: not a lower-case identifier of at most 32 characters"
            )
        if self.is_url_hub:
            if not (self.endpoint_variable and self.public_endpoint):
                raise ValueError(f"hub kind {self.kind!r}: a URL hub needs its endpoint variable")
        elif self.endpoint_variable or self.public_endpoint or self.token_variable:
            raise ValueError(f"hub kind {self.kind!r}: a folder has no endpoint or token variable")

    @property
    def is_url_hub(self) -> bool:
        """Whether endpoints of this kind are http(s) hubs (configured or allow-listed)."""
        return self.endpoint == "url"

    @property
    def is_folder(self) -> bool:
        """Whether endpoints of this kind are folders inside the mirror roots."""
        return self.endpoint == "folder"

    def configured_endpoint(self) -> str:
        """The hub the operator configured: `endpoint_variable` (read now, not at import) or
        `public_endpoint`, without a trailing slash; "" for a folder kind."""
        if not self.is_url_hub:
            return ""
        return (os.environ.get(self.endpoint_variable) or self.public_endpoint).rstrip("/")

    def repo_page(self, endpoint: str, repo_id: str) -> str:
        """The page of `repo_id` on the hub at `endpoint` (`repo_url` filled in); "" for a kind
        without pages."""
        if not self.repo_url:
            return ""
        return self.repo_url.format(endpoint=endpoint.rstrip("/"), repo_id=repo_id)

    def source_class(self) -> type[HubSource]:
        """The `HubSource` class at `source`, imported now. Raises ImportError when its module
        (or the hub client it needs) is missing."""
        module, _, name = self.source.rpartition(".")
        return getattr(importlib.import_module(module), name)


# The table. Order: how choices are listed (pages, the API's enum) and kinds are named in
# messages.
HUB_KIND_SPECS: tuple[HubKindSpec, ...] = (
    HubKindSpec(
        kind="huggingface",
        label="Hugging Face Hub",
        source="engine.hubs.huggingface.HuggingFaceSource",
        endpoint="url",
        endpoint_variable="HF_ENDPOINT",
        public_endpoint="https://huggingface.co",
        token_variable="HF_TOKEN",
        repo_url="{endpoint}/{repo_id}",
    ),
    HubKindSpec(
        kind="modelscope",
        label="ModelScope",
        source="engine.hubs.modelscope.ModelScopeSource",
        endpoint="url",
        # The variables ModelScope's own client reads (`modelscope_hub.constants`).
        endpoint_variable="MODELSCOPE_ENDPOINT",
        public_endpoint="https://modelscope.cn",
        token_variable="MODELSCOPE_API_TOKEN",
        repo_url="{endpoint}/models/{repo_id}",
    ),
    HubKindSpec(
        kind="mirror",
        label="Mirror folder",
        source="engine.hubs.mirror.MirrorSource",
        endpoint="folder",
        publishes_time=False,
    ),
)


def hub_kinds() -> tuple[str, ...]:
    """Every kind's stored value, in table order."""
    return tuple(spec.kind for spec in HUB_KIND_SPECS)


def hub_kind_spec(kind: str) -> HubKindSpec:
    """The row of `kind`. Raises ValueError naming the known kinds for any other."""
    for spec in HUB_KIND_SPECS:
        if spec.kind == kind:
            return spec
    raise ValueError(f"unknown hub kind {kind!r}: known kinds are {', '.join(hub_kinds())}")


def known_hub_kind(kind: str) -> HubKindSpec | None:
    """The row of `kind`, or None for a kind the table does not hold (a row edited in the
    database): for callers that must not raise on stored values."""
    return next((spec for spec in HUB_KIND_SPECS if spec.kind == kind), None)


def hub_kind_choices() -> list[tuple[str, str]]:
    """(kind, label) of every kind: the choices of a watch's and a release's kind. A callable,
    so that Django's migrations record the function, not the list, and a new row needs none."""
    return [(spec.kind, spec.label) for spec in HUB_KIND_SPECS]


def allow_list_kind_choices() -> list[tuple[str, str]]:
    """(kind, label) of the URL hubs: the kinds an allow-list entry can be."""
    return [(spec.kind, spec.label) for spec in HUB_KIND_SPECS if spec.is_url_hub]


def kinds_without_publication_time() -> tuple[str, ...]:
    """The kinds whose releases' `published_at` is their first sight, not a publication."""
    return tuple(spec.kind for spec in HUB_KIND_SPECS if not spec.publishes_time)


def canonical_endpoint(spec: HubSpec) -> str:
    """Where the spec's source will look, as releases record it: a blank URL-hub endpoint is
    the kind's configured hub (`HubKindSpec.configured_endpoint`: its endpoint variable read
    now, not at import, else its public hub), any URL without a trailing slash; a folder
    kind's (or an unknown kind's) is the endpoint as given. One function, so a release seen
    through a watch and by hand is one row."""
    kind = known_hub_kind(spec.kind)
    if kind is None or not kind.is_url_hub:
        return spec.endpoint
    return spec.endpoint.rstrip("/") if spec.endpoint else kind.configured_endpoint()
