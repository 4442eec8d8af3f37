"""Attention: kind (MHA/GQA/MQA/MLA), per-layer pattern, and attention-module parameters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .config_reader import TRANSFORMERS_BUILD, ModelConfig, as_sequence, check_int
from .errors import AnalysisError
from .layer_kinds import (
    CHUNKED,
    FULL,
    KNOWN_NAMES,
    KV_LAYER_TYPES,
    LINEAR,
    MAMBA,
    SLIDING,
    LayerKindGuess,
    guess_layer_kinds,
    indexer_key_widths,
    read_layer_kind,
)
from .tensors import ATTENTION, NORM, TensorGroup, linear, vector


@dataclass(frozen=True)
class MlaDims:
    """Multi-head latent attention ranks (DeepSeek-V2 paper §2.1), widths in elements."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    index_n_heads: int | None = None
    index_head_dim: int | None = None
    index_topk: int | None = None


@dataclass(frozen=True)
class AttentionLayout:
    """Which kind of token mixer each layer has, and the attention shape.

    `layer_types[i]` is one of full/sliding/chunked/linear attention or "mamba".
    `window` is the token span a sliding layer keeps; `chunk_size` that of a chunked layer.
    `guesses`: how the layers of a kind day0 does not know were counted (layer_kinds.py).
    """

    kind: str
    layer_types: tuple[str, ...]
    window: int | None
    chunk_size: int | None
    mla: MlaDims | None
    guesses: tuple[LayerKindGuess, ...] = ()

    def extra_kv_widths(self) -> dict[int, int]:
        """Elements per token a layer caches beside its K/V: the key of a guessed sparse
        layer's indexer (layer_kinds.indexer_key_widths)."""
        return indexer_key_widths(self.guesses)

    def attention_counts_no_kv(self) -> int:
        """Layers without a per-token KV cache (linear attention, SSM)."""
        return sum(1 for t in self.layer_types if t not in KV_LAYER_TYPES)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary: kind, MLA ranks, window, the pattern and per-kind layer counts."""
        counts = {t: self.layer_types.count(t) for t in (FULL, SLIDING, CHUNKED, LINEAR, MAMBA)}
        out: dict[str, Any] = {
            "kind": self.kind,
            "layer_pattern": layer_pattern(self.layer_types),
            "layer_types": list(self.layer_types),
            "sliding_window": self.window if counts[SLIDING] else None,
            "attention_chunk_size": self.chunk_size if counts[CHUNKED] else None,
            "full_layers": counts[FULL],
            "sliding_layers": counts[SLIDING],
            "chunked_layers": counts[CHUNKED],
            "linear_attention_layers": counts[LINEAR],
            "ssm_layers": counts[MAMBA],
            "kv_cache_layers": sum(1 for t in self.layer_types if t in KV_LAYER_TYPES),
        }
        if self.mla is not None:
            out.update(
                q_lora_rank=self.mla.q_lora_rank,
                kv_lora_rank=self.mla.kv_lora_rank,
                qk_nope_head_dim=self.mla.qk_nope_head_dim,
                qk_rope_head_dim=self.mla.qk_rope_head_dim,
                v_head_dim=self.mla.v_head_dim,
            )
            if self.mla.index_head_dim:
                out.update(
                    sparse_attention="DSA indexer",
                    index_n_heads=self.mla.index_n_heads,
                    index_head_dim=self.mla.index_head_dim,
                    index_topk=self.mla.index_topk,
                )
        return out


def layer_pattern(types: tuple[str, ...]) -> str:
    """The shortest repeating unit of the layer types, e.g. "(sliding, full) x 12"."""
    short = [t.removesuffix("_attention") for t in types]
    n = len(short)
    for size in range(1, n + 1):
        if n % size == 0 and short == short[:size] * (n // size):
            unit = ", ".join(short[:size])
            return f"({unit}) x {n // size}" if size > 1 else f"{unit} x {n}"
    return ", ".join(short)


def _hybrid_layer_types(cfg: ModelConfig) -> tuple[str, ...] | None:
    """Linear-attention/full-attention placement of a hybrid family without `layer_types`, as
    its config class derives it; None for a family that is not hybrid.

    "interval" (Qwen3-Next, Qwen3.5): full attention every `full_attention_interval`-th layer.
    "kimi" (Kimi Linear): `linear_attn_config` lists `full_attn_layers` and `kda_layers`
    (1-indexed), else full attention on layers 4, 8, ... (0-indexed, not layer 0).
    "alternate" (MiniMax-01): full attention on even layers, linear on odd ones.
    """
    view, n = cfg.view, cfg.num_layers
    rule = cfg.family.hybrid_rule if cfg.family else None
    if rule == "interval" or (rule is None and view.has("full_attention_interval")):
        interval = view.int("full_attention_interval", 4)
        return tuple(LINEAR if (i + 1) % interval else FULL for i in range(n))  # type: ignore[operator]
    if rule == "kimi":
        linear_cfg = view.raw.get("linear_attn_config")
        if isinstance(linear_cfg, Mapping) and "full_attn_layers" in linear_cfg:
            full = set(as_sequence(linear_cfg["full_attn_layers"]))
            return tuple(FULL if i + 1 in full else LINEAR for i in range(n))
        return tuple(FULL if i and i % 4 == 0 else LINEAR for i in range(n))
    if rule == "alternate":
        return tuple(LINEAR if i % 2 else FULL for i in range(n))
    return None


def _listed_layer_types(
    cfg: ModelConfig, key: str, raw: list, notes: list[str]
) -> tuple[tuple[str, ...], tuple[LayerKindGuess, ...]]:
    """A `layer_types`-style list read entry by entry; the names no rule reads are counted as
    `guess_layer_kinds` says (raises `AnalysisError` when the keys a guess needs are missing)."""
    read = [read_layer_kind(t, i) for i, t in enumerate(raw)]
    unknown: dict[str, list[int]] = {}
    for i, (name, kind) in enumerate(zip(raw, read, strict=True)):
        if kind is None:
            unknown.setdefault(name, []).append(i)
    guesses = tuple(guess_layer_kinds(cfg, key, unknown)) if unknown else ()
    guessed = {i: g.kind for g in guesses for i in g.layers}
    kinds = tuple(guessed.get(i) or kind or FULL for i, kind in enumerate(read))
    read_as = {
        t: k for t, k in zip(raw, kinds, strict=True) if t not in KNOWN_NAMES and t not in unknown
    }
    if read_as:
        # DeepSeek-V4's compressed attention, GLM-5's indexed attention: their K/V is
        # counted as the kind they are read as (an upper bound for compressed K/V).
        notes.append(
            f"{key} names kinds day0 does not model apart: "
            + ", ".join(f"{t} read as {k}" for t, k in sorted(read_as.items()))
        )
    return kinds, guesses


def _layer_types(
    cfg: ModelConfig, notes: list[str]
) -> tuple[tuple[str, ...], tuple[LayerKindGuess, ...]]:
    view, n = cfg.view, cfg.num_layers
    for key in ("layer_types", "layers_block_type"):
        raw = view.raw.get(key)
        if raw is not None:
            if not isinstance(raw, list) or len(raw) != n:
                raise AnalysisError(f"{key} must list one entry per layer ({n})")
            return _listed_layer_types(cfg, key, raw, notes)
    return _derived_layer_types(cfg, notes), ()


def _derived_layer_types(cfg: ModelConfig, notes: list[str]) -> tuple[str, ...]:
    """The layer types of a config without a `layer_types` list, from its family's keys."""
    view, n = cfg.view, cfg.num_layers
    family = cfg.family.name if cfg.family else None
    attn_types = view.raw.get("attn_type_list")
    if attn_types is not None:
        # MiniMax-Text-01 / MiniMax-M1: 0 = lightning (linear) attention, 1 = softmax attention
        # (transformers' MiniMax conversion turns it into layer_types the same way).
        if not isinstance(attn_types, list) or len(attn_types) != n:
            raise AnalysisError(f"attn_type_list must list one entry per layer ({n})")
        if any(t not in (0, 1) or isinstance(t, bool) for t in attn_types):
            raise AnalysisError("attn_type_list entries must be 0 (linear) or 1 (softmax)")
        return tuple(FULL if t == 1 else LINEAR for t in attn_types)
    window = view.int("sliding_window", None, minimum=0)
    if view.has("attn_layer_period") or family == "jamba":
        # Jamba: attention where i % attn_layer_period == attn_layer_offset, Mamba elsewhere.
        period = view.int("attn_layer_period")
        offset = view.int("attn_layer_offset", 0, minimum=0)
        return tuple(FULL if i % period == offset else MAMBA for i in range(n))  # type: ignore[operator]
    hybrid = _hybrid_layer_types(cfg)
    if hybrid is not None:
        return hybrid
    if family == "llama4":
        # Llama 4: NoPE layers use full attention, RoPE layers chunked local attention.
        no_rope = view.raw.get("no_rope_layers")
        if not no_rope:
            interval = view.int("no_rope_layer_interval", 4)
            no_rope = [int((i + 1) % interval != 0) for i in range(n)]  # type: ignore[operator]
        if view.value("attention_chunk_size") is None:
            return (FULL,) * n
        return tuple(CHUNKED if flag else FULL for flag in no_rope)
    if family == "dots1":
        # Dots1Config.__post_init__: sliding on layers >= max_window_layers whenever
        # sliding_window is set (no use_sliding_window switch; the class defaults are 4096, 62).
        if not window:
            return (FULL,) * n
        first = view.int("max_window_layers", n, minimum=0)
        return tuple(SLIDING if i >= first else FULL for i in range(n))  # type: ignore[operator]
    if "use_sliding_window" in view.raw or family in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        # Qwen2 family: sliding only when use_sliding_window, on layers >= max_window_layers
        # (transformers configuration_qwen2.py).
        if not view.bool("use_sliding_window", False) or not window:
            if window and view.has("sliding_window"):
                notes.append(
                    "sliding_window is set but use_sliding_window is false: all layers full"
                )
            return (FULL,) * n
        first = view.int("max_window_layers", n, minimum=0)
        return tuple(SLIDING if i >= first else FULL for i in range(n))  # type: ignore[operator]
    raw_pattern = view.value("sliding_window_pattern")
    if isinstance(raw_pattern, str) and window:
        # EXAONE 4: "LLLG" = three local (sliding) layers then one global, repeated.
        unit = raw_pattern.upper()
        if not unit or set(unit) - {"L", "G"}:
            raise AnalysisError(f"sliding_window_pattern {raw_pattern!r} is not made of L and G")
        return tuple(SLIDING if unit[i % len(unit)] == "L" else FULL for i in range(n))
    if raw_pattern is not None and window:
        # Gemma 2/3: every `pattern`-th layer is global, the others slide.
        pattern = view.int("sliding_window_pattern")
        return tuple(SLIDING if (i + 1) % pattern else FULL for i in range(n))  # type: ignore[operator]
    if window:
        # Mistral v0.1, Phi-3: one window on every layer.
        return (SLIDING,) * n
    return (FULL,) * n


