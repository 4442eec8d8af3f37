"""Checkpoint quantization: what `quantization_config` says, and the bytes it implies.

Byte formulas per method (weights stored as published, scale tensors included):
- fp8 (DeepSeek-V3, Qwen3-FP8; transformers integrations/finegrained_fp8.py): 1 byte per
  value (e4m3), one fp32 `weight_scale_inv` per `weight_block_size` block (128x128), or one
  per tensor without blocks; static activation schemes add one fp32 `input_scale`.
- mxfp4 (gpt-oss; OCP Microscaling Formats spec v1.0): blocks of 32 FP4 values (4 bits each)
  sharing one E8M0 scale byte: 4.25 bits per value. transformers quantizes only MoE experts.
- awq / gptq (AutoAWQ, AutoGPTQ packing): `bits` per value packed in int32, per group of
  `group_size` input columns one fp16 scale and one packed zero point; gptq also stores an
  int32 `g_idx` per input column.
- compressed-tensors (llm-compressor): `num_bits` per value; scales per tensor, channel,
  group or block in the model dtype; zero points for asymmetric schemes.
- NVFP4 (compressed-tensors `nvfp4-pack-quantized`, strategy `tensor_group`; NVIDIA ModelOpt
  `quant_algo: NVFP4`): FP4 E2M1 values packed two per byte (U8 `weight_packed` / `weight`),
  one FP8-E4M3 scale per group of 16 input columns (`weight_scale`), one F32 global scale per
  tensor (`weight_global_scale` / ModelOpt `weight_scale_2`) and, where activations are
  quantized, one F32 `input_global_scale` / `input_scale`. Sources: compressed-tensors docs
  (NVFP4 scheme, `nvfp4-pack-quantized` compressor), NVIDIA Model Optimizer docs ("Unified
  HuggingFace Checkpoint": uint8 packed weights, float8_e4m3fn block scales, float32
  weight_scale_2/input_scale), vLLM docs/features/quantization/modelopt.md.
- ModelOpt FP8 (`quant_algo: FP8`): F8-E4M3 values, one F32 `weight_scale` per tensor and one
  static F32 `input_scale` (vLLM docs: "per-tensor weight scale (+ optional static activation
  scale)"). ModelOpt leaves routers and the LM head unquantized by default; `exclude_modules`
  (or `ignore`) lists the rest it skipped.
- bitsandbytes 4-bit: 4 bits per value plus one absmax per 64 values (fp32, or 1 byte with
  double quantization); 8-bit: 1 byte per value plus one fp32 scale per output row.
Routers (MoE gates), norms, biases and the embedding stay in the model dtype in every method
here; the LM head too unless a compressed-tensors config targets it. The MTP `eh_proj` stays
bf16 as well (DeepSeek-V3's published size only adds up that way).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from math import ceil
from typing import Any

from .errors import AnalysisError
from .tensors import (
    ATTENTION,
    DENSE_MLP,
    LINEAR_MIXER,
    LM_HEAD,
    ROUTED_EXPERT,
    SHARED_EXPERT,
    TensorGroup,
)

DTYPE_BYTES: Mapping[str, int] = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "bf16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
SAFETENSORS_NAME: Mapping[str, str] = {
    "float32": "F32",
    "float": "F32",
    "fp32": "F32",
    "bfloat16": "BF16",
    "bf16": "BF16",
    "float16": "F16",
    "half": "F16",
    "fp16": "F16",
}
_DTYPE_SIZE = {
    "F32": 4,
    "BF16": 2,
    "F16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U8": 1,
    "I32": 4,
    "I8": 1,
}

_DECODER_LINEAR = frozenset({ATTENTION, DENSE_MLP, ROUTED_EXPERT, SHARED_EXPERT, LINEAR_MIXER})


@dataclass(frozen=True)
class QuantScheme:
    """How a method stores one quantized Linear weight.

    `bits`: bits per value. `group_size`: values along the input dimension sharing one scale
    (None: per output channel or per block/tensor). `block`: (rows, cols) of one scale block.
    `per_tensor`: one scale per matrix. `scale_dtype`/`value_dtype`: safetensors dtype names.
    `input_scale`: one F32 activation scale per tensor. `global_scales`: F32 per-tensor scales
    on top of the group scales (NVFP4's second-level scale).
    """

    method: str
    bits: int
    value_dtype: str
    scale_dtype: str
    roles: frozenset[str]
    exclude: tuple[str, ...] = ()
    group_size: int | None = None
    block: tuple[int, int] | None = None
    per_tensor: bool = False
    zero_points: bool = False
    g_idx: bool = False
    input_scale: bool = False
    global_scales: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    def linear_bytes(self, out_features: int, in_features: int) -> dict[str, int]:
        """Bytes of one quantized `(out, in)` weight by safetensors dtype, scales included."""
        n = out_features * in_features
        out = {self.value_dtype: ceil(n * self.bits / 8)}
        if self.block is not None:
            scales = ceil(out_features / self.block[0]) * ceil(in_features / self.block[1])
        elif self.group_size is not None:
            scales = out_features * ceil(in_features / self.group_size)
        elif self.per_tensor:
            scales = 1
        else:
            scales = out_features
        scale_size = _DTYPE_SIZE[self.scale_dtype]
        out[self.scale_dtype] = out.get(self.scale_dtype, 0) + scales * scale_size
        if self.zero_points:
            out["I32"] = out.get("I32", 0) + ceil(scales * self.bits / 8)
        if self.g_idx:
            out["I32"] = out.get("I32", 0) + in_features * 4
        if self.input_scale or self.global_scales:
            out["F32"] = out.get("F32", 0) + 4 * (int(self.input_scale) + self.global_scales)
        return out

    def quantizes(self, group: TensorGroup, layer: int | None) -> bool:
        """Whether this method stores `group` (at `layer`) quantized."""
        if not group.linear or group.role not in self.roles:
            return False
        name = group.module.replace("{expert}", "0")
        if layer is not None:
            name = name.replace("{layer}", str(layer))
        return not any(_matches(pattern, name) for pattern in self.exclude)


def _matches(pattern: str, name: str) -> bool:
    """transformers/compressed-tensors module matching: `re:` regexes, globs, dotted prefixes
    and plain substrings ("lm_head", "mlp.gate", "model.layers.*.self_attn")."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if any(c in pattern for c in "*?["):
        parts = name.split(".")
        prefixes = (".".join(parts[: i + 1]) for i in range(len(parts)))
        return any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes)
    return name == pattern or name.startswith(pattern + ".") or f".{pattern}" in f".{name}"


def _exclusions(qc: Mapping[str, Any]) -> tuple[str, ...]:
    out: list[str] = []
    for key in (
        "modules_to_not_convert",
        "ignore",
        "ignored_layers",
        "llm_int8_skip_modules",
        "exclude_modules",  # NVIDIA ModelOpt
    ):
        value = qc.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise AnalysisError(f"quantization_config.{key} must be a list of module names")
        out += value
    return tuple(out)


def _int_field(qc: Mapping[str, Any], *keys: str, default: int | None = None) -> int | None:
    for key in keys:
        value = qc.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise AnalysisError(f"quantization_config.{key} must be an integer, got {value!r}")
            return value
    return default


def parse_quantization(
    config: Mapping[str, Any], model_dtype: str
) -> tuple[QuantScheme | None, list[str]]:
    """The checkpoint's quantization scheme from `quantization_config` (None when absent).

    An unknown `quant_method` is reported in a note and the weights are counted unquantized.
    """
    notes: list[str] = []
    qc = config.get("quantization_config") or config.get("compression_config")
    if qc is None:
        return None, notes
    if not isinstance(qc, Mapping):
        raise AnalysisError(f"quantization_config must be an object, got {qc!r}")
    method = str(
        qc.get("quant_method")
        or ("bitsandbytes" if qc.get("load_in_4bit") or qc.get("load_in_8bit") else "")
    )
    exclude = _exclusions(qc)
    details: dict[str, Any] = {"method": method, "modules_not_converted": list(exclude)}
    if method in ("fp8", "fbgemm_fp8"):
        block = qc.get("weight_block_size")
        if block is not None and (
            not isinstance(block, list)
            or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
        ):
            raise AnalysisError(
                "quantization_config.weight_block_size must be two positive integers, "
                f"got {block!r}"
            )
        fmt = str(qc.get("fmt") or "e4m3")
        static = qc.get("activation_scheme") == "static"
        details.update(
            format=fmt,
            bits=8,
            weight_block_size=block,
            activation_scheme=qc.get("activation_scheme"),
        )
        scheme = QuantScheme(
            method=method,
            bits=8,
            value_dtype="F8_E5M2" if fmt == "e5m2" else "F8_E4M3",
            scale_dtype="F32",
            roles=_DECODER_LINEAR,
            exclude=exclude,
            block=(block[0], block[1]) if block else None,
            per_tensor=block is None and method == "fp8",
            input_scale=static,
            details=details,
        )
        return scheme, notes
    if method == "mxfp4":
        details.update(format="mxfp4", bits=4, group_size=32, scale_format="e8m0")
        scheme = QuantScheme(
            method=method,
            bits=4,
            value_dtype="U8",
            scale_dtype="U8",
            roles=frozenset({ROUTED_EXPERT}),
            exclude=exclude,
            group_size=32,
            details=details,
        )
        return scheme, notes
    if method in ("awq", "gptq"):
        bits = _int_field(qc, "bits", "w_bit", default=4)
        group = _int_field(qc, "group_size", "q_group_size", default=128)
        assert bits is not None
        if bits not in (2, 3, 4, 8):
            raise AnalysisError(f"quantization_config.bits must be 2, 3, 4 or 8, got {bits}")
        details.update(format=f"int{bits}", bits=bits, group_size=group)
        scheme = QuantScheme(
            method=method,
            bits=bits,
            value_dtype="I32",
            scale_dtype="F16",
            roles=_DECODER_LINEAR,
            exclude=exclude,
            group_size=group if group and group > 0 else None,
            zero_points=True,
            g_idx=method == "gptq",
            details=details,
        )
        return scheme, notes
    if method == "compressed-tensors":
        return _compressed_tensors(qc, exclude, details, model_dtype, notes), notes
    if method == "modelopt" or (not method and isinstance(qc.get("quantization"), Mapping)):
        return _modelopt(qc, notes), notes
    if method == "bitsandbytes":
        four = bool(qc.get("load_in_4bit") or qc.get("_load_in_4bit"))
        double = bool(qc.get("bnb_4bit_use_double_quant"))
        details.update(
            format=str(qc.get("bnb_4bit_quant_type") or "nf4") if four else "int8",
            bits=4 if four else 8,
        )
        roles = _DECODER_LINEAR
        if four:
            scheme = QuantScheme(
                method=method,
                bits=4,
                value_dtype="U8",
                scale_dtype="U8" if double else "F32",
                roles=roles,
                exclude=exclude,
                group_size=64,
                details=details,
            )
        else:
            scheme = QuantScheme(
                method=method,
                bits=8,
                value_dtype="I8",
                scale_dtype="F32",
                roles=roles,
                exclude=exclude,
                details=details,
            )
        notes.append("bitsandbytes checkpoint: scale bytes approximate (absmax per 64 values)")
        return scheme, notes
    notes.append(f"quant_method {method!r} is not modelled: weights counted at {model_dtype}")
    return None, notes


def _compressed_tensors(
    qc: Mapping[str, Any],
    exclude: tuple[str, ...],
    details: dict[str, Any],
    model_dtype: str,
    notes: list[str],
) -> QuantScheme | None:
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise AnalysisError("compressed-tensors quantization_config has no config_groups")
    first = next(iter(groups.values()))
    weights = first.get("weights") if isinstance(first, Mapping) else None
    if not isinstance(weights, Mapping):
        raise AnalysisError("compressed-tensors config group has no weights scheme")
    bits = _int_field(weights, "num_bits")
    if bits is None or bits not in (2, 3, 4, 8, 16):
        raise AnalysisError(
            f"compressed-tensors weights.num_bits must be 2, 3, 4, 8 or 16, got {bits!r}"
        )
    if len(groups) > 1:
        notes.append(
            "compressed-tensors has several config_groups: the first one's scheme is used for all"
        )
    kind = weights.get("type", "int")
    strategy = weights.get("strategy", "tensor")
    group = _int_field(weights, "group_size")
    block = weights.get("block_structure")
    if qc.get("format") == "nvfp4-pack-quantized" or (
        kind == "float" and bits == 4 and strategy == "tensor_group"
    ):
        # Activations quantized too (NVFP4 W4A4) add an F32 input_global_scale per tensor.
        acts = first.get("input_activations")
        details.update(
            format=qc.get("format") or "nvfp4-pack-quantized",
            bits=4,
            type=kind,
            strategy=strategy,
            group_size=group or 16,
            scale_format="e4m3",
            activations_quantized=isinstance(acts, Mapping),
        )
        return _nvfp4_scheme(
            "compressed-tensors",
            exclude,
            details,
            group or 16,
            input_scale=isinstance(acts, Mapping),
            roles=_DECODER_LINEAR | {LM_HEAD},
        )
    value_dtype = ("F8_E4M3" if kind == "float" else "I8") if bits == 8 else "I32"
    scale_dtype = SAFETENSORS_NAME.get(model_dtype, "BF16")
    details.update(
        format=qc.get("format"),
        bits=bits,
        type=kind,
        strategy=strategy,
        group_size=group,
        weight_block_size=block,
        symmetric=weights.get("symmetric", True),
    )
    notes.append(f"compressed-tensors scales counted in the model dtype ({scale_dtype})")
    return QuantScheme(
        method="compressed-tensors",
        bits=bits,
        value_dtype=value_dtype,
        scale_dtype=scale_dtype,
        roles=_DECODER_LINEAR | {LM_HEAD},
        exclude=exclude,
        group_size=group if strategy == "group" else None,
        block=(block[0], block[1])
        if strategy == "block" and isinstance(block, list) and len(block) == 2
        else None,
        per_tensor=strategy == "tensor",
        zero_points=not weights.get("symmetric", True),
        details=details,
    )


def _nvfp4_scheme(
    method: str,
    exclude: tuple[str, ...],
    details: dict[str, Any],
    group: int,
    *,
    input_scale: bool,
    roles: frozenset[str],
) -> QuantScheme:
    """NVFP4: U8-packed FP4 values, FP8-E4M3 group scales, one F32 global scale per tensor."""
    if group <= 0:
        raise AnalysisError(f"NVFP4 group_size must be positive, got {group}")
    return QuantScheme(
        method=method,
        bits=4,
        value_dtype="U8",
        scale_dtype="F8_E4M3",
        roles=roles,
        exclude=exclude,
        group_size=group,
        global_scales=1,
        input_scale=input_scale,
        details=details,
    )


def _modelopt(qc: Mapping[str, Any], notes: list[str]) -> QuantScheme | None:
    """NVIDIA ModelOpt checkpoints: `quant_algo` FP8 or NVFP4, flat in `quantization_config`
    or nested in a `quantization` block as in `hf_quant_config.json` (vLLM's ModelOpt configs
    read both). Exclusions from `exclude_modules` (or `ignore`); group size from `group_size`,
    else the first config group's weights, else 16."""
    block = qc.get("quantization") if isinstance(qc.get("quantization"), Mapping) else qc
    algo = str(block.get("quant_algo") or "").upper()
    exclude = _exclusions(block) if block is not qc else _exclusions(qc)
    details: dict[str, Any] = {
        "method": "modelopt",
        "quant_algo": algo or None,
        "modules_not_converted": list(exclude),
        "kv_cache_quant_algo": block.get("kv_cache_quant_algo"),
    }
    if block.get("kv_cache_quant_algo"):
        notes.append(
            f"ModelOpt kv_cache_quant_algo {block['kv_cache_quant_algo']}: KV-cache figures "
            "stay at bf16; the per-layer k/v scale scalars are not counted"
        )
    roles = _DECODER_LINEAR  # ModelOpt disables router and lm_head quantizers by default
    if algo == "NVFP4":
        group = _int_field(block, "group_size")
        if group is None:
            groups = qc.get("config_groups")
            first = next(iter(groups.values()), None) if isinstance(groups, Mapping) else None
            weights = first.get("weights") if isinstance(first, Mapping) else None
            group = _int_field(weights, "group_size") if isinstance(weights, Mapping) else None
        details.update(format="nvfp4", bits=4, group_size=group or 16, scale_format="e4m3")
        return _nvfp4_scheme(
            "modelopt", exclude, details, group or 16, input_scale=True, roles=roles
        )
    if algo == "FP8":
        details.update(format="e4m3", bits=8)
        return QuantScheme(
            method="modelopt",
            bits=8,
            value_dtype="F8_E4M3",
            scale_dtype="F32",
            roles=roles,
            exclude=exclude,
            per_tensor=True,
            input_scale=True,
            details=details,
        )
    notes.append(
        f"ModelOpt quant_algo {algo or None!r} is not modelled: weights counted unquantized"
    )
    return None


@dataclass(frozen=True)
class WeightBytes:
    """Checkpoint bytes by safetensors dtype, and params stored quantized vs not."""

    total: int
    by_dtype: dict[str, int]
    quantized_params: int
    unquantized_params: int
    scale_bytes: int


def weight_bytes(
    inventory: list[TensorGroup], scheme: QuantScheme | None, model_dtype: str
) -> WeightBytes:
    """Bytes of every tensor in the inventory as the checkpoint stores it (MTP included).

    Unquantized tensors take the model dtype (`torch_dtype`), or their own where the family
    stores them apart (fp32 router score-correction bias).
    """
    base = SAFETENSORS_NAME.get(model_dtype, "BF16")
    by_dtype: dict[str, int] = {}
    quantized = unquantized = scale = 0

    def add(dtype: str, n: int) -> None:
        by_dtype[dtype] = by_dtype.get(dtype, 0) + n

    for g in inventory:
        per_layer = g.layers or (None,)
        if scheme is not None and g.linear and g.role in scheme.roles:
            hits = sum(1 for layer in per_layer if scheme.quantizes(g, layer))
        else:
            hits = 0
        misses = len(per_layer) - hits
        if hits:
            out_f, in_f = g.shape[0], g.shape[1]
            assert scheme is not None
            for dtype, n in scheme.linear_bytes(out_f, in_f).items():
                add(dtype, n * hits * g.experts)
            quantized += g.numel_each * hits * g.experts
            values = ceil(out_f * in_f * scheme.bits / 8)
            scale += (sum(scheme.linear_bytes(out_f, in_f).values()) - values) * hits * g.experts
        if misses:
            dtype = g.dtype or base
            add(dtype, g.numel_each * misses * g.experts * _DTYPE_SIZE[dtype])
            unquantized += g.numel_each * misses * g.experts
    return WeightBytes(
        total=sum(by_dtype.values()),
        by_dtype=dict(sorted(by_dtype.items())),
        quantized_params=quantized,
        unquantized_params=unquantized,
        scale_bytes=scale,
    )


def model_dtype_of(torch_dtype: str | None) -> str:
    """The dtype of unquantized tensors: `torch_dtype`, bf16 when absent or unknown."""
    if torch_dtype is None:
        return "bfloat16"
    name = torch_dtype.removeprefix("torch.")
    return name if name in DTYPE_BYTES else "bfloat16"
