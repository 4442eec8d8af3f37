"""The checkpoint folder a serving engine loads: the release's real weights where a mirror
folder holds them (small enough for the pool), else the serving twin saved as a real Hugging
Face checkpoint (config.json, model.safetensors, generation_config.json) beside the release's
real tokenizer files, which the fetch stage downloaded.

The twin is `SERVING_TWIN` (head_dim 64, the release's vocabulary: `engine.twin.shrink`), seeded
like every twin, saved in bfloat16 (the engine's and the float32 reference's weights are then
the same numbers). Folders are content-addressed under `<DAY0_VAR_DIR>/serve/checkpoints/`:
the same config, seed, sizes and tokenizer give the same folder, saved once.

The full-size run's folder (`full_size_folder`) holds the release's config and tokenizer files
alone: an engine launched with `--load-format dummy` makes the weights up.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.contract import StageContext, StageFailed
from engine.paths import var_dir

CHECKPOINT_FORMAT = 1  # bump when what is saved changes, so old folders are not reused
SAVE_DTYPE = "bfloat16"


@dataclass
class ServedCheckpoint:
    """A folder an engine can load: `kind` "twin" or "real"."""

    folder: Path
    kind: str
    parameters: int | None  # None for real weights: their headers give bytes, not a count
    bytes: int
    dtype: str
    tokenizer: str
    max_position_embeddings: int | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "folder": str(self.folder),
            "parameters": self.parameters,
            "bytes": self.bytes,
            "dtype": self.dtype,
            "tokenizer": self.tokenizer,
            "notes": list(self.notes),
        }


def checkpoints_root() -> Path:
    return var_dir("serve", "checkpoints")


def _tokenizer(ctx: StageContext) -> tuple[Path | None, str]:
    fetched = (ctx.previous.get("fetch") or {}).get("tokenizer")
    if not isinstance(fetched, Mapping) or not fetched.get("dir"):
        return None, "none"
    folder = Path(str(fetched["dir"]))
    if not folder.is_dir():
        return None, "none"
    return folder, str(fetched.get("kind") or "fast")


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def _real_checkpoint(ctx: StageContext, config: Mapping[str, Any]) -> ServedCheckpoint | None:
    from engine.twin.real import locate_checkpoint

    checkpoint, why_not = locate_checkpoint(ctx, config)
    if checkpoint is None:
        ctx.log(f"serving the twin: {why_not}")
        return None
    has_tokenizer = any(
        (checkpoint.folder / name).is_file()
        for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    )
    if not has_tokenizer:
        ctx.log("serving the twin: the mirror folder has weights but no tokenizer files")
        return None
    raw = dict(config)
    return ServedCheckpoint(
        folder=checkpoint.folder,
        kind="real",
        parameters=None,
        bytes=checkpoint.total_bytes,
        dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "checkpoint"),
        tokenizer="fast" if (checkpoint.folder / "tokenizer.json").is_file() else "slow",
        max_position_embeddings=raw.get("max_position_embeddings"),
        notes=[f"the release's own weights: {checkpoint.summary()}"],
    )


def serving_checkpoint(ctx: StageContext, *, seed: int = 0) -> ServedCheckpoint:
    """The folder the engine loads for `ctx`'s release.

    Raises `StageFailed` when the release has no tokenizer files (an engine cannot serve
    without one) or the twin cannot be built (what `build_twin` raises).
    """
    fetch = ctx.previous.get("fetch") or {}
    config = fetch.get("config")
    if not isinstance(config, Mapping):
        raise StageFailed("the fetch stage produced no config.json to serve")
    real = _real_checkpoint(ctx, config)
    if real is not None:
        return real
    tokenizer_dir, tokenizer_kind = _tokenizer(ctx)
    if tokenizer_dir is None:
        raise StageFailed(
            "the release has no tokenizer files (tokenizer.json, tokenizer.model, tiktoken): "
            "an engine cannot serve it"
        )
    from engine.twin.shrink import SERVING_TWIN

    key = hashlib.sha256(
        json.dumps(
            {
                "config": config,
                "seed": seed,
                "sizes": repr(SERVING_TWIN),
                "tokenizer": str(tokenizer_dir),
                "format": CHECKPOINT_FORMAT,
            },
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()[:32]
    folder = checkpoints_root() / key
    meta_path = folder / "day0-checkpoint.json"
    if not meta_path.is_file():
        _save_twin(config, tokenizer_dir, folder, seed=seed, org=ctx.release.repo_id)
    meta = json.loads(meta_path.read_text())
    return ServedCheckpoint(
        folder=folder,
        kind="twin",
        parameters=int(meta["parameters"]),
        bytes=_folder_bytes(folder),
        dtype=SAVE_DTYPE,
        tokenizer=tokenizer_kind,
        max_position_embeddings=meta.get("max_position_embeddings"),
        notes=list(meta.get("notes", [])),
    )


def _save_twin(
    config: Mapping[str, Any], tokenizer_dir: Path, folder: Path, *, seed: int, org: str
) -> None:
    import torch

    from engine.twin.build import build_twin
    from engine.twin.shrink import SERVING_TWIN

    # A deep copy: the twin's build rewrites nested keys (rope_scaling) of what it is given, and
    # the fetch result's config must stay as fetched (it keys this folder).
    twin = build_twin(
        copy.deepcopy(dict(config)), seed=seed, sizes=SERVING_TWIN, org=org.split("/")[0]
    )
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".saving-", dir=folder.parent))
    try:
        model = twin.model.to(torch.bfloat16)
        model.config.torch_dtype = torch.bfloat16
        model.save_pretrained(staging, safe_serialization=True)
        for item in tokenizer_dir.iterdir():
            if item.is_file():
                shutil.copy2(item, staging / item.name)
        meta = {
            "parameters": twin.description["parameters"],
            "max_position_embeddings": getattr(twin.config, "max_position_embeddings", None),
            "notes": [
                f"serving twin of {twin.description['architecture']}: "
                f"{twin.description['parameters']:,} parameters, {twin.description['weights']}",
                *twin.description["notes"],
            ],
        }
        (staging / "day0-checkpoint.json").write_text(json.dumps(meta, indent=1))
        try:
            staging.rename(folder)
        except OSError:  # another worker saved the same folder first
            if not (folder / "day0-checkpoint.json").is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def full_size_root() -> Path:
    return var_dir("serve", "full-size")


def full_size_folder(config: Mapping[str, Any], tokenizer_dir: Path) -> Path:
    """A folder holding the release's `config.json` (as fetched) and its tokenizer files, and
    nothing else: what an engine launched with `--load-format dummy` reads to serve the model
    at full size with random weights. Content-addressed under `<DAY0_VAR_DIR>/serve/full-size/`
    (the same config and tokenizer folder give the same folder, written once)."""
    text = json.dumps(dict(config), indent=2, sort_keys=True, default=str)
    key = hashlib.sha256(
        json.dumps(
            {"config": text, "tokenizer": str(tokenizer_dir), "format": CHECKPOINT_FORMAT},
            sort_keys=True,
        ).encode()
    ).hexdigest()[:32]
    folder = full_size_root() / key
    if (folder / "config.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".saving-", dir=folder.parent))
    try:
        for item in tokenizer_dir.iterdir():
            if item.is_file() and item.name != "config.json":
                shutil.copy2(item, staging / item.name)
        (staging / "config.json").write_text(text + "\n")
        try:
            staging.rename(folder)
        except OSError:  # another worker wrote the same folder first
            if not (folder / "config.json").is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return folder


def fetched_tokenizer(ctx: StageContext) -> Path | None:
    """The tokenizer folder the fetch stage kept for the release (None without one)."""
    return _tokenizer(ctx)[0]
