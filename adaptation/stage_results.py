"""What a stage's result changes in the domain rows besides its own `StageRun`.

Each stage that feeds the domain registers a handler here; a stage without one only keeps
its result on the run. Handlers run inside the transaction that stores the result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adaptation.models import ModelRelease

Handler = Callable[[ModelRelease, dict[str, Any]], None]


def _store_fetched_files(release: ModelRelease, result: dict[str, Any]) -> None:
    release.config = result.get("config")
    release.metadata = {
        "files": result.get("files", []),
        "weights": result.get("weights"),
        "generation_config": result.get("generation_config"),
        "readme_excerpt": result.get("readme_excerpt", ""),
    }
    release.save(update_fields=["config", "metadata"])


def _store_architecture(release: ModelRelease, result: dict[str, Any]) -> None:
    release.architecture = str(result.get("architecture") or "")[:128]
    release.family = str(result.get("family") or result.get("model_type") or "")[:64]
    release.save(update_fields=["architecture", "family"])


HANDLERS: dict[str, Handler] = {
    "fetch": _store_fetched_files,
    "analyze": _store_architecture,
}


def apply(*, stage: str, release: ModelRelease, result: dict[str, Any]) -> None:
    """Run the handler registered for `stage`, if any."""
    handler = HANDLERS.get(stage)
    if handler is not None:
        handler(release, result)
