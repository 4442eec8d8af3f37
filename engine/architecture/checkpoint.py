"""Parameters counted from the checkpoint's own tensors (its safetensors headers), for any
architecture: per stored dtype and per tensor group, and the active parameters per token.

Groups, by tensor-name patterns that hold across families (`group_of`): `embedding`,
`per_layer_embedding`, `lm_head`, `attention`, `linear_mixer`, `norm`, `dense_mlp`,
`routed_expert`, `shared_expert`, `router`, `other`, and outside `total_params`: `mtp`
(multi-token-prediction modules: `mtp.*`, or decoder layers past `num_hidden_layers`),
`multimodal_tower` (vision/audio towers and projectors), `buffers` (tensors transformers
keeps as buffers: DeepSeek's router `e_score_correction_bias`) and `quantization_scales`.

Quantization scales and other quantization metadata (`weight_scale_inv`, `*_scales` beside
`*_blocks`, AWQ/GPTQ `scales`/`qzeros`/`g_idx`, compressed-tensors `weight_scale`/
`weight_shape`, bitsandbytes `quant_state`, any F8_E8M0 tensor) count as bytes, never as
parameters. Packed low-bit weights count by logical elements: gpt-oss MXFP4 `*_blocks` hold
two FP4 values per byte, AWQ/GPTQ `qweight` and compressed-tensors `weight_packed` 32/bits
values per int32 (8/bits per byte), a U8/I8/I32 `weight` under a 4-bit method (bitsandbytes
nf4, NVFP4) its storage bits / the method's bits.

Active parameters follow the config-derived count's convention (see `analysis.CONVENTIONS`):
every main-model parameter except the input embedding tables (with no LM head stored, the
tied table counts once, as the LM head), routed experts scaled per layer by the router's
top-k over the experts that layer holds.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.hubs.base import SAFETENSORS_DTYPE_BITS, tensor_nbytes

from .checkpoint_names import (
    MTP_MARKERS,
    PLACEHOLDER,
    decoder_layer,
    is_tower,
    name_template,
    strip_wrappers,
)

EMBEDDING = "embedding"
PER_LAYER_EMBEDDING = "per_layer_embedding"
LM_HEAD = "lm_head"
ROUTED_EXPERT = "routed_expert"
MTP = "mtp"
TOWER = "multimodal_tower"
BUFFERS = "buffers"
SCALES = "quantization_scales"
# Groups outside total_params.
OUTSIDE_TOTAL = frozenset({MTP, TOWER, BUFFERS, SCALES})

# Relative difference up to which the config-derived count and the checkpoint's agree (a
# rounding in the config's figures, not a modelling error).
AGREE_WITHIN = 1e-4

_SCALE_PARAMS = frozenset(
    {
        "weight_scale_inv",
        "weight_scale",
        "weight_scale_2",
        "weight_global_scale",
        "weight_zero_point",
        "weight_shape",
        "weight_g_idx",
        "input_scale",
        "input_global_scale",
        "input_zero_point",
        "k_scale",
        "v_scale",
        "q_scale",
        "qzeros",
        "g_idx",
        "absmax",
        "quant_map",
        "nested_absmax",
        "nested_quant_map",
        "SCB",
        "weight_format",
    }
)
_QUANTIZED_DTYPES = frozenset(
    {"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "U8", "I8", "I32", "F4"}
)
_INTEGER_DTYPES = frozenset({"U8", "I8", "I16", "U16", "I32", "U32"})
_BUFFER_PARAMS = frozenset({"e_score_correction_bias"})


@dataclass(frozen=True)
class TensorCount:
    """One checkpoint tensor as counted: `params` logical elements (0 for a scale),
    `bytes` as stored, its `group`, decoder `layer` (None outside the stack), routed
    `expert` index (None when fused or not an expert), `packed` logical values per stored
    element, and the MTP module it belongs to (`mtp_module`: the `mtp.N` number, else its
    decoder layer; meaningful in group MTP only)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    params: int
    bytes: int
    group: str
    layer: int | None
    expert: int | None
    packed: int = 1
    mtp_module: int | None = None


