"""Hub sources: where day0 finds model releases and fetches the files that describe them.

`hub_source(spec)` picks the module for `spec.kind`; each kind is one module beside this one
(see `base.py` for the interface every source implements).
"""

from __future__ import annotations

import os

from adaptation.hubs.base import (
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

HUB_KINDS: tuple[str, ...] = ("huggingface", "mirror")
PUBLIC_HUB_ENDPOINT = "https://huggingface.co"

__all__ = [
    "HUB_KINDS",
    "RELEASE_FILES",
    "HubAuthError",
    "HubError",
    "HubNotFound",
    "HubRateLimited",
    "HubSource",
    "HubSpec",
    "HubUnavailable",
    "ReleaseCandidate",
    "ReleaseFiles",
    "canonical_endpoint",
    "hub_source",
]


def canonical_endpoint(spec: HubSpec) -> str:
    """Where the spec's source will look, as releases record it: a blank Hub endpoint is
    `HF_ENDPOINT` (read now, not at import) or the public Hub, without a trailing slash; a
    mirror's is its root folder. One function, so a release seen through a watch and by hand
    is one row."""
    if spec.kind == "huggingface":
        return (spec.endpoint or os.environ.get("HF_ENDPOINT") or PUBLIC_HUB_ENDPOINT).rstrip("/")
    return spec.endpoint


def hub_source(spec: HubSpec) -> HubSource:
    """The source for `spec.kind`. Raises ValueError naming the known kinds for any other.

    Sources are imported on demand so that importing this package (as the Django app does)
    does not pull in `huggingface_hub` or `safetensors`.
    """
    if spec.kind == "huggingface":
        from adaptation.hubs.huggingface import HuggingFaceSource

        return HuggingFaceSource(spec)
    if spec.kind == "mirror":
        from adaptation.hubs.mirror import MirrorSource

        return MirrorSource(spec)
    raise ValueError(f"unknown hub kind {spec.kind!r}: known kinds are {', '.join(HUB_KINDS)}")
