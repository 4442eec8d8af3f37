"""The plan's full-size predictions for one split: the step-time model (`step_time.py`) with
the fit of the pool's accelerator x engine (`fits.py`), over the plan's workload
(`workload.py`). Predictions, labelled so, each naming its fit.

- `decode_point(n)`: n sequences decoding (a decode pool's steady state) at the workload's
  average context ISL + OSL/2: TPOT and decode tokens/s, the curve the plan draws;
- `prefill_ttft_s(P)`: one prompt of P tokens on an idle engine, chunk by chunk of the
  engine's batched-token budget, each chunk's attention over the prompt before it;
- `workload(concurrency)`: the served workload at that load (continuous batching mixing
  prefill and decode, TTFT under load; `workload.solve`), and `max_load_sequences()` the
  throughput-optimal load the memory allows;
- `max_batch()`: sequences one replica holds at the plan's full target context (what the
  launch command's --max-num-seqs is set to), at most the engine's running cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.catalog import Accelerator

from .communication import Communication, Links
from .fits import Fit
from .memory import MemoryPerDevice
from .model import ModelShape
from .steady_state import EngineLimits, Workload, engine_limits, solve
from .step_time import Device, StepTokens
from .validity import Split, Validity

PROMPT_LENGTHS = (128, 1024, 4096, 8192, 32768, 131072)  # tokens
DEFAULT_INPUT_TOKENS = 1000  # the lengths teams quote (TensorRT-LLM's and vLLM's benchmarks)
DEFAULT_OUTPUT_TOKENS = 1000
MAX_CURVE_POINTS = 12


def default_lengths(context_tokens: int) -> tuple[int, int]:
    """Input/output tokens a plan predicts by default: 1,000 / 1,000, halved together until
    they fit the plan's context."""
    isl, osl = DEFAULT_INPUT_TOKENS, DEFAULT_OUTPUT_TOKENS
    while isl + osl > context_tokens and osl > 1:
        isl, osl = max(1, isl // 2), max(1, osl // 2)
    return isl, osl


@dataclass(frozen=True)
class FullSizePredictor:
    """One split sized on the pool, with what predicts it (bytes, bytes/s, FLOP/s)."""

    shape: ModelShape
    split: Split
    validity: Validity
    dtype: str
    accelerator: Accelerator
    memory: MemoryPerDevice
    comm: Communication
    links: Links
    fit: Fit
    engine: str = "vllm"
    kv_dtype: str = "bfloat16"
    input_tokens: int = DEFAULT_INPUT_TOKENS
    output_tokens: int = DEFAULT_OUTPUT_TOKENS

    @property
    def device(self) -> Device:
        return Device(
            self.shape,
            self.split,
            self.validity,
            self.dtype,
            self.kv_dtype,
            self.accelerator,
            self.links,
            self.fit.efficiency,
        )

    @property
    def limits(self) -> EngineLimits:
        return engine_limits(self.engine, self.accelerator, self.split.tp)

    @property
    def available(self) -> bool:
        acc = self.accelerator
        links_known = self.comm.step_time_s(1) is not None
        return bool(acc.memory_bandwidth_bytes_per_s and acc.dense_bf16_flops) and links_known

    def unavailable_reason(self) -> str:
        acc = self.accelerator
        missing = [
            name
            for name, value in (
                ("memory bandwidth", acc.memory_bandwidth_bytes_per_s),
                ("BF16 FLOP/s", acc.dense_bf16_flops),
            )
            if not value
        ]
        if self.comm.step_time_s(1) is None:
            missing.append("interconnect bandwidth")
        return f"{acc.kind} has no published " + ", ".join(missing)

    def max_batch(self) -> int:
        """Sequences one DP replica holds at the full target context: KV room / KV per
        sequence, at most the engine's running cap (0 when not even one fits)."""
        per_seq = self.memory.kv_bytes_per_sequence  # at the KV dtype (memory_per_device)
        room = self.memory.kv_room
        cap = self.limits.max_running_sequences
        if room <= 0:
            return 0
        if per_seq <= 0:
            return cap
        return int(min(cap, room // per_seq))

    @property
    def average_context(self) -> float:
        return self.input_tokens + self.output_tokens / 2

    def decode_tpot_s(self, batch: float) -> float:
        """TPOT (s) of `batch` sequences per replica decoding at the average context."""
        device = self.device
        pp = self.split.pp
        micro = max(1.0, min(float(pp), batch))
        step = device.step(StepTokens(decode=batch / micro, decode_context=self.average_context))
        return pp * step.total

    def decode_point(self, sequences: int) -> dict[str, Any]:
        """Decode with `sequences` concurrent sequences spread over the DP replicas."""
        per_replica = -(-sequences // self.split.dp)
        tpot = self.decode_tpot_s(per_replica)
        return {
            "kind": "predicted",
            "concurrent_sequences": sequences,
            "batch_per_replica": per_replica,
            "context_tokens": self.average_context,
            "tpot_s": tpot,
            "decode_tokens_per_s": sequences / tpot,
            "decode_tokens_per_s_per_sequence": 1 / tpot,
        }

    def prefill_ttft_s(self, prompt_tokens: int, sequences: int = 1) -> float:
        """TTFT (s) of `sequences` prompts of `prompt_tokens` on an idle engine: chunks of
        the engine's batched-token budget, each attending over the prompt before it."""
        device, chunk = self.device, self.limits.max_batched_tokens
        total = prompt_tokens * sequences
        done, seconds = 0, 0.0
        while done < total:
            size = min(chunk, total - done)
            position = (done % prompt_tokens) + size / 2
            step = device.step(
                StepTokens(decode=0.0, decode_context=0.0, prefill=size, prefill_span=position)
            )
            seconds += self.split.pp * step.total
            done += size
        return seconds

    def workload(self, concurrency: int | None, phase: str = "both") -> dict[str, Any]:
        """`workload.solve` of the plan's lengths at `concurrency` requests in flight over
        all replicas (None: the throughput-optimal load), as a labelled point."""
        load = Workload(self.input_tokens, self.output_tokens, concurrency, phase)
        state = solve(self.device, load, kv_room_bytes=self.memory.kv_room, limits=self.limits)
        out, inp = state["output_tokens_per_s"], state["input_tokens_per_s"]
        devices = self.split.devices
        return {
            "kind": "predicted",
            "phase": phase,
            "concurrency": state["concurrency"],
            "batch": state["batch"],
            "batch_bound_by": state["bound"],
            "kv_capacity_sequences": state["capacity"],
            "output_tokens_per_s": out,
            "output_tokens_per_s_per_device": None if out is None else out / devices,
            "input_tokens_per_s": inp,
            "input_tokens_per_s_per_device": None if inp is None else inp / devices,
            "ttft_s": state["ttft_s"],
            "tpot_s": state["tpot_s"],
            "e2e_s": state["e2e_s"],
            "step": state["step"],
        }

    def max_load_sequences(self) -> int:
        """Requests in flight at the throughput-optimal load (over all replicas)."""
        return int(self.workload(None)["concurrency"])

    def _concurrencies(self, largest: int) -> list[int]:
        values, n = [1], 2
        while n < largest and len(values) < MAX_CURVE_POINTS - 1:
            values.append(n)
            n *= 2
        if largest > 1:
            values.append(largest)
        return values

    def predictions(self, context_tokens: int) -> dict[str, Any]:
        """Decode at batch 1, powers of two and the largest batch that fits; prefill TTFT
        for prompt lengths up to the context; the plan's workload over concurrency 1 to its
        throughput-optimal load, and as prefill and decode pools. Every entry is labelled
        "predicted", and the whole names its fit."""
        if not self.available:
            return {"kind": "predicted", "available": False, "reason": self.unavailable_reason()}
        largest = self.max_batch() * self.split.dp
        curve = [self.decode_point(b) for b in self._concurrencies(largest)] if largest >= 1 else []
        prompts = [p for p in PROMPT_LENGTHS if p <= context_tokens] or [context_tokens]
        best = self.workload(None)
        workload_curve = [self.workload(c) for c in self._concurrencies(best["concurrency"])]
        device = self.device
        return {
            "kind": "predicted",
            "model": "full-size",
            "available": True,
            "batch_1": self.decode_point(1),
            "largest_batch": self.decode_point(largest) if largest >= 1 else None,
            "largest_batch_sequences": largest,
            "decode_curve": curve,
            "prefill": [
                {"kind": "predicted", "prompt_tokens": p, "ttft_s": self.prefill_ttft_s(p)}
                for p in prompts
            ],
            "workload": {
                "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens,
                "kv_dtype": self.kv_dtype,
                "engine": self.engine,
                "max_load": best,
                "curve": workload_curve,
                "prefill_pool": self.workload(None, "prefill"),
                "decode_pool": self.workload(None, "decode"),
            },
            "fit": self.fit.to_dict(),
            "compute_dtype_flops": device.gemm_flops,
            "memory_bandwidth_bytes_per_s": device.bandwidth,
        }

    def best_decode_tokens_per_s(self) -> float | None:
        """Output tokens/s of the plan's workload at its throughput-optimal load (None
        without a prediction): what splits are ranked by."""
        if not self.available:
            return None
        if self.max_batch() < 1:
            return 0.0
        return self.workload(None)["output_tokens_per_s"]


PREDICTION_ASSUMPTIONS = (
    "full-size predictions: one engine step is the sum of its kernels (dense GEMMs, LM head, "
    "attention over the KV cache at the workload's average context, MoE grouped GEMMs for the "
    "experts the EP group's global tokens touch, TP all-reduce / EP all-to-all by topology, "
    "fixed costs per step and per layer) at achievable, not datasheet, bandwidth and FLOP/s",
    "the achievable fractions and fixed costs are fitted per accelerator x engine on published "
    "serving results (engine/stages/plan/published/), or on the pool's own full-size sweeps; "
    "the plan names the fit it used",
    "continuous batching with chunked prefill: a batch bounded by the KV cache at input + "
    "half the output tokens and by the engine's running cap; TTFT under load includes the "
    "wait for a free slot",
)
