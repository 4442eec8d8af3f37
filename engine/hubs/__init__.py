"""Hub sources: where day0 finds model releases and fetches the files that describe them.

`hub_source(spec)` picks the module for `spec.kind`; each kind is one module beside this one
(see `base.py` for the interface every source implements).
"""

from __future__ import annotations

from engine.hubs.base import (
    PUBLIC_HUB_ENDPOINT,
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
    canonical_endpoint,
)

HUB_KINDS: tuple[str, ...] = ("huggingface", "modelscope", "mirror")

__all__ = [
    "HUB_KINDS",
    "PUBLIC_HUB_ENDPOINT",
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


def hub_source(spec: HubSpec) -> HubSource:
    """The source for `spec.kind`. Raises ValueError naming the known kinds for any other.

    Sources are imported on demand so that importing this package (as the Django app does)
    does not pull in `huggingface_hub`, `modelscope_hub` or `safetensors`.
    """
    if spec.kind == "huggingface":
        from engine.hubs.huggingface import HuggingFaceSource

        return HuggingFaceSource(spec)
    if spec.kind == "modelscope":
        from engine.hubs.modelscope import ModelScopeSource

        return ModelScopeSource(spec)
    if spec.kind == "mirror":
        from engine.hubs.mirror import MirrorSource

        return MirrorSource(spec)
    raise ValueError(f"unknown hub kind {spec.kind!r}: known kinds are {', '.join(HUB_KINDS)}")