def _siblings(tensors: Mapping[str, Any]) -> dict[str, set[str]]:
    by_module: dict[str, set[str]] = defaultdict(set)
    for name in tensors:
        module, _, param = name.rpartition(".")
        by_module[module].add(param)
    return by_module


def _is_scale(
    name: str, dtype: str, tensors: Mapping[str, Any], siblings: dict[str, set[str]]
) -> bool:
    module, _, param = name.rpartition(".")
    if dtype == "F8_E8M0" or param in _SCALE_PARAMS or "quant_state" in name.split("."):
        return True
    around = siblings.get(module, set())
    if param == "scales" and "qweight" in around:
        return True
    if param.endswith("_scales") and param[: -len("_scales")] + "_blocks" in around:
        return True
    if param == "scale" and "weight" in around:
        weight = tensors.get(f"{module}.weight") if module else tensors.get("weight")
        return isinstance(weight, Mapping) and weight.get("dtype") in _QUANTIZED_DTYPES
    return False


def packing_factor(name: str, dtype: str, bits: int | None) -> int:
    """Logical values per stored element of a (non-scale) tensor: 2 for gpt-oss `*_blocks`
    (FP4 in U8), storage bits / `bits` for AWQ/GPTQ `qweight`, compressed-tensors
    `weight_packed` and an integer `weight` under a sub-byte method, else 1. `bits`: the
    quantization method's bits per value (None: not quantized)."""
    param = name.rpartition(".")[2]
    stored = SAFETENSORS_DTYPE_BITS.get(dtype, 0)
    if param.endswith("_blocks") and dtype == "U8":
        return 2
    if param in ("qweight", "weight_packed") and dtype in _INTEGER_DTYPES:
        return max(1, stored // (bits or 4))
    if param == "weight" and dtype in _INTEGER_DTYPES and bits and bits < stored:
        return stored // bits
    return 1


def base_name(name: str) -> str:
    """The name of the weight a packed tensor stores: `x_blocks` → `x`, `.qweight` and
    `.weight_packed` → `.weight`; other names unchanged."""
    module, dot, param = name.rpartition(".")
    if param.endswith("_blocks"):
        return f"{module}{dot}{param[: -len('_blocks')]}"
    if param in ("qweight", "weight_packed"):
        return f"{module}{dot}weight"
    return name


def group_of(name: str) -> str:
    """The group of a main-model (non-scale, non-MTP) tensor, from its name."""
    if is_tower(name):
        return TOWER
    parts = strip_wrappers(name).split(".")
    modules, param = parts[:-1], parts[-1]
    if param in _BUFFER_PARAMS:
        return BUFFERS
    if "lm_head" in modules or ".".join(parts) in ("head.weight", "output.weight"):
        return LM_HEAD
    if any(p.startswith(("embed_tokens_per_layer", "per_layer_embed")) for p in modules):
        return PER_LAYER_EMBEDDING
    if any(p in ("embed_tokens", "wte", "word_embeddings", "tok_embeddings") for p in modules):
        return EMBEDDING
    if ".".join(parts) in ("embed.weight", "embedding.weight", "embeddings.weight"):
        return EMBEDDING
    if any("shared_expert_gate" in p for p in modules):
        return "router"
    if any(p.startswith("shared_expert") or p == "shared_mlp" for p in modules):
        return "shared_expert"
    if "experts" in modules:
        return ROUTED_EXPERT
    if any(p in ("gate", "router", "wg") or "router" in p for p in modules):
        return "router"
    if any("norm" in p or p.startswith("ln_") for p in parts[-2:]):
        return "norm"
    if any(p in ("linear_attn", "mamba", "mixer", "ssm") for p in modules):
        return "linear_mixer"
    if any(p in ("self_attn", "attention", "attn", "self_attention") for p in modules):
        return "attention"
    if any(p in ("mlp", "feed_forward", "ffn", "block_sparse_moe") for p in modules):
        return "dense_mlp"
    return "other"


@dataclass(frozen=True)
class _TemplateFacts:
    """What a name template (`checkpoint_names.name_template`) says, the same for every
    layer and expert: which of its numbers is the decoder layer, the routed expert, the
    MTP module; whether it holds an MTP-only part; its group in the main model."""

    layer_slot: int | None
    expert_slot: int | None
    mtp_slot: int | None
    mtp_name: bool
    mtp_marker: bool
    group: str


def _slot_after(parts: list[str], index: int) -> int | None:
    """Which number (0-based among the `*` parts) is the first `*` after `parts[index]`."""
    for j in range(index + 1, len(parts)):
        if parts[j] == PLACEHOLDER:
            return parts[:j].count(PLACEHOLDER)
    return None


def _template_facts(template: str) -> _TemplateFacts:
    parts = template.split(".")
    layer_slot = 0 if decoder_layer(template.replace(PLACEHOLDER, "0")) is not None else None
    expert_slot = mtp_slot = None
    mtp_name = False
    for i, part in enumerate(parts[:-1]):
        if part == "experts" and parts[i + 1] == PLACEHOLDER and expert_slot is None:
            expert_slot = parts[: i + 1].count(PLACEHOLDER)
        if not mtp_name and (part.startswith("mtp") or part in ("nextn", "next_n")):
            mtp_name, mtp_slot = True, _slot_after(parts, i)
    return _TemplateFacts(
        layer_slot=layer_slot,
        expert_slot=expert_slot,
        mtp_slot=mtp_slot,
        mtp_name=mtp_name,
        mtp_marker=bool(MTP_MARKERS & set(parts)),
        group=group_of(template),
    )


def classify(
    tensors: Mapping[str, Mapping[str, Any]],
    *,
    num_layers: int,
    mtp_layers: int,
    bits: int | None,
    buffers: frozenset[str] = frozenset(),
) -> list[TensorCount]:
    """Every tensor of `{name: {"dtype", "shape"}}` as counted. Decoder layers at or past
    `num_layers` are MTP when the config declares `mtp_layers` or the layer holds an MTP
    part (`enorm`, `hnorm`, `eh_proj`, `shared_head`); `buffers` names tensors transformers
    keeps as buffers. What a name says is worked out once per name template (its layer and
    expert numbers aside). Raises ValueError for a dtype safetensors does not define."""
    siblings = _siblings(tensors)
    facts: dict[str, _TemplateFacts] = {}
    named: list[tuple[str, Mapping[str, Any], _TemplateFacts, tuple[int, ...]]] = []
    mtp_past: set[int] = set()
    for name, info in tensors.items():
        template, numbers = name_template(name)
        fact = facts.get(template)
        if fact is None:
            fact = facts[template] = _template_facts(template)
        named.append((name, info, fact, numbers))
        past = fact.layer_slot is not None and numbers[fact.layer_slot] >= num_layers
        if past and (mtp_layers > 0 or fact.mtp_marker):
            mtp_past.add(numbers[fact.layer_slot])  # type: ignore[index]
    counted = []
    for name, info, fact, numbers in named:
        dtype = str(info.get("dtype"))
        shape = tuple(int(d) for d in info.get("shape", ()))
        layer = numbers[fact.layer_slot] if fact.layer_slot is not None else None
        packed = 1
        if _is_scale(name, dtype, tensors, siblings):
            group, params = SCALES, 0
        else:
            packed = packing_factor(name, dtype, bits)
            params = math.prod(shape) * packed
            if fact.mtp_name or (layer is not None and layer in mtp_past):
                group = MTP
            elif name in buffers:
                group = BUFFERS
            else:
                group = fact.group
        counted.append(
            TensorCount(
                name=name,
                dtype=dtype,
                shape=shape,
                params=params,
                bytes=tensor_nbytes(dtype, shape),
                group=group,
                layer=layer,
                expert=numbers[fact.expert_slot] if fact.expert_slot is not None else None,
                packed=packed,
                mtp_module=(numbers[fact.mtp_slot] if fact.mtp_slot is not None else 0)
                if fact.mtp_name
                else layer,
            )
        )
    return counted


def _top_k(moe: Mapping[str, Any] | None, layer: int) -> int | None:
    """Experts per token of `layer` from the config analysis's `moe` (per-layer list first)."""
    if not isinstance(moe, Mapping):
        return None
    per_layer = moe.get("per_layer")
    if isinstance(per_layer, Mapping):
        values = per_layer.get("experts_per_token")
        if isinstance(values, list) and 0 <= layer < len(values) and isinstance(values[layer], int):
            return values[layer]
    k = moe.get("experts_per_token")
    return k if isinstance(k, int) and not isinstance(k, bool) else None


def _routed_by_layer(counted: list[TensorCount]) -> dict[int, tuple[int, int]]:
    """{layer: (routed params, experts held)}: experts from distinct indices, else the
    fused tensors' leading dimension."""
    params: dict[int, int] = defaultdict(int)
    indices: dict[int, set[int]] = defaultdict(set)
    fused: dict[int, int] = defaultdict(int)
    for t in counted:
        if t.group != ROUTED_EXPERT or t.layer is None:
            continue
        params[t.layer] += t.params
        if t.expert is not None:
            indices[t.layer].add(t.expert)
        elif t.shape:
            fused[t.layer] = max(fused[t.layer], t.shape[0])
    return {
        layer: (total, len(indices[layer]) or fused[layer] or 1) for layer, total in params.items()
    }


def quantization_bits(analysis: Mapping[str, Any]) -> int | None:
    """Bits per value of the analysis's declared quantization (None when unquantized)."""
    quant = analysis.get("quantization")
    bits = quant.get("bits") if isinstance(quant, Mapping) else None
    return bits if isinstance(bits, int) and not isinstance(bits, bool) and bits > 0 else None


def classify_for(
    tensors: Mapping[str, Mapping[str, Any]],
    analysis: Mapping[str, Any],
    *,
    buffers: frozenset[str] = frozenset(),
) -> list[TensorCount]:
    """`classify` with the layer count, MTP count and quantization bits of the config-derived
    `analysis`. Raises ValueError for a dtype safetensors does not define."""
    return classify(
        tensors,
        num_layers=int(analysis.get("num_layers") or 0),
        mtp_layers=int(analysis.get("mtp_layers") or 0),
        bits=quantization_bits(analysis),
        buffers=buffers,
    )


def count_checkpoint(counted: list[TensorCount], analysis: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint's own counts (params, bytes) from its tensors as `classify_for` counted
    them; see the module for the groups and conventions. `analysis` is the config-derived
    analysis (its `moe` gives the router's top-k per layer).

    Returns {"total_params", "active_params", "active_params_including_embedding",
    "extra_params" (MTP), "multimodal_tower_params", "buffer_params", "embedding_params",
    "params_by_group", "bytes_by_group", "params_by_dtype", "bytes_by_dtype",
    "weight_bytes", "scale_bytes", "tensor_count", "decoder_layers", "mtp_modules",
    "experts_by_layer" ({experts held: MoE layers holding that many}), "packed_tensors",
    "notes"}.
    """
    params_by_group: dict[str, int] = defaultdict(int)
    bytes_by_group: dict[str, int] = defaultdict(int)
    params_by_dtype: dict[str, int] = defaultdict(int)
    bytes_by_dtype: dict[str, int] = defaultdict(int)
    packed = 0
    for t in counted:
        params_by_group[t.group] += t.params
        bytes_by_group[t.group] += t.bytes
        bytes_by_dtype[t.dtype] += t.bytes
        if t.group != SCALES:
            params_by_dtype[t.dtype] += t.params
        packed += t.packed > 1
    total = sum(v for g, v in params_by_group.items() if g not in OUTSIDE_TOTAL)
    embedding = params_by_group.get(EMBEDDING, 0)
    per_layer = params_by_group.get(PER_LAYER_EMBEDDING, 0)
    has_head = params_by_group.get(LM_HEAD, 0) > 0
    active = total - per_layer - (embedding if has_head else 0)
    notes: list[str] = []
    experts_by_layer: dict[int, int] = defaultdict(int)
    moe = analysis.get("moe")
    for layer, (routed, experts) in sorted(_routed_by_layer(counted).items()):
        experts_by_layer[experts] += 1
        k = _top_k(moe, layer)
        if k is None:
            notes.append(
                f"layer {layer} holds {experts} routed experts but the config names no experts "
                "per token: all counted as active"
            )
            continue
        active -= routed - routed * min(k, experts) // experts
    main_layers = {t.layer for t in counted if t.layer is not None and t.group not in (MTP, TOWER)}
    mtp_ids = {t.mtp_module for t in counted if t.group == MTP}
    return {
        "total_params": total,
        "active_params": active,
        "active_params_including_embedding": active + (embedding if has_head else 0),
        "extra_params": params_by_group.get(MTP, 0),
        "multimodal_tower_params": params_by_group.get(TOWER, 0),
        "buffer_params": params_by_group.get(BUFFERS, 0),
        "embedding_params": embedding + per_layer,
        "params_by_group": dict(sorted((g, v) for g, v in params_by_group.items() if g != SCALES)),
        "bytes_by_group": dict(sorted(bytes_by_group.items())),
        "params_by_dtype": dict(sorted(params_by_dtype.items())),
        "bytes_by_dtype": dict(sorted(bytes_by_dtype.items())),
        "weight_bytes": sum(bytes_by_dtype.values()),
        "scale_bytes": bytes_by_group.get(SCALES, 0),
        "tensor_count": len(counted),
        "decoder_layers": len(main_layers),
        "mtp_modules": len(mtp_ids),
        "experts_by_layer": {str(k): v for k, v in sorted(experts_by_layer.items())},
        "packed_tensors": packed,
        "notes": notes,
    }


# Figures compared between the config-derived analysis and the checkpoint, and the
# checkpoint's key for each.
COMPARED = {
    "total_params": "total_params",
    "active_params": "active_params",
    "extra_params": "extra_params",
    "multimodal_tower_params": "multimodal_tower_params",
    "weight_bytes": "weight_bytes",
}


def _relative(config: int, checkpoint: int) -> float | None:
    if config == checkpoint:
        return 0.0
    return (checkpoint - config) / config if config else None


def compare_counts(analysis: Mapping[str, Any], checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The config-derived figures beside the checkpoint's: {figure: {"config", "checkpoint",
    "difference" (checkpoint minus config), "relative" (of the config's; None when it is 0)}},
    "groups" the same per tensor group where the two differ, and "agree": whether
    total_params agree within `AGREE_WITHIN`."""
    figures: dict[str, Any] = {}
    for key, ckpt_key in COMPARED.items():
        config_value, ckpt_value = analysis.get(key), checkpoint.get(ckpt_key)
        if not isinstance(config_value, int) or not isinstance(ckpt_value, int):
            continue
        figures[key] = {
            "config": config_value,
            "checkpoint": ckpt_value,
            "difference": ckpt_value - config_value,
            "relative": _relative(config_value, ckpt_value),
        }
    config_groups = analysis.get("params_by_group") or {}
    ckpt_groups = checkpoint.get("params_by_group") or {}
    groups = {}
    for group in sorted(set(config_groups) | set(ckpt_groups)):
        if group in (MTP, BUFFERS):
            continue
        a, b = int(config_groups.get(group) or 0), int(ckpt_groups.get(group) or 0)
        if a != b:
            groups[group] = {"config": a, "checkpoint": b, "difference": b - a}
    total = figures.get("total_params")
    agree = total is not None and (
        total["relative"] is not None and abs(total["relative"]) <= AGREE_WITHIN
    )
    return {"figures": figures, "groups": groups, "agree": agree}
