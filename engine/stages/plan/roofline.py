"""Roofline predictions of decode and prefill for one split, at datasheet peaks: the planner's
model before the step-time model (`step_time.py`, `predictor.py`), kept as the bound the
scaled twin's calibration measures its efficiency against (`calibration.py`) and as the
"before" figure of `benchmarks/planner_accuracy.py`. Predictions, labelled so.

Decode (one new token for each of B sequences of a replica) is memory-bandwidth bound at
small batch: every step streams the device's weights and the sequences' KV cache from
device memory ("Efficiently Scaling Transformer Inference", Pope et al. 2022, §2-3: decode
latency >= bytes / memory bandwidth; the vLLM docs' PagedAttention motivation says the
same of the KV cache). Per PP stage:

    t_stage(B) = max( (W_read(B) + B x KV_seq) / BW ,  2 x N_active x B / (TP x PP x F) )
    TPOT(B)    = PP x t_stage(B) + t_comm(B)
    tokens/s   = B x DP / TPOT(B)

W_read(B): the device's non-expert weights, plus its routed experts x the share B tokens
touch, 1 - (1 - k/E)^B under uniform routing (the balance DeepSeek-V3's auxiliary-loss-free
routing aims at, report §2.1.2); the embedding table is looked up, not streamed. KV_seq is
one sequence at the full target context (an upper bound). F is the dense peak FLOP/s of the
compute dtype (8-bit units for FP8/INT8 weights and activations, else BF16). t_comm is
`communication.Communication.step_time_s`. Pipeline stages are not overlapped (a
conservative bound: vLLM overlaps micro-batches across stages at high load).

Prefill (TTFT of one prompt of P tokens) is compute bound (Pope et al. 2022 §2; Kaplan et
al. 2020 Table 1 for the FLOP count):

    FLOPs(P) = 2 x N_active x P + 2 x heads x head_dim x (L_full x P^2 + L_window x P x min(P, w))
    TTFT(P)  = max( FLOPs(P) / (TP x F x MFU_PREFILL) , PP x W_device / BW ) + t_comm(P)

(causal attention halves QK^T and AV's 4 x P^2 x d per layer). MFU_PREFILL is an assumption
(Pope et al. report up to 76% MFU for large prefills of PaLM 540B on TPU v4; we take 50%).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.catalog import Accelerator

from .communication import Communication, Links, communication
from .memory import MemoryPerDevice, device_weights, memory_per_device
from .model import ModelShape
from .validity import Split, Validity, check_split

MFU_PREFILL = 0.5
MAX_NUM_SEQS = 256  # sequences per replica, the cap the launch commands had before


@dataclass(frozen=True)
class Roofline:
    """Inputs of the roofline for one split (bytes, bytes/s, FLOP/s)."""

    shape: ModelShape
    split: Split
    validity: Validity
    dtype: str
    accelerator: Accelerator
    memory: MemoryPerDevice
    comm: Communication

    @property
    def bandwidth(self) -> float | None:
        return self.accelerator.memory_bandwidth_bytes_per_s

    @property
    def flops(self) -> float | None:
        """Dense peak FLOP/s of the compute dtype on one device."""
        acc = self.accelerator
        if self.shape.computes_in_8bit(self.dtype) and acc.dense_fp8_flops:
            return acc.dense_fp8_flops
        return acc.dense_bf16_flops

    @property
    def available(self) -> bool:
        return bool(self.bandwidth and self.flops) and self.comm.step_time_s(1) is not None

    def max_batch(self) -> int:
        """Most sequences one DP replica holds at the target context: KV room / KV per sequence,
        capped at MAX_NUM_SEQS (0 when not even one fits)."""
        per_seq = self.memory.kv_bytes_per_sequence
        room = self.memory.kv_room
        if room <= 0:
            return 0
        if per_seq <= 0:
            return MAX_NUM_SEQS
        return int(min(MAX_NUM_SEQS, room // per_seq))

    def decode_tpot_s(self, batch: int) -> float:
        """TPOT in seconds at `batch` sequences per replica (module docstring formula)."""
        shape, split = self.shape, self.split
        w = device_weights(shape, split, self.validity, self.dtype)
        touched = 1.0
        if shape.is_moe:
            touched = 1 - (1 - shape.experts_per_token / shape.num_experts) ** batch
        weight_read = w.other + w.lm_head + w.routed_experts * touched
        kv_read = batch * self.memory.kv_bytes_per_sequence
        t_mem = (weight_read + kv_read) / self.bandwidth
        t_compute = 2 * shape.active_params * batch / (split.tp * split.pp * self.flops)
        comm = self.comm.step_time_s(batch) or 0.0
        return split.pp * max(t_mem, t_compute) + comm

    def decode_point(self, sequences: int) -> dict:
        """Decode with `sequences` concurrent sequences spread over the DP replicas: each
        replica steps ceil(sequences / DP) of them; tokens/s = sequences / TPOT."""
        per_replica = -(-sequences // self.split.dp)
        tpot = self.decode_tpot_s(per_replica)
        return {
            "kind": "predicted",
            "concurrent_sequences": sequences,
            "batch_per_replica": per_replica,
            "tpot_s": tpot,
            "decode_tokens_per_s": sequences / tpot,
            "decode_tokens_per_s_per_sequence": 1 / tpot,
        }

    def prefill_ttft_s(self, prompt_tokens: int, sequences: int = 1) -> float:
        """TTFT in seconds of `sequences` prompts of `prompt_tokens` each, prefilled in one
        forward (module docstring formula; its FLOPs x `sequences`, the weights read once).
        The accuracy benchmark predicts one prompt; the calibration the twin's measured batches."""
        shape, split = self.shape, self.split
        attn = (
            2
            * shape.num_attention_heads
            * shape.head_dim
            * (
                shape.full_layers * prompt_tokens**2
                + shape.window_layers * prompt_tokens * min(prompt_tokens, shape.window or 1)
            )
        )
        flops = (2 * shape.active_params * prompt_tokens + attn) * sequences
        t_compute = flops / (split.tp * self.flops * MFU_PREFILL)
        t_weights = split.pp * self.memory.weights / self.bandwidth
        comm = self.comm.step_time_s(prompt_tokens * sequences) or 0.0
        return max(t_compute, t_weights) + comm


def single_device_roofline(
    shape: ModelShape,
    accelerator: Accelerator,
    *,
    dtype: str,
    context_tokens: int,
    concurrency: int = 1,
) -> Roofline:
    """The roofline of `shape` whole on one device of `accelerator` (TP1 PP1 DP1 EP1, no
    communication), its KV cache sized for `concurrency` sequences of `context_tokens`: the
    formulas of the module docstring with nothing split. The calibration predicts the scaled
    twin's own measured points with it (`plan/calibration.py`). Memory capacity does not
    limit it (a prediction, not a fit check)."""
    split = Split(tp=1, pp=1, dp=1, ep=1)
    validity = check_split(shape, split)
    memory = memory_per_device(
        shape,
        split,
        validity,
        dtype=dtype,
        context_tokens=context_tokens,
        concurrency=concurrency,
        capacity_bytes=accelerator.memory_bytes,
    )
    comm = communication(
        shape,
        split,
        Links(devices_per_node=1, intra_node_bytes_per_s=None, inter_node_bytes_per_s=None),
    )
    return Roofline(shape, split, validity, dtype, accelerator, memory, comm)
