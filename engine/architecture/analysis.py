"""`analyze_config`: the architecture analysis of one release, from its config and weights."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from engine import formatting as fmt

from .attention import attention_layout
from .config_reader import (
    ESTIMATED,
    TRANSFORMERS_BUILD,
    ModelConfig,
    read_config,
    structural_default_notes,
)
from .errors import AnalysisError
from .kv_cache import kv_cache_bytes_at_context, kv_cache_bytes_per_token, windowed_kv
from .layer_kinds import layer_kind_assumptions
from .meta_build import MetaBuild, MetaBuildError
from .moe import moe_layout
from .params import build_inventory, built_inventory, count_params, mtp_layer_count
from .quantization import QuantScheme, WeightBytes, model_dtype_of, parse_quantization, weight_bytes
from .rope import rope_info

CONVENTIONS: Mapping[str, str] = {
    "total_params": (
        "parameters of the main model as transformers instantiates it on the meta device; "
        "MTP modules (extra_params) and buffers such as the router score-correction bias "
        "(router_score_bias_params) are excluded"
    ),
    "active_params": (
        "parameters used per token, excluding the input embedding table (the convention of "
        "DeepSeek-V3, Qwen3 and gpt-oss 'activated' figures): non-expert weights, "
        "experts_per_token routed experts per MoE layer, shared experts, routers, the LM head "
        "(with tied embeddings the shared matrix counts once, as the LM head). Some model cards "
        "count the input embedding too (Llama-4-Scout's '17B active'): compare those with "
        "active_params_including_embedding"
    ),
    "active_params_including_embedding": (
        "active_params plus the input embedding table (when embeddings are untied; a tied "
        "table is already in active_params as the LM head)"
    ),
    "extra_params": "parameters stored in the checkpoint outside the main model (MTP modules)",
    "weight_bytes": (
        "bytes of every tensor as the checkpoint stores it: quantized values, scale tensors, "
        "buffers and MTP modules included; safetensors headers not included"
    ),
    "kv_cache_bytes": "bf16 K/V (MLA: latent + RoPE key) over every layer that keeps K/V",
    "kv_cache_bytes_at_max_context": (
        "one sequence of max_position_embeddings tokens with out-of-window KV freed: a "
        "sliding-window layer holds sliding_window tokens (chunked layers their chunk); "
        "kv_cache_bytes_at_max_context_kept is the same sequence with full-length KV on every "
        "layer; kv_cache_windowed says which engines do which"
    ),
    "params_source": (
        "family table: day0's own module list for the family; transformers meta-device build: "
        "a model type day0's table lacks, built by the installed transformers on the meta "
        "device and counted exactly; estimated: a model type neither knows, counted with "
        "Llama-style modules from the standard keys (assumptions lists what was assumed)"
    ),
    "estimated_layer_kinds": (
        "layer_types names day0 does not know, each with the kind its layers were counted as "
        "(counted_as), the layers, the word of the name that decided it (hint) and any indexer "
        "counted with it; the KV-cache figures follow the guess, and the parameters too unless "
        "transformers built the model (assumptions says the same in words)"
    ),
}


@dataclass(frozen=True)
class ArchitectureAnalysis:
    """The architecture of one release. Params are element counts, sizes are bytes.

    `attention`, `rope`, `moe` and `quantization` are JSON-able dicts (`moe`/`quantization`
    None when dense/unquantized). `config_keys` lets a later release see what is new.
    `estimated_layer_kinds`: how the layers of a `layer_types` name day0 does not know were
    counted (`layer_kinds.LayerKindGuess.to_dict`), each also an entry of `assumptions`.
    """

    architecture: str | None
    model_type: str | None
    family: str | None
    family_known: bool
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int | None
    attention: dict[str, Any]
    rope: dict[str, Any]
    moe: dict[str, Any] | None
    quantization: dict[str, Any] | None
    total_params: int
    active_params: int
    extra_params: int
    embedding_params: int
    router_score_bias_params: int
    mtp_layers: int
    weight_bytes: int
    weight_bytes_by_dtype: dict[str, int]
    checkpoint_total_size_bytes: int | None
    kv_cache_bytes_per_token: int
    kv_cache_bytes_at_max_context: int | None
    kv_cache_bytes_at_max_context_kept: int | None
    kv_cache_windowed: dict[str, Any] | None
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    torch_dtype: str | None
    config_keys: list[str]
    params_source: str = "family table"
    params_by_group: dict[str, int] = field(default_factory=dict)
    multimodal_tower_params: int = 0
    assumptions: list[str] = field(default_factory=list)
    estimated_layer_kinds: list[dict[str, Any]] = field(default_factory=list)
    conventions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def estimated(self) -> bool:
        """True when the parameter counts are an estimate (a model type nobody knows)."""
        return self.params_source == ESTIMATED

    @property
    def active_params_including_embedding(self) -> int:
        """`active_params` plus the input embedding table, counted once (params)."""
        if self.tie_word_embeddings:
            return self.active_params
        return self.active_params + self.embedding_params

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field (fresh containers, safe to mutate)."""
        return {
            "architecture": self.architecture,
            "model_type": self.model_type,
            "family": self.family,
            "family_known": self.family_known,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "intermediate_size": self.intermediate_size,
            "attention": _copy(self.attention),
            "rope": _copy(self.rope),
            "moe": _copy(self.moe),
            "quantization": _copy(self.quantization),
            "total_params": self.total_params,
            "active_params": self.active_params,
            "active_params_including_embedding": self.active_params_including_embedding,
            "extra_params": self.extra_params,
            "embedding_params": self.embedding_params,
            "router_score_bias_params": self.router_score_bias_params,
            "mtp_layers": self.mtp_layers,
            "weight_bytes": self.weight_bytes,
            "weight_bytes_by_dtype": dict(self.weight_bytes_by_dtype),
            "checkpoint_total_size_bytes": self.checkpoint_total_size_bytes,
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
            "kv_cache_bytes_at_max_context": self.kv_cache_bytes_at_max_context,
            "kv_cache_bytes_at_max_context_kept": self.kv_cache_bytes_at_max_context_kept,
            "kv_cache_windowed": _copy(self.kv_cache_windowed),
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": self.torch_dtype,
            "config_keys": list(self.config_keys),
            "params_source": self.params_source,
            "estimated": self.estimated,
            "params_by_group": dict(self.params_by_group),
            "multimodal_tower_params": self.multimodal_tower_params,
            "assumptions": list(self.assumptions),
            "estimated_layer_kinds": _copy(self.estimated_layer_kinds),
            "conventions": dict(self.conventions),
            "notes": list(self.notes),
        }


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return value


