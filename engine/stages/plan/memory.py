"""Memory per device of one split: weights, KV cache, activations/workspace, runtime overhead.

All figures are bytes on the heaviest device (the pipeline stage holding the most). The
budget is `GPU_MEMORY_UTILIZATION` x device memory, as vLLM reserves it (engine argument
`gpu_memory_utilization`, default 0.9: "the fraction of GPU memory to be used for the model
executor"); `free` is capacity minus what is used, so it includes the 10% outside the budget.

Assumptions (stated in every plan):
- Weights: each component at the serving dtype (`model.ModelShape.weight_parts`). Decoder
  layers are spread evenly over PP stages (ceil(L / PP) on the heaviest); TP shards every
  layer's weights 1/TP (norms are replicated, a negligible share); a KV head replicated past
  TP = kv_heads costs its K/V projection on every holding rank; the embedding sits on the
  first stage and the LM head on the last, each split 1/TP over the padded vocabulary. With
  EP (vLLM --enable-expert-parallel) a rank holds ceil(experts / EP) whole experts; without
  it experts are TP-sharded like any FFN. DP replicas hold their own copy of everything but
  the EP-spread experts.
- KV cache: bf16 (the analysis's `kv_cache_bytes_per_token`; an FP8 KV cache halves it,
  `kv_scale`), `context_tokens` x the
  replica's share of `concurrency` sequences; a sliding/chunked layer keeps only its window;
  GQA K/V split over TP (or one replicated head per rank); MLA's latent whole on every TP
  rank (DeepSeek-V2 §2.1; vLLM MLA backends) but split over DP ranks (DP attention).
- Activations/workspace: one decoder layer's intermediates for a prefill chunk of
  `PREFILL_CHUNK_TOKENS` tokens at bf16 (inference keeps one layer's activations alive at a
  time; vLLM sizes this by profiling a forward pass at `max_num_batched_tokens`, and the
  plan's launch commands pass that value), plus fp32 logits of the sequences sampled.
- Runtime overhead: `RUNTIME_OVERHEAD_BYTES` per device for the framework context,
  communication buffers and CUDA-graph pools (an assumption, not a measurement).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model import BF16_BYTES, ModelShape
from .validity import Split, Validity

GPU_MEMORY_UTILIZATION = 0.9  # vLLM default gpu_memory_utilization
PREFILL_CHUNK_TOKENS = 8192  # tokens per prefill chunk; passed as --max-num-batched-tokens
RUNTIME_OVERHEAD_BYTES = 2 * 2**30  # bytes per device (assumption)
FP32_BYTES = 4


@dataclass(frozen=True)
class MemoryPerDevice:
    """Bytes on the heaviest device of a split."""

    weights: float
    kv_cache: float
    activations_workspace: float
    runtime_overhead: float
    capacity: int
    budget: float  # capacity x GPU_MEMORY_UTILIZATION
    kv_bytes_per_sequence: float  # one sequence at the target context on this device

    @property
    def used(self) -> float:
        return self.weights + self.kv_cache + self.activations_workspace + self.runtime_overhead

    @property
    def fits(self) -> bool:
        return self.used <= self.budget

    @property
    def free(self) -> float:
        """Bytes left below the full capacity: the share outside the budget plus any
        headroom inside it."""
        return self.capacity - self.used

    @property
    def kv_room(self) -> float:
        """Bytes of the budget left for KV cache after weights, workspace and overhead."""
        return self.budget - self.weights - self.activations_workspace - self.runtime_overhead

    def to_dict(self) -> dict:
        return {
            "weights": round(self.weights),
            "kv_cache": round(self.kv_cache),
            "activations_workspace": round(self.activations_workspace),
            "runtime_overhead": round(self.runtime_overhead),
            "free": round(self.free),
            "total_used": round(self.used),
            "capacity": self.capacity,
            "budget": round(self.budget),
        }


def stage_layers(shape: ModelShape, pp: int) -> int:
    """Decoder layers on the heaviest PP stage: ceil(L / PP)."""
    return -(-shape.num_layers // pp)


@dataclass(frozen=True)
class DeviceWeights:
    """Weight bytes on the heaviest device, by part (bytes)."""

    embedding: float  # input embedding rows (read only for the tokens looked up)
    lm_head: float
    routed_experts: float
    other: float  # attention, dense/shared FFN, norms, routers, replicated KV heads

    @property
    def total(self) -> float:
        return self.embedding + self.lm_head + self.routed_experts + self.other


def device_weights(
    shape: ModelShape, split: Split, validity: Validity, dtype: str
) -> DeviceWeights:
    """Weight bytes on the heaviest device at `dtype`, by part (see the module docstring)."""
    parts = shape.weight_parts(dtype)
    tp, pp = split.tp, split.pp
    n_stage = stage_layers(shape, pp)
    layer_share = n_stage / shape.num_layers
    moe_share = min(shape.moe_layers, n_stage) / shape.moe_layers if shape.moe_layers else 0.0
    other = parts.body * layer_share / tp + parts.shared_experts * moe_share / tp
    routed = 0.0
    if shape.is_moe:
        if split.ep > 1:
            per_rank = math.ceil(shape.num_experts / split.ep)
            routed = parts.routed_experts * moe_share * per_rank / shape.num_experts
        else:
            routed = parts.routed_experts * moe_share / tp
    if validity.kv_replication > 1 and not shape.mla:
        # Each rank holds one whole KV head instead of kv_heads / tp of one.
        kv_proj_params = 2 * shape.hidden_size * shape.head_dim * n_stage
        extra_heads = 1 - shape.num_kv_heads / tp
        other += kv_proj_params * extra_heads * shape.bytes_per_param("shared_body", dtype)
    vocab_scale = validity.padded_vocab / shape.vocab_size / tp
    embedding = parts.embedding * vocab_scale
    # Tied embeddings: with PP, vLLM keeps a copy of the table on the last stage as LM head.
    lm_head = (parts.lm_head or (parts.embedding if pp > 1 else 0.0)) * vocab_scale
    if pp > 1:
        # The first stage holds the embedding, the last the LM head: the heavier of the two.
        if embedding >= lm_head:
            lm_head = 0.0
        else:
            embedding = 0.0
    return DeviceWeights(embedding=embedding, lm_head=lm_head, routed_experts=routed, other=other)


def weights_per_device(shape: ModelShape, split: Split, validity: Validity, dtype: str) -> float:
    """Weight bytes on the heaviest device at `dtype` (bytes)."""
    return device_weights(shape, split, validity, dtype).total


def kv_bytes_per_sequence(
    shape: ModelShape, split: Split, validity: Validity, context_tokens: int
) -> float:
    """KV bytes one sequence of `context_tokens` keeps on one device (bytes)."""
    held = shape.kv_tokens_held(context_tokens) * stage_layers(shape, split.pp) / shape.num_layers
    per_layer_token = shape.kv_bytes_per_layer_token
    if not shape.mla:
        per_layer_token *= validity.kv_heads_per_rank / shape.num_kv_heads
    return held * per_layer_token


def sequences_per_replica(split: Split, concurrency: int) -> int:
    """Sequences one DP replica holds: ceil(concurrency / DP)."""
    return -(-concurrency // split.dp)


def workspace_per_device(shape: ModelShape, split: Split, concurrency: int) -> float:
    """One decoder layer's bf16 intermediates for a prefill chunk, plus fp32 logits (bytes).

    Per token: the residual and normed hidden states (2 x hidden), and the widest layer
    output on this rank: the QKV projection ((heads + 2 x kv_heads) x head_dim / TP), the
    gate/up projection (2 x FFN / TP), or for MoE the routed tokens' gate/up outputs
    (experts_per_token x 2 x expert FFN / TP, the fused-MoE intermediate cache).
    """
    tp = split.tp
    h = shape.hidden_size
    qkv = (shape.num_attention_heads + 2 * shape.num_kv_heads) * shape.head_dim / tp
    ffn = 2 * shape.intermediate_size / tp
    moe = 0.0
    if shape.is_moe:
        expert_tp = 1 if split.ep > 1 else tp
        moe = shape.experts_per_token * 2 * shape.expert_intermediate_size / expert_tp
    per_token = (2 * h + max(qkv, ffn, moe)) * BF16_BYTES
    logits = sequences_per_replica(split, concurrency) * shape.vocab_size / tp * FP32_BYTES
    return PREFILL_CHUNK_TOKENS * per_token + logits


def memory_per_device(
    shape: ModelShape,
    split: Split,
    validity: Validity,
    *,
    dtype: str,
    context_tokens: int,
    concurrency: int,
    capacity_bytes: int,
    kv_scale: float = 1.0,
) -> MemoryPerDevice:
    """Memory of the heaviest device of `split` (bytes; see the module docstring).
    `kv_scale` is the KV dtype's bytes over bf16's (0.5 for an FP8 KV cache)."""
    per_seq = kv_bytes_per_sequence(shape, split, validity, context_tokens) * kv_scale
    return MemoryPerDevice(
        weights=weights_per_device(shape, split, validity, dtype),
        kv_cache=per_seq * sequences_per_replica(split, concurrency),
        activations_workspace=workspace_per_device(shape, split, concurrency),
        runtime_overhead=float(RUNTIME_OVERHEAD_BYTES),
        capacity=capacity_bytes,
        budget=capacity_bytes * GPU_MEMORY_UTILIZATION,
        kv_bytes_per_sequence=per_seq,
    )


MEMORY_ASSUMPTIONS = (
    f"budget = {GPU_MEMORY_UTILIZATION} x device memory (vLLM gpu_memory_utilization "
    "default); free = capacity - used, including the share outside the budget",
    f"activations/workspace: one decoder layer's bf16 intermediates for a "
    f"{PREFILL_CHUNK_TOKENS}-token prefill chunk (--max-num-batched-tokens "
    f"{PREFILL_CHUNK_TOKENS} in the launch commands) plus fp32 logits per sequence",
    f"runtime overhead: {RUNTIME_OVERHEAD_BYTES / 2**30:.0f} GiB per device for the framework "
    "context, communication buffers and CUDA graphs (assumed, not measured)",
    "KV cache at bf16 unless an FP8 KV cache is asked for; sliding/chunked layers keep only "
    "their window; MLA latent whole on every TP rank; GQA heads split over TP, replicated "
    "past the KV-head count",
    "decoder layers spread evenly over PP stages (ceil(L/PP) on the heaviest); embedding on "
    "the first stage, LM head on the last; vocab padded to a multiple of 64 (vLLM)",
    "MTP (next-token-prediction) modules are not loaded (no speculative decoding)",
)
