"""The steady state of a served workload on one split: batch, tokens/s, TTFT, TPOT, E2E.

The engine serves by continuous batching with chunked prefill, in the steady state of a
closed loop of `concurrency` requests in flight over the `dp` replicas (independent replicas,
or the attention-DP ranks of an EP group). Per replica:

- the batch B = min(requests in flight, sequences the KV cache holds, the engine's running
  cap). The KV cache holds kv_room / KV(ISL + OSL/2): engines allocate KV blocks as tokens
  arrive (PagedAttention), so a sequence holds its prompt and on average half its output;
- each request lives `life` = TTFT_active + (OSL - 1) x t_step seconds in the batch, and by
  Little's law the replica finishes B / life requests per second: output tokens/s = B x OSL /
  life, input tokens/s = B x ISL / life. A step therefore holds B x (OSL - 1) x t / life
  decoding sequences and B x ISL x t / life prompt tokens (prefill mixed into decode);
- TTFT_active = the ceil(ISL / (chunk - decoding)) steps that carry the prompt's chunks,
  each with the decoding sequences and the others' prefill: the prompt's chunks share steps
  with them up to the engine's batched-token budget; requests beyond B wait (C - B) x life /
  B first; the steps a sequence then decodes in carry the other B - 1 requests' prompts at
  their arrival rate, so TPOT at batch 1 is a pure decode step;
- t_step is `step_time.Device.step` of those tokens; with PP, B is spread over min(PP, B)
  micro-batches and a token passes every stage: TPOT = PP x t_stage.

These are solved by a fixed-point iteration (t depends on the mix, the mix on t). A prefill
pool (`phase` "prefill", disaggregated serving) runs prompts only, a chunk budget a step; a
decode pool ("decode") decodes only, its KV arriving from the prefill pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from engine.catalog import Accelerator

from .errors import NoFittingPlan, PlanInputError
from .step_time import Device, StepTokens

PHASES = ("both", "prefill", "decode")
MAX_TOKENS = 10_000_000  # per request: beyond any published context window by 10x
MAX_CONCURRENCY = 10_000_000
KV_DTYPE_ALIASES = {
    None: None,
    "auto": None,
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "float8_e4m3fn": "fp8",
}
FIXED_POINT_ROUNDS = 8


@dataclass(frozen=True)
class EngineLimits:
    """An engine's defaults that shape its batches: the most sequences it runs at once and
    the tokens one step may batch (its chunked-prefill budget)."""

    max_running_sequences: int
    max_batched_tokens: int
    source: str


# Defaults of the engines' own code and docs for a datacenter GPU (>= 70 GiB).
ENGINE_LIMITS = {
    "vllm": EngineLimits(
        1024,
        8192,
        "vLLM EngineArgs defaults for >= 70 GiB GPUs, OpenAI server: max_num_seqs 1024, "
        "max_num_batched_tokens 8192 (vllm/engine/arg_utils.py)",
    ),
    "sglang": EngineLimits(
        4096,
        8192,
        "SGLang: running requests bounded by the KV pool (cap taken at 4096), "
        "chunked_prefill_size 8192 on H100-class GPUs",
    ),
    "tensorrt-llm": EngineLimits(
        2048,
        8192,
        "TensorRT-LLM LLM API defaults: max_batch_size 2048, max_num_tokens 8192",
    ),
}
# The engines a plan predicts for (their limits here, their fits in published/fits.json).
ENGINES = tuple(ENGINE_LIMITS)
# vLLM on a CPU (vllm/engine/arg_utils.py, the OpenAI server): 128 sequences and 2,048
# batched tokens per rank; on GPUs under 70 GiB: 256 and 2,048.
CPU_LIMITS = EngineLimits(128, 2048, "vLLM CPU defaults: max_num_seqs 128, 2048 tokens per rank")
SMALL_GPU_LIMITS = EngineLimits(256, 2048, "vLLM defaults for GPUs under 70 GiB")
LARGE_MEMORY_BYTES = 70 * 2**30


def engine_limits(engine: str, accelerator: Accelerator, tp: int) -> EngineLimits:
    """The running-sequence cap and token budget of `engine` on `accelerator`."""
    if accelerator.kind == "cpu":
        return replace(
            CPU_LIMITS,
            max_running_sequences=CPU_LIMITS.max_running_sequences * tp,
            max_batched_tokens=CPU_LIMITS.max_batched_tokens * tp,
        )
    limits = ENGINE_LIMITS.get(engine, ENGINE_LIMITS["vllm"])
    if engine == "vllm" and accelerator.memory_bytes < LARGE_MEMORY_BYTES:
        return SMALL_GPU_LIMITS
    return limits


def normalize_kv_dtype(kv_dtype: str | None) -> str | None:
    """None (the serving dtype's own KV, 16-bit), "bfloat16", "float16" or "fp8". Raises
    `PlanInputError` for other words."""
    key = kv_dtype.strip().lower() if isinstance(kv_dtype, str) else kv_dtype
    if key not in KV_DTYPE_ALIASES:
        raise PlanInputError(
            f"unknown KV-cache dtype {kv_dtype!r}; known: auto, bfloat16, float16, fp8"
        )
    return KV_DTYPE_ALIASES[key]


def _positive(name: str, value: Any, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanInputError(f"{name} must be a positive integer, got {value!r}")
    if value > limit:
        raise PlanInputError(f"{name} = {value:,} is implausibly large (limit {limit:,})")
    return value


@dataclass(frozen=True)
class Workload:
    """What is served: `input_tokens` / `output_tokens` per request, `concurrency` requests
    in flight across all devices (None: the throughput-optimal load the memory allows), and
    the `phase` a pool runs ("both", or "prefill" / "decode" for disaggregated serving)."""

    input_tokens: int
    output_tokens: int
    concurrency: int | None = None
    phase: str = "both"

    def check(self) -> None:
        """Raise `PlanInputError` for unusable values."""
        _positive("input_tokens", self.input_tokens, MAX_TOKENS)
        _positive("output_tokens", self.output_tokens, MAX_TOKENS)
        if self.concurrency is not None:
            _positive("concurrency", self.concurrency, MAX_CONCURRENCY)
        if self.phase not in PHASES:
            raise PlanInputError(f"phase must be one of {', '.join(PHASES)}, got {self.phase!r}")


def kv_capacity_sequences(device: Device, kv_room_bytes: float, workload: Workload) -> int:
    """Sequences one replica's KV cache holds at the workload's average occupancy, ISL +
    OSL / 2 tokens (0 when the weights leave no room)."""
    if kv_room_bytes <= 0:
        return 0
    held = workload.input_tokens + workload.output_tokens / 2
    if workload.phase == "prefill":
        held = workload.input_tokens
    per_sequence = device.kv_bytes(held)
    if per_sequence <= 0:
        return MAX_CONCURRENCY
    return int(kv_room_bytes // per_sequence)


def _stage_tokens(device: Device, tokens: StepTokens) -> tuple[float, float]:
    """(TPOT-like seconds for one token through every PP stage, micro-batches)."""
    pp = device.split.pp
    micro = max(1.0, min(float(pp), tokens.total))
    per_stage = StepTokens(
        decode=tokens.decode / micro,
        decode_context=tokens.decode_context,
        prefill=tokens.prefill / micro,
        prefill_span=tokens.prefill_span,
    )
    return pp * device.step(per_stage).total, micro


def solve(
    device: Device, workload: Workload, *, kv_room_bytes: float, limits: EngineLimits
) -> dict[str, Any]:
    """The steady state of one replica (module docstring): batch, tokens/s, latencies."""
    replicas = device.split.dp
    isl, osl = workload.input_tokens, workload.output_tokens
    capacity = kv_capacity_sequences(device, kv_room_bytes, workload)
    cap = min(capacity, limits.max_running_sequences)
    if cap < 1:
        raise NoFittingPlan(
            f"{device.split.label()} leaves no KV-cache room for one sequence of {isl:,} + "
            f"{osl:,} tokens"
        )
    requested = workload.concurrency
    in_flight = cap * replicas if requested is None else requested
    per_replica = in_flight / replicas
    batch = min(per_replica, cap)
    bound = "concurrency" if per_replica <= cap else ("kv_cache" if capacity <= cap else "engine")
    if requested is None:
        bound = "kv_cache" if capacity <= limits.max_running_sequences else "engine"
    chunk = limits.max_batched_tokens
    result: dict[str, Any] = {"concurrency": int(in_flight), "capacity": capacity, "bound": bound}

    if workload.phase == "prefill":
        prompt_tokens = min(chunk, batch * isl)
        tokens = StepTokens(
            decode=0.0, decode_context=0.0, prefill=prompt_tokens, prefill_span=isl / 2
        )
        t, _ = _stage_tokens(device, tokens)
        steps_for_batch = math.ceil(batch * isl / chunk)
        result.update(
            batch=batch,
            step=device.step(tokens).to_dict(),
            output_tokens_per_s=None,
            input_tokens_per_s=replicas * prompt_tokens / t,
            ttft_s=max(1, math.ceil(steps_for_batch / 2)) * t,
            tpot_s=None,
            e2e_s=None,
        )
        return result

    context = isl + osl / 2
    if workload.phase == "decode":
        tokens = StepTokens(decode=batch, decode_context=context)
        t, _ = _stage_tokens(device, tokens)
        result.update(
            batch=batch,
            step=device.step(tokens).to_dict(),
            output_tokens_per_s=replicas * batch / t,
            input_tokens_per_s=None,
            ttft_s=None,
            tpot_s=t,
            e2e_s=(osl - 1) * t,
        )
        return result

    decoding = batch
    life = t = ttft_active = 0.0
    tokens = StepTokens(decode=batch, decode_context=context)
    for _ in range(FIXED_POINT_ROUNDS):
        t_guess = t or _stage_tokens(device, tokens)[0]
        # The other requests' prompts, prefilled at their arrival rate into the steps a
        # sequence decodes in; its own prompt's chunks are the steps of its TTFT.
        others = max(0.0, batch - 1)
        others_per_step = others * isl * t_guess / life if life else others * isl / osl
        tokens = StepTokens(
            decode=decoding, decode_context=context, prefill=others_per_step, prefill_span=isl / 2
        )
        t, _ = _stage_tokens(device, tokens)
        room = max(chunk - decoding, chunk / 8)
        chunks = math.ceil(isl / room)
        own = StepTokens(
            decode=decoding,
            decode_context=context,
            prefill=isl / chunks + others_per_step,
            prefill_span=isl / 2,
        )
        ttft_active = chunks * _stage_tokens(device, own)[0]
        life = ttft_active + (osl - 1) * t
        decoding = batch * (osl - 1) * t / life if life else batch
    wait = (per_replica - batch) * life / batch if per_replica > batch else 0.0
    ttft = wait + ttft_active
    result.update(
        batch=batch,
        step=device.step(tokens).to_dict(),
        output_tokens_per_s=replicas * batch * osl / life,
        input_tokens_per_s=replicas * batch * isl / life,
        ttft_s=ttft,
        tpot_s=t,
        e2e_s=ttft + (osl - 1) * t,
    )
    return result