def _checkpoint_size(weights: Mapping[str, Any] | None) -> int | None:
    if not weights:
        return None
    total = weights.get("total_size")
    if total is None:
        return None
    if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
        raise AnalysisError(f"weights.total_size must be a positive integer, got {total!r}")
    return total


def _weight_notes(
    cfg: ModelConfig,
    scheme: QuantScheme | None,
    wb: WeightBytes,
    weights: Mapping[str, Any] | None,
    checkpoint_size: int | None,
) -> list[str]:
    """Cross-checks between config, computed bytes and the published checkpoint."""
    notes: list[str] = []
    dtype = (cfg.torch_dtype or "").removeprefix("torch.")
    if scheme is not None and dtype in ("bfloat16", "float16", "float32"):
        notes.append(
            f"torch_dtype says {dtype} but quantization_config says {scheme.method}: "
            f"quantized weights counted as {scheme.details.get('format', scheme.method)} "
            f"({wb.quantized_params:,} params), {dtype} only for the rest"
        )
    if cfg.torch_dtype is None:
        notes.append("torch_dtype absent: unquantized tensors counted as bf16")
    dtypes = (weights or {}).get("dtypes") or {}
    if isinstance(dtypes, Mapping) and dtypes:
        has_f8 = any(str(k).startswith("F8") for k in dtypes)
        if has_f8 and (scheme is None or "F8" not in scheme.value_dtype):
            notes.append(
                "the checkpoint holds F8 tensors but quantization_config does not say fp8: "
                "weight_bytes may be overstated"
            )
        if scheme is not None and "F8" in scheme.value_dtype and not has_f8:
            notes.append("quantization_config says fp8 but the checkpoint lists no F8 tensors")
    if checkpoint_size:
        ratio = wb.total / checkpoint_size
        if abs(ratio - 1) > 0.02:
            notes.append(
                f"computed weight_bytes {wb.total:,} differ from the published checkpoint "
                f"{checkpoint_size:,} by {100 * (ratio - 1):+.1f}%"
            )
    return notes


