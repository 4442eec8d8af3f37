"""Model types day0's family table lacks but the installed transformers knows.

For such a model type the analysis asks transformers itself: the config as its config class
resolves it (`resolved_text_config`: derived layer types, head_dim, RoPE parameters), and the
parameters of the model it builds on the `meta` device (`meta_build`: shapes only, no memory).
The build never runs a release's own code: the config class comes from transformers'
`CONFIG_MAPPING` (`auto_map` is dropped) and the model from its auto classes with
`trust_remote_code=False`.

The build is bounded (`meta_bounds.bounded_build`: module count and seconds), and past the
bound the caller estimates instead. transformers (and torch) are imported on the first call only.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .meta_bounds import bounded_build, config_kwargs, short_message
from .tensors import (
    ATTENTION,
    DENSE_MLP,
    EMBEDDING,
    LINEAR_MIXER,
    LM_HEAD,
    NORM,
    OTHER,
    PER_LAYER_EMBEDDING,
    ROUTED_EXPERT,
    ROUTER,
    SHARED_EXPERT,
    TOWER,
    TensorGroup,
)
from .transformers_defaults import class_defaults, installed_transformers_version

_LAYER = re.compile(r"\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.(\d+)\.")
# Submodules of a multimodal wrapper outside the language model (vision/audio towers, projectors).
_TOWER_PARTS = (
    "vision",
    "visual",
    "audio",
    "image",
    "video",
    "multi_modal_projector",
    "mm_projector",
    "merger",
    "embed_vision",
    "embed_audio",
)


class MetaBuildError(Exception):
    """transformers could not build the model (the message says why); the caller estimates."""


def transformers_knows(model_type: str | None) -> bool:
    """Whether the installed transformers has a config class for `model_type` (read from the
    defaults cache, so importing transformers only the first time per version)."""
    if not model_type or installed_transformers_version() is None:
        return False
    return class_defaults(model_type).known


@dataclass(frozen=True)
class MetaBuild:
    """The parameters of the model transformers builds, grouped as the tensor inventory.

    `groups`: one `TensorGroup` per parameter name pattern and shape (layers and experts
    folded in; persistent buffers with `buffer=True`, tower parameters with role TOWER).
    `kv_widths`: K+V elements per token of each decoder layer whose attention module has its
    own `k_proj` (0 for a layer that reuses another layer's K/V). `class_name`: the model class
    built; `build_s`: seconds the build took (wall clock, the modeling module's import
    included on a first build).
    """

    class_name: str
    groups: tuple[TensorGroup, ...]
    kv_widths: Mapping[int, int] = field(default_factory=dict)
    build_s: float = 0.0


def _canonical(config: Mapping[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def resolved_text_config(config: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """The text model's config as transformers' class for `model_type` resolves `config`
    (values its `__post_init__` derives included). Raises `MetaBuildError` when the class
    refuses the config."""
    return json.loads(_resolved_text_config(_canonical(config), model_type))


@functools.lru_cache(maxsize=64)
def _resolved_text_config(config_json: str, model_type: str) -> str:
    cfg = _transformers_config(json.loads(config_json), model_type)
    text = cfg.get_text_config(decoder=True)
    return json.dumps(text.to_dict(), default=str)


def _transformers_config(config: Mapping[str, Any], model_type: str) -> Any:
    import transformers

    from .transformers_defaults import _quiet_transformers

    try:
        with _quiet_transformers():
            return transformers.AutoConfig.for_model(model_type, **config_kwargs(config))
    except Exception as err:  # the class's own validation: any exception type
        raise MetaBuildError(
            f"transformers' {model_type} config class refused it: {short_message(err)}"
        ) from err


def meta_build(
    config: Mapping[str, Any],
    model_type: str,
    top_k_by_layer: Mapping[int, int],
    default_top_k: int | None = None,
) -> MetaBuild:
    """Build `config` (model type `model_type`) on the meta device and group its parameters.

    `top_k_by_layer`: experts per token of each MoE layer, for the routed experts' active
    count; a layer not in it takes `default_top_k`, or every expert when that is None (an
    upper bound). Cached per config. Raises `MetaBuildError` when transformers cannot build it
    or the build goes past the bounds.
    """
    key = json.dumps([sorted(top_k_by_layer.items()), default_top_k])
    return _meta_build(_canonical(config), model_type, key)


@functools.lru_cache(maxsize=16)
def _meta_build(config_json: str, model_type: str, top_k_json: str) -> MetaBuild:
    import torch
    import transformers

    from .transformers_defaults import _quiet_transformers

    cfg = _transformers_config(json.loads(config_json), model_type)
    by_layer, default_top_k = json.loads(top_k_json)
    top_k = {int(layer): k for layer, k in by_layer}
    errors: list[str] = []
    model = None
    start = time.perf_counter()
    # Generative heads only: a bare AutoModel would leave out an untied LM head.
    auto_classes = [
        getattr(transformers, name)
        for name in (
            "AutoModelForCausalLM",
            "AutoModelForImageTextToText",
            "AutoModelForMultimodalLM",
        )
        if hasattr(transformers, name)
    ]
    for auto in auto_classes:
        mapping = getattr(auto, "_model_mapping", None)
        if mapping is not None and type(cfg) not in mapping:
            errors.append(f"{auto.__name__} has no class for {type(cfg).__name__}")
            continue
        try:
            if mapping is not None:
                mapping[type(cfg)]  # imports the modeling module, outside the time bound
            start = time.perf_counter()
            with bounded_build(_BuildTooLarge, start), _quiet_transformers(), torch.device("meta"):
                model = auto.from_config(cfg, trust_remote_code=False)
            break
        except _BuildTooLarge:
            raise
        except Exception as err:  # the class refused the config: try the next auto class
            errors.append(f"{auto.__name__}: {short_message(err)}")
    if model is None:
        raise MetaBuildError("transformers could not build it: " + "; ".join(errors))
    groups = _group_parameters(model, top_k, default_top_k)
    return MetaBuild(
        class_name=type(model).__name__,
        groups=tuple(groups),
        kv_widths=_kv_widths(model),
        build_s=time.perf_counter() - start,
    )


class _BuildTooLarge(MetaBuildError):
    pass


def _role(name: str, module: Any, input_embedding: Any, in_tower: bool | None) -> str:
    """The inventory role of parameter `name` (owned by `module`), from its module path.

    `in_tower`: whether the parameter lies outside the language model (the model's
    `get_decoder()`), None when that is unknown (then tower names decide).
    """
    import torch

    parts = name.lower().split(".")
    if in_tower is None:
        in_tower = any(marker in part for part in parts[:-1] for marker in _TOWER_PARTS)
    if in_tower and "lm_head" not in parts and module is not input_embedding:
        return TOWER
    if "lm_head" in parts:
        return LM_HEAD
    if module is input_embedding:
        return EMBEDDING
    if isinstance(module, torch.nn.Embedding):
        return PER_LAYER_EMBEDDING  # Gemma 3n/4 per-layer input embeddings
    if any("shared_expert_gate" in part for part in parts):
        return ROUTER
    if any(part.startswith("shared_expert") or part == "shared_mlp" for part in parts):
        return SHARED_EXPERT
    if "experts" in parts[:-1]:
        return ROUTED_EXPERT
    if any(part in ("gate", "router", "wg") or "router" in part for part in parts[:-1]):
        return ROUTER
    if any("norm" in part for part in parts[-2:]):
        return NORM
    if any(part in ("linear_attn", "mamba", "mixer") for part in parts):
        return LINEAR_MIXER
    if any(part in ("self_attn", "attention", "attn") for part in parts):
        return ATTENTION
    if any(part in ("mlp", "feed_forward", "ffn", "block_sparse_moe") for part in parts):
        return DENSE_MLP
    return OTHER


def _group_parameters(
    model: Any, top_k: Mapping[int, int], default_top_k: int | None
) -> list[TensorGroup]:
    """Fold the model's parameters and persistent buffers into `TensorGroup`s."""
    import torch

    modules = dict(model.named_modules())
    input_embedding = model.get_input_embeddings()
    language_model: set[int] | None = None
    try:
        decoder = model.get_decoder()
    except Exception:  # a model class without a decoder accessor: tower names decide
        decoder = None
    if decoder is not None:
        language_model = {id(p) for p in decoder.parameters()}
        language_model |= {id(b) for b in decoder.buffers()}
    persistent = set(model.state_dict().keys())
    folded: dict[tuple[Any, ...], set[int]] = {}
    experts_seen: dict[tuple[Any, ...], set[int]] = {}

    def add(name: str, tensor: Any, *, buffer: bool) -> None:
        module_name, _, param = name.rpartition(".")
        module = modules.get(module_name)
        in_tower = None if language_model is None else id(tensor) not in language_model
        role = _role(name, module, input_embedding, in_tower)
        shape = tuple(int(d) for d in tensor.shape)
        experts = 1
        template = module_name
        layer = None
        if role != TOWER:
            match = _LAYER.search(f".{module_name}.")
            if match:
                layer = int(match.group(1))
                template = _LAYER.sub(".layers.{layer}.", f".{module_name}.", count=1)[1:-1]
        expert_index = None
        if role == ROUTED_EXPERT:
            match = _EXPERT.search(f".{template}.")
            if match:  # one module per expert: fold the index
                expert_index = int(match.group(1))
                template = _EXPERT.sub(".experts.{expert}.", f".{template}.", count=1)[1:-1]
            elif len(shape) == 3 or (len(shape) == 2 and "bias" in param):
                # fused experts: weights (experts, out, in), biases (experts, out)
                experts, shape = shape[0], shape[1:]
        is_linear_weight = param == "weight" and isinstance(module, torch.nn.Linear)
        fused_weight = role == ROUTED_EXPERT and len(shape) == 2 and "bias" not in param
        linear = is_linear_weight or fused_weight
        dtype = "F32" if buffer and tensor.dtype == torch.float32 else None
        k = top_k.get(layer, default_top_k) if role == ROUTED_EXPERT and layer is not None else 1
        key = (template, param, shape, role, experts, k, linear, buffer, dtype)
        folded.setdefault(key, set())
        if layer is not None:
            folded[key].add(layer)
        if expert_index is not None:
            experts_seen.setdefault(key, set()).add(expert_index)

    for name, param in model.named_parameters():
        add(name, param, buffer=False)
    for name, buf in model.named_buffers():
        if name in persistent:
            add(name, buf, buffer=True)

    groups = []
    for key, layers in folded.items():
        template, param, shape, role, experts, k, linear, buffer, dtype = key
        if key in experts_seen:
            experts = len(experts_seen[key])
        active = min(k, experts) if role == ROUTED_EXPERT and k is not None else experts
        groups.append(
            TensorGroup(
                module=template,
                param=param,
                shape=shape,
                role=role,
                layers=tuple(sorted(layers)),
                experts=experts,
                active_experts=active,
                linear=linear,
                buffer=buffer,
                dtype=dtype,
            )
        )
    return groups


def _kv_widths(model: Any) -> dict[int, int]:
    """K+V elements per token of each decoder layer whose attention has its own `k_proj`
    (a layer that reuses another's K/V, Gemma 3n/4 `is_kv_shared_layer`, holds none)."""
    out: dict[int, int] = {}
    try:
        decoder = model.get_decoder() or model
    except Exception:  # a model class without a decoder accessor
        decoder = model
    for name, module in decoder.named_modules():
        match = re.search(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|attention|attn)$", name)
        if not match or any(marker in name.lower() for marker in _TOWER_PARTS):
            continue
        layer = int(match.group(1))
        if getattr(module, "is_kv_shared_layer", False):
            out[layer] = 0
            continue
        k_proj = getattr(module, "k_proj", None)
        out_features = getattr(k_proj, "out_features", None)
        if not isinstance(out_features, int):
            continue
        v_proj = getattr(module, "v_proj", None)
        v_width = getattr(v_proj, "out_features", None)
        # K=V layers (Gemma 4 attention_k_eq_v) still cache keys and values apart.
        out[layer] = out_features + (v_width if isinstance(v_width, int) else out_features)
    return out
