"""The model as the planner sees it: shape and weight bytes per component, from the analysis.

`ModelShape.from_analysis(analysis)` reads `analyze_config(config).to_dict()` (never the
config itself) and checks it; `weight_bytes(dtype)` gives the bytes of each component (input
embedding, LM head, routed experts, shared experts, the rest of the layers) at a serving
dtype. Params are element counts, sizes bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import PlanInputError

MAX_LAYERS = 10_000  # the analysis refuses more (config_reader); a dict past it is not real
MAX_WIDTH = 10_000_000  # hidden/FFN/vocab widths beyond any published model by 100x
MAX_HEADS = 100_000

BF16_BYTES = 2
# Serving dtypes the planner knows, normalised: torch names and the engines' words.
DTYPE_ALIASES = {
    "checkpoint": "checkpoint",
    "auto": "checkpoint",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float8_e4m3fn": "fp8",
    "float8_e4m3fnuz": "fp8",
    "fp8": "fp8",
    "int8": "int8",
    "w8a8": "int8",
    "fp4": "fp4",
    "nvfp4": "fp4",
    "mxfp4": "fp4",
}
# A 4-bit checkpoint as Blackwell-class engines serve it: NVFP4, 4-bit E2M1 values with one
# FP8 scale per 16 (NVIDIA, "Introducing NVFP4", 2025): 4.5 bits, 0.5625 bytes a param.
FP4_BYTES_PER_PARAM = 0.5625


def normalize_dtype(dtype: str | None) -> str:
    """ "checkpoint", "bfloat16", "float16", "fp8", "int8" or "fp4". Raises
    `PlanInputError`."""
    if dtype is None:
        return "checkpoint"
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key not in DTYPE_ALIASES:
        known = ", ".join(sorted(DTYPE_ALIASES))
        raise PlanInputError(f"unknown serving dtype {dtype!r}; known: {known}")
    return DTYPE_ALIASES[key]


def _int(analysis: Mapping[str, Any], key: str, *, minimum: int = 1, maximum: int) -> int:
    value = analysis.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanInputError(f"analysis.{key} must be an integer, got {value!r}")
    if value < minimum:
        raise PlanInputError(f"analysis.{key} must be at least {minimum}, got {value}")
    if value > maximum:
        raise PlanInputError(f"analysis.{key} = {value} is implausibly large (limit {maximum})")
    return value


def _opt_int(mapping: Mapping[str, Any] | None, key: str, *, maximum: int = MAX_WIDTH) -> int:
    if not mapping:
        return 0
    value = mapping.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > maximum:
        raise PlanInputError(f"{key} must be a non-negative integer up to {maximum}, got {value!r}")
    return value


@dataclass(frozen=True)
class WeightParts:
    """Bytes of each weight component of the whole model at one dtype (bytes)."""

    embedding: float
    lm_head: float
    routed_experts: float
    shared_experts: float
    body: float

    @property
    def total(self) -> float:
        return self.embedding + self.lm_head + self.routed_experts + self.shared_experts + self.body


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs of a release (counts, widths; params; bytes)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    attention_kind: str
    full_layers: int
    window_layers: int  # sliding or chunked layers: they keep at most `window` tokens
    window: int
    kv_cache_layers: int
    kv_cache_bytes_per_token: int  # bf16, every KV layer, before TP sharding
    mla: Mapping[str, int] | None
    num_experts: int
    experts_per_token: int
    num_shared_experts: int
    expert_intermediate_size: int
    shared_expert_intermediate_size: int
    moe_layers: int
    total_params: int
    active_params: int
    embedding_params: int
    lm_head_params: int
    routed_expert_params: int
    shared_expert_params: int
    body_params: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    checkpoint_dtype: str  # "bf16", "fp8 e4m3 (128x128 blocks)", "mxfp4", ...
    quant_method: str | None
    quant_block: tuple[int, int] | None
    quantized_fraction: Mapping[str, float]  # per component, the share stored quantized
    quantized_bytes_per_param: float
    unquantized_bytes_per_param: float
    family: str | None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def kv_bytes_per_layer_token(self) -> float:
        """bf16 KV bytes of one token in one KV layer, before TP sharding (bytes)."""
        return self.kv_cache_bytes_per_token / max(1, self.kv_cache_layers)

    def kv_tokens_held(self, context_tokens: int) -> float:
        """Layer-tokens one sequence of `context_tokens` keeps, summed over KV layers: a
        sliding/chunked layer keeps at most its window (as `kv_cache.kv_cache_bytes_at_context`
        of the analysis counts it)."""
        held = self.full_layers * context_tokens
        held += self.window_layers * min(context_tokens, self.window or context_tokens)
        return float(held)

    @classmethod
    def from_analysis(cls, analysis: Mapping[str, Any]) -> ModelShape:
        """Read and check `ArchitectureAnalysis.to_dict()`. Raises `PlanInputError`."""
        if not isinstance(analysis, Mapping):
            raise PlanInputError(f"analysis must be a dict, got {type(analysis).__name__}")
        layers = _int(analysis, "num_layers", maximum=MAX_LAYERS)
        hidden = _int(analysis, "hidden_size", maximum=MAX_WIDTH)
        heads = _int(analysis, "num_attention_heads", maximum=MAX_HEADS)
        kv_heads = _int(analysis, "num_kv_heads", maximum=MAX_HEADS)
        head_dim = _int(analysis, "head_dim", maximum=MAX_WIDTH)
        vocab = _int(analysis, "vocab_size", maximum=100 * MAX_WIDTH)
        attention = analysis.get("attention") or {}
        if not isinstance(attention, Mapping):
            raise PlanInputError("analysis.attention must be an object")
        kind = str(attention.get("kind") or "GQA")
        if hidden % heads and analysis.get("head_dim") == hidden // heads:
            raise PlanInputError(
                f"hidden_size ({hidden}) is not divisible by num_attention_heads ({heads})"
            )
        if kind != "MLA" and (kv_heads > heads or heads % kv_heads):
            raise PlanInputError(
                f"num_attention_heads ({heads}) must be a multiple of num_kv_heads ({kv_heads})"
            )
        moe = analysis.get("moe") or None
        if moe is not None and not isinstance(moe, Mapping):
            raise PlanInputError("analysis.moe must be an object or null")
        ffn = _opt_int(analysis, "intermediate_size")
        n_experts = _opt_int(moe, "num_experts", maximum=1_000_000)
        top_k = _opt_int(moe, "experts_per_token", maximum=1_000_000)
        n_shared = _opt_int(moe, "num_shared_experts", maximum=1_000)
        f_expert = _opt_int(moe, "expert_intermediate_size")
        f_shared = _opt_int(moe, "shared_expert_intermediate_size") or f_expert
        moe_layers = _opt_int(moe, "moe_layers", maximum=MAX_LAYERS)
        if moe is not None and (n_experts < 1 or top_k < 1 or f_expert < 1 or top_k > n_experts):
            raise PlanInputError(
                "analysis.moe needs num_experts >= experts_per_token >= 1 and a positive "
                f"expert_intermediate_size, got {n_experts}, {top_k}, {f_expert}"
            )
        if moe_layers > layers:
            raise PlanInputError(f"moe_layers ({moe_layers}) exceed num_layers ({layers})")
        if moe is None and ffn < 1:
            raise PlanInputError("analysis.intermediate_size must be a positive integer")

        total = _int(analysis, "total_params", maximum=10**15)
        active = _int(analysis, "active_params", maximum=10**15)
        extra = _opt_int(analysis, "extra_params", maximum=10**15)
        embedding = _opt_int(analysis, "embedding_params", maximum=10**15) or vocab * hidden
        tie = bool(analysis.get("tie_word_embeddings"))
        lm_head = 0 if tie else vocab * hidden
        routed = moe_layers * n_experts * 3 * hidden * f_expert
        shared = moe_layers * n_shared * 3 * hidden * f_shared
        body = total - embedding - lm_head - routed - shared
        if body < 0:
            raise PlanInputError(
                f"total_params ({total:,}) is smaller than the embedding, LM head and expert "
                "weights the MoE layout implies: the analysis is inconsistent"
            )

        weight_bytes = _int(analysis, "weight_bytes", maximum=10**16)
        quant = analysis.get("quantization") or None
        fractions = {"embedding": 0.0, "lm_head": 0.0, "routed": 0.0, "shared_body": 0.0}
        torch_dtype = str(analysis.get("torch_dtype") or "bfloat16").removeprefix("torch.")
        unq_bpp = 4.0 if torch_dtype == "float32" else float(BF16_BYTES)
        q_bpp = unq_bpp
        method = None
        block: tuple[int, int] | None = None
        if isinstance(quant, Mapping) and quant.get("quantized_params"):
            method = str(quant.get("method") or "")
            q_params = int(quant["quantized_params"])
            u_params = int(quant.get("unquantized_params") or 0)
            q_bpp = max(0.0, (weight_bytes - u_params * unq_bpp) / max(1, q_params))
            # MTP modules (extra_params) are stored quantized like the layers they copy.
            remaining = float(max(0, q_params - extra))
            for key, size in (
                ("routed", routed),
                ("shared_body", shared + body),
                ("embedding", embedding),
                ("lm_head", lm_head),
            ):
                take = min(remaining, float(size))
                fractions[key] = take / size if size else 0.0
                remaining -= take
            wbs = quant.get("weight_block_size")
            if (
                isinstance(wbs, list | tuple)
                and len(wbs) == 2
                and all(isinstance(v, int) and v > 0 for v in wbs)
            ):
                block = (int(wbs[0]), int(wbs[1]))
        else:
            params = total + extra
            unq_bpp = weight_bytes / params if params else unq_bpp
        checkpoint_dtype = _checkpoint_dtype_name(quant, torch_dtype, block)

        window_layers = _opt_int(attention, "sliding_layers", maximum=MAX_LAYERS) + _opt_int(
            attention, "chunked_layers", maximum=MAX_LAYERS
        )
        window = _opt_int(attention, "sliding_window") or _opt_int(
            attention, "attention_chunk_size"
        )
        kv_layers = _opt_int(attention, "kv_cache_layers", maximum=MAX_LAYERS) or layers
        full_layers = _opt_int(attention, "full_layers", maximum=MAX_LAYERS)
        if full_layers + window_layers == 0:
            full_layers = kv_layers
        kv_per_token = _opt_int(analysis, "kv_cache_bytes_per_token", maximum=10**12)
        mla = None
        if kind == "MLA":
            mla = {
                key: _opt_int(attention, key)
                for key in (
                    "q_lora_rank",
                    "kv_lora_rank",
                    "qk_nope_head_dim",
                    "qk_rope_head_dim",
                    "v_head_dim",
                )
            }
        max_pos = analysis.get("max_position_embeddings")
        if not (isinstance(max_pos, int) and not isinstance(max_pos, bool) and max_pos > 0):
            max_pos = None
        return cls(
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=vocab,
            intermediate_size=ffn,
            attention_kind=kind,
            full_layers=full_layers,
            window_layers=window_layers,
            window=window,
            kv_cache_layers=kv_layers,
            kv_cache_bytes_per_token=kv_per_token,
            mla=mla,
            num_experts=n_experts,
            experts_per_token=top_k,
            num_shared_experts=n_shared,
            expert_intermediate_size=f_expert,
            shared_expert_intermediate_size=f_shared if n_shared else 0,
            moe_layers=moe_layers,
            total_params=total,
            active_params=active,
            embedding_params=embedding,
            lm_head_params=lm_head,
            routed_expert_params=routed,
            shared_expert_params=shared,
            body_params=body,
            tie_word_embeddings=tie,
            max_position_embeddings=max_pos,
            checkpoint_dtype=checkpoint_dtype,
            quant_method=method,
            quant_block=block,
            quantized_fraction=fractions,
            quantized_bytes_per_param=q_bpp,
            unquantized_bytes_per_param=unq_bpp,
            family=analysis.get("family"),
        )

    def bytes_per_param(self, component: str, dtype: str) -> float:
        """Bytes one param of `component` takes at serving `dtype` (bytes/param).

        "checkpoint": as stored (quantized share at the checkpoint's measured rate, scales
        included; the rest at the model dtype). "bfloat16"/"float16": 2 bytes (a dequantized
        copy). "fp8"/"int8": linear layers 1 byte (vLLM's online FP8 / W8A8 keep the
        embedding and LM head at 16 bits, docs "FP8 W8A8"), never more than the checkpoint.
        "fp4": a pre-quantized NVFP4 checkpoint, linear layers `FP4_BYTES_PER_PARAM`, the
        embedding and LM head at 16 bits.
        """
        frac = self.quantized_fraction.get(component, 0.0)
        stored = (
            frac * self.quantized_bytes_per_param + (1 - frac) * self.unquantized_bytes_per_param
        )
        if dtype == "checkpoint":
            return stored
        if dtype in ("bfloat16", "float16"):
            return float(BF16_BYTES)
        if component in ("embedding", "lm_head"):
            return min(stored, float(BF16_BYTES))
        if dtype == "fp4":
            return min(stored, FP4_BYTES_PER_PARAM)
        return min(stored, 1.0)

    def weight_parts(self, dtype: str) -> WeightParts:
        """Bytes of each component of the whole model at `dtype` (bytes)."""
        body_bpp = self.bytes_per_param("shared_body", dtype)
        return WeightParts(
            embedding=self.embedding_params * self.bytes_per_param("embedding", dtype),
            lm_head=self.lm_head_params * self.bytes_per_param("lm_head", dtype),
            routed_experts=self.routed_expert_params * self.bytes_per_param("routed", dtype),
            shared_experts=self.shared_expert_params * body_bpp,
            body=self.body_params * body_bpp,
        )

    def dtype_label(self, dtype: str) -> str:
        """Human words for a serving dtype ("fp8", "bfloat16", "checkpoint (mxfp4)")."""
        if dtype == "checkpoint":
            return f"checkpoint ({self.checkpoint_dtype})"
        return dtype

    def computes_in_4bit(self, dtype: str) -> bool:
        """Whether the matmuls run on 4-bit units (NVFP4 weights and activations)."""
        return dtype == "fp4"

    def computes_in_8bit(self, dtype: str) -> bool:
        """Whether the matmuls run on 8-bit units (FP8/INT8 weights and activations)."""
        if dtype in ("fp8", "int8"):
            return True
        return (
            dtype == "checkpoint"
            and self.quant_method in ("fp8", "compressed-tensors")
            and (math.isclose(self.quantized_bytes_per_param, 1.0, rel_tol=0.05))
        )


def _checkpoint_dtype_name(
    quant: Mapping[str, Any] | None, torch_dtype: str, block: tuple[int, int] | None
) -> str:
    if not isinstance(quant, Mapping) or not quant.get("method"):
        return torch_dtype
    name = str(quant.get("format") or quant.get("method"))
    if block:
        name += f" ({block[0]}x{block[1]} blocks)"
    return f"{quant.get('method')} {name}" if name != quant.get("method") else name


def default_context_tokens(shape: ModelShape) -> int:
    """The release's max context, capped at `DEFAULT_CONTEXT_CAP` tokens (a plan for the
    full 128k-1M window of every sequence would overstate what a pool needs)."""
    if shape.max_position_embeddings is None:
        return DEFAULT_CONTEXT_CAP
    return min(shape.max_position_embeddings, DEFAULT_CONTEXT_CAP)


DEFAULT_CONTEXT_CAP = 32_768  # tokens
DEFAULT_CONCURRENCY = 4  # sequences held at the target context at once
