"""Time of one engine step on one device, as a sum of kernels (seconds). Predictions.

A serving engine runs its batch one forward step at a time: every decoding sequence adds one
token, and prefill chunks of waiting prompts share the step (continuous batching with chunked
prefill: vLLM's scheduler, TensorRT-LLM's in-flight batching, SGLang's mixed chunks). One step
on the heaviest device of a split is the sum of its kernels, each bounded by the slower of
its bytes and its FLOPs ("Efficiently Scaling Transformer Inference", Pope et al. 2022, §2-3;
the roofline of Williams et al. 2009 per kernel, not over the whole step):

    t_step = t_fixed + t_dense + t_lm_head + t_attention + t_experts + t_comm

- t_fixed = step_s + layer_s x layers on the device: the scheduler, sampling and the launch
  and synchronisation cost of each layer's kernels (a fitted constant pair, `fits.py`);
  these dominate small batches (DeepSeek-V3 at batch 1 on 8 x H200: 33 ms per token against
  1.2 ms of weight reads).
- t_dense = max(W_dense / BW_eff, 2 x N_dense x T / F_eff): attention projections, dense and
  shared-expert FFNs, routers, over the T tokens of the step (decode + prefill).
- t_lm_head: the LM head's GEMM over the decoding sequences (one logit row each).
- t_attention: decode reads every decoding sequence's KV cache at its context (the
  workload's average, at the KV dtype); prefill computes causal attention, 4 x heads x
  head_dim x span per token and layer (QK^T and AV, 2 FLOPs a multiply-add), span being
  half the prompt on average; MLA's absorbed decode reads the latent and computes over the
  latent width (DeepSeek-V2 §2.1.3: kv_lora_rank + rope dims per head).
- t_experts: the grouped GEMMs of the routed experts. The experts a step touches depend on
  the tokens that reach the expert layer, which is the global token count of the EP group
  (every DP replica's tokens, dispatched by the all-to-all), not one replica's batch: under
  uniform routing an expert is touched with probability 1 - (1 - k/E)^T_global (the balance
  DeepSeek-V3's auxiliary-loss-free routing aims at, report §2.1.2). FLOPs: each token's k
  experts, 3 GEMMs of hidden x expert FFN (gate, up, down).
- t_comm: TP all-reduces (two per layer, Megatron-LM §3), ring 2 (n-1)/n of the buffer,
  hierarchical across nodes (NCCL's tree/ring over NVLink inside a node, then the network);
  EP all-to-all per MoE layer, dispatch at the compute dtype and combine at bf16 (DeepEP),
  a token crossing to another node once per remote node it needs (DeepEP's node-limited
  dispatch); PP point-to-point per stage boundary; each collective pays a latency.

BW_eff and F_eff are achievable, not datasheet, figures: datasheet x the fitted efficiency
of the accelerator and engine (`fits.py`). Link figures take `LINK_EFFICIENCY` of the
catalog's per-direction bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.catalog import Accelerator

from .communication import Links
from .memory import device_weights, kv_bytes_per_sequence, stage_layers
from .model import BF16_BYTES, ModelShape
from .validity import Split, Validity

# nccl-tests' all-reduce bus bandwidth reaches about 80% of NVLink's per-direction figure on
# 8 x H100 (NVIDIA, "NCCL tests" README and the DGX H100 user guide's measured busbw), and
# about 90% of a 400 Gb/s port; one figure for both keeps the term simple.
LINK_EFFICIENCY = 0.8
# Per-collective latency: nccl-tests' small-message all-reduce time inside an NVLink node is
# about 10 us, across InfiniBand about 25 us (assumed of that order, not fitted).
INTRA_NODE_LATENCY_S = 10e-6
INTER_NODE_LATENCY_S = 25e-6
KV_DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0}


@dataclass(frozen=True)
class Efficiency:
    """The fitted constants of one accelerator x engine (dimensionless ratios and seconds).

    bandwidth: achievable / datasheet memory bandwidth; flops: achievable / datasheet dense
    FLOP/s of the GEMMs; step_s: fixed seconds per engine step; layer_s: fixed seconds per
    decoder layer per step; moe: achieved / modelled speed of the MoE path (grouped GEMMs
    padded per expert, token permutation, the busiest rank of an uneven routing, and the
    all-to-all), 1.0 for a dense model."""

    bandwidth: float
    flops: float
    step_s: float
    layer_s: float
    moe: float = 1.0

    def as_tuple(self) -> tuple[float, ...]:
        return (self.bandwidth, self.flops, self.step_s, self.layer_s, self.moe)


@dataclass(frozen=True)
class StepTokens:
    """What one step of one DP replica holds: `decode` sequences (one token each) at an
    average context of `decode_context` tokens, and `prefill` prompt tokens whose attention
    spans `prefill_span` tokens on average."""

    decode: float
    decode_context: float
    prefill: float = 0.0
    prefill_span: float = 0.0

    @property
    def total(self) -> float:
        return self.decode + self.prefill


@dataclass(frozen=True)
class StepTime:
    """One step's kernels on the heaviest device (seconds); `total` is their sum."""

    fixed: float
    dense: float
    lm_head: float
    attention: float
    experts: float
    communication: float

    @property
    def total(self) -> float:
        return (
            self.fixed + self.dense + self.lm_head + self.attention + self.experts
        ) + self.communication

    def to_dict(self) -> dict[str, float]:
        return {
            "fixed_s": self.fixed,
            "dense_gemm_s": self.dense,
            "lm_head_s": self.lm_head,
            "attention_s": self.attention,
            "routed_experts_s": self.experts,
            "communication_s": self.communication,
            "step_s": self.total,
        }


