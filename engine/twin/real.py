"""The release's own weights, where they are present: a full-size model instead of a twin.

A release whose checkpoint is small enough (the fetch stage's `weights.total_size` at most the
pool's `real_weights_max_bytes`, `DEFAULT_REAL_WEIGHTS_MAX_BYTES` when the pool sets none) and
whose safetensors files lie in a mirror folder (`<hub_endpoint>/<repo_id>/`) is built at its
full size with transformers' own class, and its weights are loaded from that folder
(`from_pretrained(..., local_files_only=True)`, float32): the operators and precision stages
then measure the release itself. Nothing is ever downloaded: a Hub release keeps the seeded
twin, since the fetch stage reads metadata only.

`twin_for_release` decides, loads, and falls back to the seeded twin (`build_twin`) when the
weights are absent, too large, or do not load (a corrupt shard, missing tensors, a shape that
differs from the config's); the reason is a note in the twin's description, never a failure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine import formatting as fmt
from engine.architecture import AnalysisError, analyze_config
from engine.architecture.config_reader import unwrap_text_config
from engine.contract import DEFAULT_REAL_WEIGHTS_MAX_BYTES, StageContext, StageFailed

from .build import Twin, _config_kwargs, build_twin, prompt_ids, transformers_class_for

# A bfloat16 checkpoint of 2 GiB is ~1B parameters: 4 GiB in float32 for the reference, as
# much again for a target copy, which fits a CPU worker with room to spare. A pool with more
# memory raises it through `real_weights_max_bytes`.

HUB_NOT_DOWNLOADED = "real weights not downloaded: the fetch stage reads metadata only"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# How many checkpoint files the description names before it abbreviates.
FILES_SHOWN = 3


class RealWeightsError(Exception):
    """The release's weights are present but do not load into its class (the reason)."""


@dataclass(frozen=True)
class Checkpoint:
    """A release's safetensors checkpoint in a local folder, as its headers describe it.

    `files` are the names transformers loads (the index's shards, or `model.safetensors`);
    `tensors` and `total_bytes` are counted from their headers (no tensor is read).
    """

    folder: Path
    files: tuple[str, ...]
    tensors: int
    total_bytes: int

    def summary(self) -> str:
        """ "real (N tensors, X bytes from model.safetensors)", the description's `weights`."""
        shown = ", ".join(self.files[:FILES_SHOWN])
        if len(self.files) > FILES_SHOWN:
            shown = f"{shown}, ... ({len(self.files)} files)"
        return f"real ({self.tensors} tensors, {self.total_bytes} bytes from {shown})"


def real_weights_limit(pool: Any) -> int:
    """The pool's `real_weights_max_bytes`, or `DEFAULT_REAL_WEIGHTS_MAX_BYTES`.

    Raises `StageFailed` for a value that is not a non-negative whole number of bytes.
    """
    limit = getattr(pool, "real_weights_max_bytes", None)
    if limit is None:
        return DEFAULT_REAL_WEIGHTS_MAX_BYTES
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise StageFailed(
            f"pool {getattr(pool, 'name', '?')}: real_weights_max_bytes must be a whole number "
            f"of bytes >= 0, not {limit!r}"
        )
    return limit


def _checkpoint_files(folder: Path) -> tuple[str, ...]:
    """The safetensors files transformers would load from `folder` (index first).

    Raises `RealWeightsError` when the folder holds neither an index nor `model.safetensors`,
    or the index is unreadable.
    """
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text("utf-8-sig"))["weight_map"]
            return tuple(sorted({str(name) for name in weight_map.values()}))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RealWeightsError(f"{INDEX_FILE} has no readable weight_map ({exc})") from exc
    if (folder / SINGLE_FILE).is_file():
        return (SINGLE_FILE,)
    found = sorted(p.name for p in folder.glob("*.safetensors"))
    raise RealWeightsError(
        f"the folder has neither {INDEX_FILE} nor {SINGLE_FILE} for transformers to load"
        + (f" (it has {', '.join(found[:FILES_SHOWN])})" if found else "")
    )