def analyze_config(config: dict, *, weights: dict | None = None) -> ArchitectureAnalysis:
    """Analyse a parsed `config.json` (and optionally the fetch stage's weights summary).

    `weights`: `{"source", "total_size" (bytes), "shard_count", "tensor_count", "dtypes"}`;
    used for `checkpoint_total_size_bytes` and to cross-check quantization. Raises
    `AnalysisError` (naming the keys) when the config cannot be analysed.
    """
    if weights is not None and not isinstance(weights, Mapping):
        raise AnalysisError(f"weights must be an object or null, got {type(weights).__name__}")
    cfg = read_config(config)
    layout, attn_notes = attention_layout(cfg)
    try:
        moe, moe_notes = moe_layout(cfg)
    except AnalysisError as err:
        if cfg.source != TRANSFORMERS_BUILD:
            raise
        # transformers builds it anyway (ERNIE-4.5-VL's per-modality expert lists): the
        # parameters come from the build; only the MoE summary is missing.
        moe, moe_notes = (
            None,
            [
                f"MoE keys not read ({err}): no MoE summary; active_params counts "
                "num_experts_per_tok routed experts per layer where it is one integer, else every "
                "expert (an upper bound)"
            ],
        )
    if moe is None and cfg.intermediate_size is None and cfg.source != TRANSFORMERS_BUILD:
        raise AnalysisError("config.json is missing required key: intermediate_size")
    rope, rope_notes = rope_info(cfg.view, layout.layer_types)
    model_dtype = model_dtype_of(cfg.torch_dtype)
    scheme, quant_notes = parse_quantization(cfg.view.raw, model_dtype)
    build: MetaBuild | None = None
    if cfg.source == TRANSFORMERS_BUILD:
        try:
            inventory, build = built_inventory(cfg, moe)
        except MetaBuildError as err:
            # Never a refusal: the standard keys still give an estimate.
            cfg = replace(cfg, source=ESTIMATED)
            cfg.view.notes.append(f"meta-device build of {cfg.model_type!r} failed ({err})")
            cfg.view.assumptions.append(
                "transformers could not build the model: Llama-style modules (q/k/v/o "
                "projections, gated MLP, two RMSNorms per layer) from the standard keys"
            )
    if build is None:
        inventory = build_inventory(cfg, layout, moe)
    # After the build (or its failure): the words say whose parameters these are.
    cfg.view.assumptions.extend(layer_kind_assumptions(cfg, layout.guesses, moe))
    counts = count_params(cfg, inventory)
    wb = weight_bytes(inventory, scheme, model_dtype)
    checkpoint_size = _checkpoint_size(weights)
    mtp = mtp_layer_count(cfg)
    kv_widths = build.kv_widths if build is not None else None
    notes = list(cfg.view.notes)  # with what the build added

    notes += attn_notes + moe_notes + rope_notes + quant_notes
    notes += structural_default_notes(cfg.view)
    notes += _weight_notes(cfg, scheme, wb, weights, checkpoint_size)
    if build is not None:
        notes.append(
            f"parameters counted from transformers' {build.class_name} built on the meta "
            f"device ({build.build_s:.1f} s)"
        )
        if counts.towers:
            notes.append(
                f"multimodal towers and projectors: {counts.towers:,} params, in "
                "multimodal_tower_params and params_by_group, not in total_params"
            )
    if mtp:
        layout_note = ""
        if cfg.family is not None and cfg.family.mtp_layout == "qwen3_next":
            layout_note = (
                " (stored under mtp.*: fc, pre-fc norms, "
                f"{fmt.counted(mtp, 'full-attention MoE decoder layer')} and a norm; the "
                "embedding and LM head are the main model's)"
            )
        elif build is not None:
            layout_note = (
                " (estimated: transformers builds none; each taken as a copy of the last "
                "decoder layer plus DeepSeek-V3's enorm, hnorm, eh_proj and shared_head.norm)"
            )
        notes.append(
            f"{fmt.counted(mtp, 'MTP (next-token-prediction) module')}{layout_note}: "
            f"{counts.extra:,} params "
            "in extra_params, not in total_params; their bytes are in weight_bytes"
        )
    if counts.buffers:
        notes.append(
            f"router score-correction bias (e_score_correction_bias, {counts.buffers:,} values) "
            "is a buffer in transformers: not in total_params, in weight_bytes as fp32"
            if build is None
            else f"persistent buffers ({counts.buffers:,} values) are stored in the checkpoint "
            "but are not parameters in transformers: not in total_params, in weight_bytes"
        )
    if layout.kind == "MLA":
        notes.append("MLA KV cache: latent + RoPE key per layer, identical on every TP rank")
    if layout.attention_counts_no_kv():
        notes.append(
            "linear-attention/SSM layers keep a fixed-size recurrent state per sequence, not "
            "per-token KV: not in the KV-cache figures"
        )
    if kv_widths and any(width == 0 for width in kv_widths.values()):
        shared = sum(1 for width in kv_widths.values() if width == 0)
        notes.append(
            f"{fmt.counted(shared, 'layer')} {'reuses' if shared == 1 else 'reuse'} another "
            "layer's K/V (transformers is_kv_shared_layer): no KV cache of "
            f"{'its' if shared == 1 else 'their'} own"
        )

    max_pos = cfg.max_position_embeddings
    windowed = windowed_kv(cfg, layout, max_pos, kv_widths) if max_pos else None
    if windowed is not None:
        notes.append(
            f"KV cache at {max_pos:,} tokens: {windowed.freed_bytes:,} B where the engine frees "
            f"out-of-window KV (vLLM, SGLang by default), {windowed.kept_bytes:,} B where it "
            "keeps full-length KV on sliding layers (see kv_cache_windowed)"
        )
    quant = _quant_dict(scheme, wb)
    return ArchitectureAnalysis(
        architecture=cfg.architecture,
        model_type=cfg.model_type,
        family=cfg.family.name if cfg.family else cfg.model_type,
        family_known=cfg.family is not None,
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size,
        intermediate_size=cfg.intermediate_size,
        attention=layout.to_dict(),
        rope=rope,
        moe=moe.to_dict() if moe else None,
        quantization=quant,
        total_params=counts.total,
        active_params=counts.active,
        extra_params=counts.extra,
        embedding_params=counts.embedding,
        router_score_bias_params=counts.buffers,
        mtp_layers=mtp,
        weight_bytes=wb.total,
        weight_bytes_by_dtype=wb.by_dtype,
        checkpoint_total_size_bytes=checkpoint_size,
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(cfg, layout, kv_widths),
        kv_cache_bytes_at_max_context=kv_cache_bytes_at_context(
            cfg, layout, max_pos, widths=kv_widths
        )
        if max_pos
        else None,
        kv_cache_bytes_at_max_context_kept=kv_cache_bytes_at_context(
            cfg, layout, max_pos, keep_full_length=True, widths=kv_widths
        )
        if max_pos
        else None,
        kv_cache_windowed=windowed.to_dict() if windowed is not None else None,
        max_position_embeddings=max_pos,
        tie_word_embeddings=cfg.tie_word_embeddings,
        torch_dtype=cfg.torch_dtype,
        config_keys=list(cfg.config_keys),
        params_source=cfg.source,
        params_by_group=counts.by_group,
        multimodal_tower_params=counts.towers,
        assumptions=list(cfg.view.assumptions),
        estimated_layer_kinds=[guess.to_dict() for guess in layout.guesses],
        conventions=dict(CONVENTIONS),
        notes=notes,
    )


def _quant_dict(scheme: QuantScheme | None, wb: WeightBytes) -> dict[str, Any] | None:
    if scheme is None:
        return None
    return {
        **scheme.details,
        "quantized_params": wb.quantized_params,
        "unquantized_params": wb.unquantized_params,
        "scale_bytes": wb.scale_bytes,
    }


__all__ = ["ArchitectureAnalysis", "analyze_config"]
