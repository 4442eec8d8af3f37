"""KV-cache size per token and at a context length, at bf16.

A sliding-window (or chunked-attention) layer needs only its last `sliding_window` tokens, but
whether that memory is given back depends on the serving engine, so a long-context figure is
given both ways (`SLIDING_WINDOW_KV_ENGINES` says which engine does which):

- freed: sliding layers hold at most `sliding_window` tokens (chunked layers
  `attention_chunk_size`), full layers every token;
- kept: every KV layer holds every token (full-length KV on sliding layers too).

Engines free and allocate in blocks (vLLM 16 tokens by default), so a freed sliding layer
really holds the window rounded up to whole blocks; the figure here is the exact window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .attention import CHUNKED, KV_LAYER_TYPES, SLIDING, AttentionLayout
from .config_reader import ModelConfig

KV_DTYPE_BYTES = 2  # bf16 cache, as serving engines default to for bf16 models

# Which engines free the KV of tokens that left a sliding window, and which keep it.
# Sources: vLLM docs, design/hybrid_kv_cache_manager ("Sliding window layers: reserve slots
# only for the most recent sliding_window_size tokens"); vllm/config/scheduler.py
# `disable_hybrid_kv_cache_manager` ("allocate the same size of KV cache for all attention
# layers even if there are multiple type of attention layers like full attention and sliding
# window attention"); vllm/config/vllm.py, which turns the hybrid manager off on platforms
# without `support_hybrid_kv_cache()`, for KV connectors that do not support it, and for
# chunked local attention unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 (vLLM
# 0.32). SGLang python/sglang/srt/server_args.py: the hybrid SWA memory pool (SWAKVPool, sized
# by `--swa-full-tokens-ratio`) and `--disable-hybrid-swa-memory`, under which every layer
# keeps the whole KV. llama.cpp common/arg.cpp `--swa-full`: "use full-size SWA cache
# (default: false)".
SLIDING_WINDOW_KV_ENGINES: Mapping[str, tuple[str, ...]] = {
    "freed": (
        "vLLM V1 with its hybrid KV cache manager (the default, CPU and GPU)",
        "SGLang with its hybrid SWA memory pool (the default for sliding-window models)",
        "llama.cpp (the default SWA cache)",
    ),
    "kept": (
        "vLLM with --disable-hybrid-kv-cache-manager, or where vLLM turns the hybrid manager "
        "off: a KV connector without hybrid support, chunked local attention (Llama 4) unless "
        "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1",
        "SGLang with --disable-hybrid-swa-memory",
        "llama.cpp with --swa-full",
    ),
}


def kv_bytes_per_layer_token(cfg: ModelConfig, layout: AttentionLayout) -> int:
    """Bytes one attention layer caches per token.

    GQA/MQA/MHA: K and V, `num_kv_heads x head_dim` each → 2 x kv_heads x head_dim x 2 bytes.
    MLA (DeepSeek-V2 paper §2.1.2; vLLM/SGLang MLA backends): the compressed latent
    (`kv_lora_rank`) and the shared RoPE key (`qk_rope_head_dim`) only → (kv_lora_rank +
    qk_rope_head_dim) x 2 bytes, no x2 for K and V, the same on every tensor-parallel rank.
    DeepSeek-V3.2's sparse-attention indexer also caches one `index_head_dim` key per token
    and layer (transformers `DynamicIndexedLayer.indexer_keys`).
    """
    if layout.mla is not None:
        m = layout.mla
        return (m.kv_lora_rank + m.qk_rope_head_dim + (m.index_head_dim or 0)) * KV_DTYPE_BYTES
    return 2 * cfg.num_kv_heads * cfg.head_dim * KV_DTYPE_BYTES


def kv_bytes_by_layer(
    cfg: ModelConfig, layout: AttentionLayout, widths: Mapping[int, int] | None = None
) -> list[int]:
    """Bytes each layer caches per token (0 for linear-attention/SSM layers).

    `widths`: K+V elements per token of layers whose attention module transformers built
    (meta_build.py: per-layer head_dim, layers that reuse another layer's K/V); MLA layers
    and layers not in it use `kv_bytes_per_layer_token`. A layer of a kind day0 does not know,
    counted as sparse attention with an indexer, also caches the indexer's key
    (`AttentionLayout.extra_kv_widths`).
    """
    per_layer = kv_bytes_per_layer_token(cfg, layout)
    extra = layout.extra_kv_widths()
    out = []
    for i, kind in enumerate(layout.layer_types):
        if kind not in KV_LAYER_TYPES:
            out.append(0)
        elif widths and i in widths and layout.mla is None:
            out.append((widths[i] + extra.get(i, 0)) * KV_DTYPE_BYTES)
        else:
            out.append(per_layer + extra.get(i, 0) * KV_DTYPE_BYTES)
    return out


def kv_cache_bytes_per_token(
    cfg: ModelConfig, layout: AttentionLayout, widths: Mapping[int, int] | None = None
) -> int:
    """Bytes per token over every layer that keeps K/V (linear-attention/SSM layers keep none)."""
    return sum(kv_bytes_by_layer(cfg, layout, widths))


def kv_cache_bytes_at_context(
    cfg: ModelConfig,
    layout: AttentionLayout,
    tokens: int,
    *,
    keep_full_length: bool = False,
    widths: Mapping[int, int] | None = None,
) -> int:
    """Bytes of one sequence of `tokens` tokens.

    Freed (default): a sliding layer holds at most `sliding_window` tokens, a chunked-attention
    layer at most `attention_chunk_size` (Llama 4), a full layer all of them. Kept
    (`keep_full_length`): every KV layer holds all `tokens`.
    """
    total = 0
    by_layer = kv_bytes_by_layer(cfg, layout, widths)
    for kind, per_layer in zip(layout.layer_types, by_layer, strict=True):
        held = tokens
        if not keep_full_length and kind == SLIDING:
            held = min(tokens, layout.window or tokens)
        elif not keep_full_length and kind == CHUNKED:
            held = min(tokens, layout.chunk_size or tokens)
        total += per_layer * held
    return total


@dataclass(frozen=True)
class WindowedKv:
    """KV bytes of one sequence of `tokens` tokens, freed and kept (see module docstring)."""

    tokens: int
    freed_bytes: int
    kept_bytes: int

    def to_dict(self) -> dict[str, object]:
        """JSON-able: both figures and which engines give which."""
        return {
            "tokens": self.tokens,
            "freed_bytes": self.freed_bytes,
            "kept_bytes": self.kept_bytes,
            "freed_by": list(SLIDING_WINDOW_KV_ENGINES["freed"]),
            "kept_by": list(SLIDING_WINDOW_KV_ENGINES["kept"]),
        }


def windowed_kv(
    cfg: ModelConfig,
    layout: AttentionLayout,
    tokens: int,
    widths: Mapping[int, int] | None = None,
) -> WindowedKv | None:
    """Both long-context figures when the model has sliding or chunked layers, else None."""
    if not any(kind in (SLIDING, CHUNKED) for kind in layout.layer_types):
        return None
    return WindowedKv(
        tokens=tokens,
        freed_bytes=kv_cache_bytes_at_context(cfg, layout, tokens, widths=widths),
        kept_bytes=kv_cache_bytes_at_context(
            cfg, layout, tokens, keep_full_length=True, widths=widths
        ),
    )