def attention_layout(cfg: ModelConfig) -> tuple[AttentionLayout, list[str]]:
    """The attention kind and per-layer pattern of `cfg`, with notes.

    Kind: MLA when the config has MLA ranks (`kv_lora_rank`); otherwise from the KV heads:
    equal to the attention heads → MHA, one → MQA, between → GQA (Ainslie et al. 2023).
    """
    notes: list[str] = []
    view = cfg.view
    types, guesses = _layer_types(cfg, notes)
    mla = None
    if cfg.is_mla:
        kind = "MLA"
        mla = MlaDims(
            q_lora_rank=view.int("q_lora_rank", None),
            kv_lora_rank=view.int("kv_lora_rank"),  # type: ignore[arg-type]
            qk_nope_head_dim=view.int("qk_nope_head_dim"),  # type: ignore[arg-type]
            qk_rope_head_dim=view.int("qk_rope_head_dim", minimum=0),  # type: ignore[arg-type]
            v_head_dim=view.int("v_head_dim"),  # type: ignore[arg-type]
        )
        # A model type only transformers knows (GLM-5's glm_moe_dsa) says so by its keys.
        built_indexer = cfg.source == TRANSFORMERS_BUILD and view.has("index_head_dim")
        if (cfg.family is not None and cfg.family.mla_indexer) or built_indexer:
            if mla.q_lora_rank is None:
                raise AnalysisError(
                    "the sparse-attention indexer reads q_lora_rank, which is unset"
                )
            mla = replace(
                mla,
                index_n_heads=view.int("index_n_heads"),
                index_head_dim=view.int("index_head_dim"),
                index_topk=view.int("index_topk"),
            )
    elif cfg.num_kv_heads == cfg.num_attention_heads:
        kind = "MHA"
    elif cfg.num_kv_heads == 1:
        kind = "MQA"
    else:
        kind = "GQA"
    window = None
    if SLIDING in types:
        window = view.int("sliding_window", None)
        if window is None:
            raise AnalysisError("layer_types has sliding_attention layers but no sliding_window")
    chunk = None
    if CHUNKED in types:
        chunk = check_int("attention_chunk_size", view.value("attention_chunk_size"))
    return AttentionLayout(kind, types, window, chunk, mla, guesses), notes


