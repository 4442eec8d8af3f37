"""KV-cache size per token and at maximum context, at bf16."""

from __future__ import annotations

from .attention import CHUNKED, FULL, SLIDING, AttentionLayout
from .config_reader import ModelConfig

KV_DTYPE_BYTES = 2  # bf16 cache, as serving engines default to for bf16 models


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


def kv_cache_bytes_per_token(cfg: ModelConfig, layout: AttentionLayout) -> int:
    """Bytes per token over every layer that keeps K/V (linear-attention/SSM layers keep none)."""
    return kv_bytes_per_layer_token(cfg, layout) * len(layout.layers_of(FULL, SLIDING, CHUNKED))


def kv_cache_bytes_at_context(cfg: ModelConfig, layout: AttentionLayout, tokens: int) -> int:
    """Bytes of one sequence of `tokens` tokens: a sliding layer holds at most `sliding_window`
    tokens, a chunked-attention layer at most `attention_chunk_size` (Llama 4), a full layer
    all of them."""
    per_layer = kv_bytes_per_layer_token(cfg, layout)
    total = 0
    for kind in layout.layer_types:
        if kind == FULL:
            total += per_layer * tokens
        elif kind == SLIDING:
            total += per_layer * min(tokens, layout.window or tokens)
        elif kind == CHUNKED:
            total += per_layer * min(tokens, layout.chunk_size or tokens)
    return total