@dataclass(frozen=True)
class Device:
    """The heaviest device of a split with its achievable figures (bytes/s, FLOP/s)."""

    shape: ModelShape
    split: Split
    validity: Validity
    dtype: str
    kv_dtype: str
    accelerator: Accelerator
    links: Links
    efficiency: Efficiency

    @property
    def bandwidth(self) -> float:
        return (self.accelerator.memory_bandwidth_bytes_per_s or 0.0) * self.efficiency.bandwidth

    @property
    def gemm_flops(self) -> float:
        """Achievable FLOP/s of the weights' GEMMs: the 4-bit unit for FP4 where the catalog
        has one, the 8-bit unit for FP8/INT8 weights and activations, else BF16."""
        acc = self.accelerator
        peak = acc.dense_bf16_flops or 0.0
        if self.shape.computes_in_4bit(self.dtype) and acc.dense_fp4_flops:
            peak = acc.dense_fp4_flops
        elif self.shape.computes_in_8bit(self.dtype) or self.shape.computes_in_4bit(self.dtype):
            peak = acc.dense_fp8_flops or peak
        return peak * self.efficiency.flops

    @property
    def bf16_flops(self) -> float:
        """Achievable BF16 FLOP/s (attention and the LM head compute at 16 bits)."""
        return (self.accelerator.dense_bf16_flops or 0.0) * self.efficiency.flops

    @property
    def kv_scale(self) -> float:
        """KV bytes at the KV dtype / the analysis's bf16 KV bytes."""
        return KV_DTYPE_BYTES[self.kv_dtype] / BF16_BYTES

    def kv_bytes(self, context_tokens: float) -> float:
        """KV bytes one sequence of `context_tokens` keeps on this device (bytes)."""
        tokens = max(1, round(context_tokens))
        return kv_bytes_per_sequence(self.shape, self.split, self.validity, tokens) * self.kv_scale

    def step(self, tokens: StepTokens) -> StepTime:
        """The kernels of one step of `tokens` on this device (module docstring)."""
        shape, split = self.shape, self.split
        layers = stage_layers(shape, split.pp)
        weights = device_weights(shape, split, self.validity, self.dtype)
        bw, flops, bf16 = self.bandwidth, self.gemm_flops, self.bf16_flops
        t_total = tokens.total

        dense_params = (
            (shape.body_params + shape.shared_expert_params) * layers / shape.num_layers / split.tp
        )
        dense = max(weights.other / bw, 2 * dense_params * t_total / flops)

        lm_head = 0.0
        if weights.lm_head or (shape.tie_word_embeddings and split.pp == 1):
            head_bytes = weights.lm_head or weights.embedding
            head_params = shape.vocab_size * shape.hidden_size / split.tp
            lm_head = max(head_bytes / bw, 2 * head_params * max(tokens.decode, 1.0) / bf16)

        attention = self._attention(tokens, layers, bw, bf16)
        experts = self._experts(t_total, weights.routed_experts, layers, bw, flops)
        comm = self._communication(t_total, layers)
        fixed = self.efficiency.step_s + self.efficiency.layer_s * layers
        return StepTime(fixed, dense, lm_head, attention, experts, comm)

    def _attention(self, tokens: StepTokens, layers: int, bw: float, bf16: float) -> float:
        shape, split = self.shape, self.split
        heads = shape.num_attention_heads / split.tp
        share = layers / shape.num_layers
        if shape.mla:
            # Absorbed MLA: scores over (kv_lora_rank + rope) and values over kv_lora_rank.
            width = 2 * shape.mla["kv_lora_rank"] + shape.mla["qk_rope_head_dim"]
            prefill_width = 2 * (shape.mla["qk_nope_head_dim"] + shape.mla["qk_rope_head_dim"])
            prefill_width = prefill_width // 2 + shape.mla["v_head_dim"]
        else:
            width = prefill_width = 2 * shape.head_dim
        ctx = tokens.decode_context
        decode_span = shape.full_layers * ctx + shape.window_layers * min(ctx, shape.window or ctx)
        decode_flops = 2 * heads * width * decode_span * share * tokens.decode
        decode_bytes = tokens.decode * self.kv_bytes(ctx)
        decode = max(decode_bytes / bw, decode_flops / bf16) if tokens.decode else 0.0
        span = tokens.prefill_span
        prefill_span = shape.full_layers * span + shape.window_layers * min(
            span, shape.window or span
        )
        prefill_flops = 2 * heads * prefill_width * prefill_span * share * tokens.prefill
        return decode + prefill_flops / bf16

    def _experts(
        self, tokens: float, routed_bytes: float, layers: int, bw: float, flops: float
    ) -> float:
        shape, split = self.shape, self.split
        if not shape.is_moe or tokens <= 0:
            return 0.0
        moe_layers = min(shape.moe_layers, layers)
        expert_params = 3 * shape.hidden_size * shape.expert_intermediate_size
        k, experts = shape.experts_per_token, shape.num_experts
        if split.ep > 1:
            # Attention-DP + EP: the EP group (TP x DP ranks) dispatches every replica's
            # tokens; each device holds E / EP experts and computes its share of k x T_global.
            global_tokens = tokens * split.dp
            per_device_flops = 2 * expert_params * k * global_tokens / split.ep
        else:
            global_tokens = tokens
            per_device_flops = 2 * expert_params * k * tokens / split.tp
        touched = 1 - (1 - k / experts) ** global_tokens
        weight_read = routed_bytes * touched
        return max(weight_read / bw, per_device_flops * moe_layers / flops) / self.efficiency.moe

    def _communication(self, tokens: float, layers: int) -> float:
        shape, split, links = self.shape, self.split, self.links
        h_bytes = shape.hidden_size * BF16_BYTES
        total = 0.0
        if split.tp > 1:
            per_collective = self._all_reduce_s(tokens * h_bytes, split.tp)
            total += 2 * layers * per_collective
        if shape.is_moe and split.ep > 1:
            a2a = min(shape.moe_layers, layers) * self._all_to_all_s(tokens)
            total += a2a / self.efficiency.moe
        if split.pp > 1:
            bw = links.bandwidth(split.devices) or links.inter_node_bytes_per_s or 0.0
            crosses = split.devices > links.devices_per_node
            latency = INTER_NODE_LATENCY_S if crosses else INTRA_NODE_LATENCY_S
            total += tokens * h_bytes / (bw * LINK_EFFICIENCY) + latency
        return total

    def _all_reduce_s(self, buffer_bytes: float, group: int) -> float:
        """One all-reduce of `buffer_bytes` over `group` ranks: ring inside a node, then a
        ring of the nodes over the network (hierarchical), each with its latency."""
        links = self.links
        per_node = min(group, links.devices_per_node)
        nodes = math.ceil(group / links.devices_per_node)
        intra = links.intra_node_bytes_per_s or 0.0
        t = 2 * (per_node - 1) / per_node * buffer_bytes / (intra * LINK_EFFICIENCY)
        t += INTRA_NODE_LATENCY_S
        if nodes > 1:
            inter = links.inter_node_bytes_per_s or 0.0
            t += 2 * (nodes - 1) / nodes * buffer_bytes / (inter * LINK_EFFICIENCY)
            t += INTER_NODE_LATENCY_S
        return t

    def _all_to_all_s(self, tokens: float) -> float:
        """Dispatch + combine of one MoE layer from one device (seconds). Each device sends
        its tokens' k copies to the experts' ranks: inside the node over NVLink, and to each
        other node that holds one of a token's experts once over the network (DeepEP's
        node-limited dispatch), the expected number of such nodes under uniform routing
        being (N - 1) x (1 - (1 - 1/N)^k)."""
        shape, split, links = self.shape, self.split, self.links
        ep, per_node = split.ep, min(split.ep, links.devices_per_node)
        # Tokens that leave one device: its share of the replica's tokens (the TP ranks of
        # a replica split them).
        sent = tokens / split.tp
        low = self.shape.computes_in_8bit(self.dtype) or self.shape.computes_in_4bit(self.dtype)
        dispatch = 1.0 if low else float(BF16_BYTES)
        per_token = shape.hidden_size * (dispatch + BF16_BYTES)
        k = shape.experts_per_token
        intra_share = (per_node - 1) / ep
        intra = links.intra_node_bytes_per_s or 0.0
        t = sent * k * intra_share * per_token / (intra * LINK_EFFICIENCY)
        t += 2 * INTRA_NODE_LATENCY_S
        nodes = math.ceil(ep / links.devices_per_node)
        if nodes > 1:
            remote = (nodes - 1) * (1 - (1 - 1 / nodes) ** k)
            inter = links.inter_node_bytes_per_s or 0.0
            t += sent * remote * per_token / (inter * LINK_EFFICIENCY)
            t += 2 * INTER_NODE_LATENCY_S
        return t
