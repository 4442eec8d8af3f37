"""Hub sources: where day0 finds model releases and fetches the files that describe them.

Each kind is one module beside this one (see `base.py` for the interface every source
implements) and one row of `kinds.HUB_KIND_SPECS`; `hub_source(spec)` builds the row's source
for `spec.kind`.
"""

from __future__ import annotations

from engine.hubs.base import (
    RELEASE_FILES,
    HubAuthError,
    HubError,
    HubNotFound,
    HubRateLimited,
    HubSource,
    HubSpec,
    HubUnavailable,
    ReleaseCandidate,
    ReleaseFiles,
)
from engine.hubs.kinds import HUB_KIND_SPECS, HubKindSpec, canonical_endpoint, hub_kind_spec

__all__ = [
    "HUB_KIND_SPECS",
    "RELEASE_FILES",
    "HubAuthError",
    "HubError",
    "HubKindSpec",
    "HubNotFound",
    "HubRateLimited",
    "HubSource",
    "HubSpec",
    "HubUnavailable",
    "ReleaseCandidate",
    "ReleaseFiles",
    "canonical_endpoint",
    "hub_kind_spec",
    "hub_source",
]


def hub_source(spec: HubSpec) -> HubSource:
    """The source for `spec.kind`, built on `spec`. Raises ValueError naming the known kinds
    for any other kind.

    Sources are imported on demand (`HubKindSpec.source_class`) so that importing this
    package (as the Django app does) does not pull in `huggingface_hub`, `modelscope_hub` or
    `safetensors`.
    """
    return hub_kind_spec(spec.kind).source_class()(spec)