def read_checkpoint(folder: Path) -> Checkpoint:
    """The checkpoint in `folder`, from its safetensors headers.

    Raises `RealWeightsError` naming the file when one is absent or its header is unreadable
    (a truncated or corrupt shard).
    """
    from safetensors import SafetensorError, safe_open

    from engine.hubs.base import tensor_nbytes

    files = _checkpoint_files(folder)
    tensors = total = 0
    for name in files:
        path = folder / name
        if not path.is_file():
            raise RealWeightsError(f"{name}, named by {INDEX_FILE}, is not in the folder")
        try:
            with safe_open(path, framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                    info = handle.get_slice(key)
                    total += tensor_nbytes(info.get_dtype(), info.get_shape())
                    tensors += 1
        except (SafetensorError, OSError, ValueError) as exc:
            raise RealWeightsError(f"{name} is unreadable: {exc}") from exc
    return Checkpoint(folder=folder, files=files, tensors=tensors, total_bytes=total)


def locate_checkpoint(
    ctx: StageContext, config: Mapping[str, Any]
) -> tuple[Checkpoint | None, str]:
    """(the release's local checkpoint, "") when its real weights may be loaded, else
    (None, why not) as a sentence for the twin's notes.

    Raises `StageFailed` only for a bad `real_weights_max_bytes` on the pool.
    """
    from engine.hubs import HubSpec
    from engine.hubs.base import HubError
    from engine.hubs.mirror import MirrorSource

    release = ctx.release
    limit = real_weights_limit(ctx.pool)
    if release.hub_kind != "mirror":
        return None, HUB_NOT_DOWNLOADED
    weights = (ctx.previous.get("fetch") or {}).get("weights")
    if not isinstance(weights, Mapping):
        return None, "real weights not loaded: the fetch stage found no safetensors checkpoint"
    total_size = weights.get("total_size")
    if isinstance(total_size, int | float) and total_size > limit:
        return None, (
            f"real weights not loaded: the checkpoint is {int(total_size)} bytes, over pool "
            f"{ctx.pool.name}'s limit of {limit} bytes (real_weights_max_bytes)"
        )
    raw, wrapper_note = unwrap_text_config(config)
    if wrapper_note is not None:
        return None, (
            "real weights not loaded: a multimodal checkpoint; the twin is the text model only"
        )
    if raw.get("quantization_config"):
        method = (raw["quantization_config"] or {}).get("quant_method", "unknown")
        return None, (
            f"real weights not loaded: the checkpoint is quantized ({method}) and the float32 "
            "reference is not rebuilt from quantized storage"
        )
    try:
        source = MirrorSource(HubSpec(kind="mirror", endpoint=release.hub_endpoint))
        current = source.latest_release(release.repo_id)
    except HubError as exc:
        return None, f"real weights not loaded: {exc.message}"
    if release.revision not in ("main", current.revision):
        return None, (
            f"real weights not loaded: the mirror folder changed since revision "
            f"{release.revision[:12]} was fetched (it is now {current.revision[:12]})"
        )
    if not current.complete:
        return None, f"real weights not loaded: the folder is not complete ({current.reason})"
    try:
        checkpoint = read_checkpoint(source.root / release.repo_id)
    except RealWeightsError as exc:
        return None, f"real weights not loaded: {exc}"
    if checkpoint.total_bytes > limit:
        return None, (
            f"real weights not loaded: the checkpoint is {checkpoint.total_bytes} bytes, over "
            f"pool {ctx.pool.name}'s limit of {limit} bytes (real_weights_max_bytes)"
        )
    return checkpoint, ""


def _shown(names: list[str]) -> str:
    return ", ".join(names[:FILES_SHOWN]) + (
        f", ... ({len(names)} in all)" if len(names) > FILES_SHOWN else ""
    )


def load_real_twin(config: Mapping[str, Any], checkpoint: Checkpoint, *, seed: int = 0) -> Twin:
    """The release's model at full size with its weights from `checkpoint`, float32, eval.

    The description has the keys of `build_twin`'s, with `weights` = `Checkpoint.summary()`,
    `weights_source` "real", `sizes`, `invariants` and `dropped` empty (nothing was shrunk)
    and `checkpoint` = {"files", "tensors", "bytes"}.

    Raises `RealWeightsError` when transformers has no class for the config or rejects it, or
    the weights do not load: a shard transformers cannot read, tensors the model needs that
    the checkpoint lacks, a tensor whose shape differs from the config's.
    """
    raw = dict(config)
    model_type = raw.get("model_type")
    architectures = list(raw.get("architectures") or [])
    arch = architectures[0] if architectures else model_type
    model_cls, config_cls, found_by = transformers_class_for(model_type, architectures)
    if model_cls is None:
        raise RealWeightsError(f"transformers has no class for {arch}")
    try:
        analysis = analyze_config(raw).to_dict()
        hf_config = config_cls(**_config_kwargs({k: v for k, v in raw.items() if k != "auto_map"}))
    except AnalysisError as exc:
        raise RealWeightsError(f"the config cannot be analysed: {exc}") from exc
    except Exception as exc:  # transformers raises ValueError, TypeError, KeyError...
        raise RealWeightsError(
            f"transformers rejects the config for {config_cls.__name__}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    torch.manual_seed(seed)
    try:
        model, info = model_cls.from_pretrained(
            str(checkpoint.folder),
            config=hf_config,
            dtype=torch.float32,
            local_files_only=True,
            use_safetensors=True,
            ignore_mismatched_sizes=True,  # reported below, by name, instead of raised
            output_loading_info=True,
        )
    except Exception as exc:  # safetensors, OSError, RuntimeError, MemoryError...
        first = str(exc).splitlines()[0][:300] if str(exc) else ""
        raise RealWeightsError(
            f"{model_cls.__name__}.from_pretrained failed: {type(exc).__name__}: {first}"
        ) from exc
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise RealWeightsError(
            f"the checkpoint lacks {fmt.counted(len(missing), 'tensor')} the model needs: "
            f"{_shown(missing)}"
        )
    mismatched = sorted(info.get("mismatched_keys") or ())
    if mismatched:
        shapes = [
            f"{name} {list(ckpt)} in the checkpoint, {list(want)} in the model"
            for name, ckpt, want in mismatched
        ]
        raise RealWeightsError(f"tensor shapes differ from the config's: {_shown(shapes)}")
    if info.get("error_msgs"):
        raise RealWeightsError(f"loading reported: {_shown(list(info['error_msgs']))}")
    model = model.float().eval()
    notes = [
        "nothing was shrunk: the release's own weights are loaded at full size, so every size "
        "and invariant is the release's"
    ]
    unexpected = sorted(info.get("unexpected_keys") or ())
    if unexpected:
        notes.append(
            f"{fmt.counted(len(unexpected), 'checkpoint tensor')} the class does not use "
            f"{'was' if len(unexpected) == 1 else 'were'} ignored: "
            f"{_shown(unexpected)}"
        )
    if model_type and getattr(config_cls, "model_type", model_type) != model_type:
        notes.append(
            f"model_type {model_type!r} is not a transformers model type; built as "
            f"{model_cls.__name__} ({found_by})"
        )
    input_ids = prompt_ids(hf_config.vocab_size, seed, getattr(hf_config, "pad_token_id", None))
    description = {
        "architecture": arch,
        "model_type": model_type,
        "class": model_cls.__name__,
        "config_class": config_cls.__name__,
        "code_source": "transformers",
        "class_found_by": found_by,
        "weights": checkpoint.summary(),
        "weights_source": "real",
        "checkpoint": {
            "files": list(checkpoint.files),
            "tensors": checkpoint.tensors,
            "bytes": checkpoint.total_bytes,
        },
        "parameters": sum(p.numel() for p in model.parameters()),
        "sizes": [],
        "invariants": [],
        "dropped": [],
        "notes": notes,
        "prompt": {
            "batch": int(input_ids.shape[0]),
            "tokens": int(input_ids.shape[1]),
            "seed": seed + 1,
        },
    }
    analysis["hidden_act"] = raw.get("hidden_act")
    return Twin(
        model=model,
        config=model.config,
        description=description,
        input_ids=input_ids,
        analysis=analysis,
    )


def twin_for_release(
    ctx: StageContext, config: dict, *, seed: int = 0, parallel_degree: int = 1
) -> Twin:
    """The model the operators and precision stages run for `ctx`'s release.

    The release's real weights at full size when `locate_checkpoint` finds them and they load;
    else the seeded twin (`build_twin`) with the reason appended to its `notes` and `weights`.
    `parallel_degree` shapes a seeded twin for a TP/EP split (real weights keep the release's
    own counts). Raises what `build_twin` raises (`StageFailed` for a config transformers
    rejects).
    """
    checkpoint, why_not = locate_checkpoint(ctx, config)
    if checkpoint is not None:
        try:
            twin = load_real_twin(config, checkpoint, seed=seed)
        except RealWeightsError as exc:
            why_not = f"real weights not loaded: {exc}"
        else:
            ctx.log(f"real weights: {checkpoint.summary()}")
            return twin
    twin = build_twin(config, seed=seed, parallel_degree=parallel_degree)
    twin.description["notes"].append(why_not)
    twin.description["weights"] = f"{twin.description['weights']} ({why_not})"
    ctx.log(f"seeded twin: {why_not}")
    return twin