def attention_tensors(
    cfg: ModelConfig, layout: AttentionLayout, layers: tuple[int, ...], *, mtp: bool = False
) -> list[TensorGroup]:
    """Parameter tensors of the attention block of `layers` (params per layer by shape).

    Standard: q/k/v/o projections (transformers modeling_llama.py), q/k/v bias when
    `attention_bias` or always in the Qwen2 family, o bias where the family puts one,
    Qwen3/Gemma 3 per-head q_norm/k_norm, OLMo 2 whole-projection norms, gpt-oss sinks,
    Qwen3-Next's output gate doubling q_proj. MLA (modeling_deepseek_v3.py): q_a/q_b with
    q_a_layernorm (or one q_proj without q_lora_rank), kv_a_proj_with_mqa, kv_a_layernorm,
    kv_b_proj, o_proj.
    """
    if not layers:
        return []
    fam = cfg.family
    h = cfg.hidden_size
    p = "model.layers.{layer}.self_attn."
    bias = cfg.attention_bias
    if layout.mla is not None:
        m = layout.mla
        heads = cfg.num_attention_heads
        qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        groups: list[TensorGroup] = []
        if m.q_lora_rank:
            groups += linear(
                p + "q_a_proj", m.q_lora_rank, h, ATTENTION, layers, bias=bias, mtp=mtp
            )
            groups.append(vector(p + "q_a_layernorm", m.q_lora_rank, NORM, layers, mtp=mtp))
            groups += linear(
                p + "q_b_proj", heads * qk_head, m.q_lora_rank, ATTENTION, layers, mtp=mtp
            )
        else:
            groups += linear(p + "q_proj", heads * qk_head, h, ATTENTION, layers, mtp=mtp)
        kv_a_out = m.kv_lora_rank + m.qk_rope_head_dim
        groups += linear(
            p + "kv_a_proj_with_mqa", kv_a_out, h, ATTENTION, layers, bias=bias, mtp=mtp
        )
        groups.append(vector(p + "kv_a_layernorm", m.kv_lora_rank, NORM, layers, mtp=mtp))
        kv_b_out = heads * (m.qk_nope_head_dim + m.v_head_dim)
        groups += linear(p + "kv_b_proj", kv_b_out, m.kv_lora_rank, ATTENTION, layers, mtp=mtp)
        groups += linear(
            p + "o_proj", h, heads * m.v_head_dim, ATTENTION, layers, bias=bias, mtp=mtp
        )
        if m.index_head_dim and m.index_n_heads and m.q_lora_rank:
            # DeepSeek-V3.2 DSA indexer (modeling_deepseek_v32.py DeepseekV32Indexer): wq_b
            # from the q latent, one shared key head wk with a LayerNorm (weight and bias),
            # and per-head weights_proj.
            ip, d = p + "indexer.", m.index_head_dim
            groups += [
                *linear(
                    ip + "wq_b", m.index_n_heads * d, m.q_lora_rank, ATTENTION, layers, mtp=mtp
                ),
                *linear(ip + "wk", d, h, ATTENTION, layers, mtp=mtp),
                vector(ip + "k_norm", d, NORM, layers, mtp=mtp),
                vector(ip + "k_norm", d, NORM, layers, param="bias", mtp=mtp),
                *linear(ip + "weights_proj", m.index_n_heads, h, ATTENTION, layers, mtp=mtp),
            ]
        return groups

    q_width = cfg.num_attention_heads * cfg.head_dim
    kv_width = cfg.num_kv_heads * cfg.head_dim
    qkv_bias = fam.qkv_bias if fam is not None and fam.qkv_bias is not None else bias
    o_bias = bias if fam is None or fam.o_bias_follows_attention_bias else False
    if fam is not None and fam.o_bias_key:
        o_bias = cfg.view.bool(fam.o_bias_key, False)  # Seed-OSS attention_out_bias
    q_out = q_width * (2 if fam is not None and fam.attention_output_gate else 1)
    groups = [
        *linear(p + "q_proj", q_out, h, ATTENTION, layers, bias=qkv_bias, mtp=mtp),
        *linear(p + "k_proj", kv_width, h, ATTENTION, layers, bias=qkv_bias, mtp=mtp),
        *linear(p + "v_proj", kv_width, h, ATTENTION, layers, bias=qkv_bias, mtp=mtp),
        *linear(p + "o_proj", h, q_width, ATTENTION, layers, bias=o_bias, mtp=mtp),
    ]
    qk_norm = fam.qk_norm if fam is not None else None
    if fam is not None and fam.qk_norm_key and not cfg.view.bool(fam.qk_norm_key, False):
        qk_norm = None
    if qk_norm == "head":
        groups += [
            vector(p + "q_norm", cfg.head_dim, NORM, layers, mtp=mtp),
            vector(p + "k_norm", cfg.head_dim, NORM, layers, mtp=mtp),
        ]
    elif qk_norm == "projection":
        groups += [
            vector(p + "q_norm", q_width, NORM, layers, mtp=mtp),
            vector(p + "k_norm", kv_width, NORM, layers, mtp=mtp),
        ]
    if fam is not None and fam.attention_sinks:
        # gpt-oss: one learned sink logit per attention head (modeling_gpt_oss.py `sinks`).
        groups.append(
            vector(p + "sinks", cfg.num_attention_heads, ATTENTION, layers, param="sinks", mtp=mtp)
        )
    return groups
