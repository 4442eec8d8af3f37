"""Resolve a command-line target (a local folder or file, or a Hub repo id) to a hub source.

`python manage.py analyze|adapt PATH_OR_REPO_ID` accept either: an existing path is read as a
mirror-style release folder (or that folder's `config.json`); anything else must look like a
Hub repo id (`org/name`) and is looked up on `HF_ENDPOINT` (or the public Hub).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.hubs import HubSpec, canonical_endpoint, hub_source
from engine.hubs.base import REPO_ID_RULES, HubError, ReleaseCandidate, is_valid_repo_id


class TargetError(Exception):
    """The target is neither a usable path nor a reachable repo id; the message says why."""


@dataclass(frozen=True)
class ResolvedTarget:
    """A hub spec and the release candidate the target names on it."""

    spec: HubSpec
    candidate: ReleaseCandidate

    @property
    def endpoint(self) -> str:
        return canonical_endpoint(self.spec)


def resolve_target(target: str) -> ResolvedTarget:
    """Find the release `target` names. Raises `TargetError` with a one-line reason."""
    path = Path(target).expanduser()
    if path.exists():
        folder = (path.parent if path.is_file() else path).resolve()
        if path.is_file() and path.name != "config.json":
            raise TargetError(f"{path} is a file but not a config.json; give its folder instead.")
        if not (folder / "config.json").is_file():
            raise TargetError(
                f"{folder} has no config.json file: give a release folder (<root>/<org>/<name>/) "
                "or its config.json."
            )
        if folder.parent == folder or folder.parent.parent == folder.parent:
            raise TargetError(f"{folder} is too close to / to be read as <root>/<org>/<name>.")
        # A mirror root is <root>/<org>/<name>: read the folder as one release of its parent's.
        spec = HubSpec(kind="mirror", endpoint=str(folder.parent.parent))
        repo_id = f"{folder.parent.name}/{folder.name}"
    elif is_valid_repo_id(target):
        spec = HubSpec(kind="huggingface")
        repo_id = target
    else:
        raise TargetError(
            f"{target!r} is neither an existing path nor a Hub repo id ({REPO_ID_RULES})."
        )
    try:
        candidate = hub_source(spec).latest_release(repo_id)
    except HubError as exc:
        raise TargetError(exc.message) from exc
    if not candidate.complete:
        raise TargetError(f"{repo_id} is not a complete release yet: {candidate.reason}")
    return ResolvedTarget(spec=spec, candidate=candidate)
