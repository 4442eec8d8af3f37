"""Results the `serve` stage stores, shaped as docs/stages/serve.md gives them: a Llama-3.1-8B
twin served by vLLM at the plan's TP=2, a launch that failed with the engine's own error
lines, and a pool that names no engine. The parts the stage writes through its result's types
(the precision check, the knee, the TP check, a failure) are built from them
(`engine/stages/serve/result.py`)."""

from __future__ import annotations

import copy
from typing import Any

from engine.stages.serve.result import Failure, Knee, PrecisionCheck, TPCheck

PLANNED_COMMAND = (
    "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2 --max-model-len 32768 "
    "--max-num-seqs 4 --dtype bfloat16"
)
LAUNCHED_COMMAND = (
    "/opt/engines/vllm/bin/python -m vllm.entrypoints.openai.api_server "
    "--model /var/day0/serve/job-7/ckpt --tensor-parallel-size 2 --max-model-len 2048 "
    "--max-num-seqs 4 --dtype bfloat16 --gpu-memory-utilization 0.1 --host 127.0.0.1 "
    "--port 41873"
)
COMMAND_DIFF = [
    {
        "flag": "--model",
        "planned": "meta-llama/Llama-3.1-8B",
        "launched": "/var/day0/serve/job-7/ckpt",
        "why": "the scaled twin's checkpoint folder",
    },
    {
        "flag": "--max-model-len",
        "planned": "32768",
        "launched": "2048",
        "why": "the twin's max_position_embeddings",
    },
    {
        "flag": "--gpu-memory-utilization",
        "planned": "",
        "launched": "0.1",
        "why": "the pool's memory_fraction",
    },
]

_SWEEP = [
    # concurrency, ttft p50/p95, tpot p50/p95, e2e p99, output tokens/s, requests/s
    (1, 0.050, 0.070, 0.011, 0.012, 0.46, 80.1, 2.5),
    (2, 0.062, 0.081, 0.012, 0.014, 0.52, 148.3, 4.6),
    (4, 0.081, 0.110, 0.018, 0.021, 0.71, 210.0, 6.6),
    (8, 0.160, 0.240, 0.034, 0.041, 1.38, 226.4, 7.1),
]

SERVED: dict[str, Any] = {
    "status": "served",
    "mode": "launched",
    "engine": {
        "name": "vllm",
        "version": "0.32.0",
        "command": PLANNED_COMMAND,
        "launched_command": LAUNCHED_COMMAND,
        "command_diff": COMMAND_DIFF,
    },
    "checkpoint": {
        "kind": "twin",
        "parameters": 70000000,
        "bytes": 140000000,
        "dtype": "bfloat16",
        "tokenizer": "fast",
    },
    "load_s": 84.2,
    "peak_memory_bytes": 2900000000,
    "startup_log": [
        "INFO 01-12 10:00:01 api_server.py:712] vLLM API server version 0.32.0",
        "INFO 01-12 10:00:03 model_runner.py:1021] Loading model weights took 0.13 GiB",
        "INFO 01-12 10:01:25 launcher.py:29] Starting vLLM API server on http://127.0.0.1:41873",
    ],
    # Judged by the stage's own rule (`PrecisionCheck.judged`): every token agreed.
    "precision": PrecisionCheck(
        dtype="bfloat16",
        passed=None,
        prompts=10,
        tokens_compared=160,
        token_agreement=1.0,
        tokens_until_divergence=160,
        first_divergence=None,
        max_abs_logprob_diff=0.012,
        kl_top_k=0.0004,
        ties=0,
        non_finite=0,
        limit_max_abs_logprob_diff=0.25,
        limit_kl_top_k=0.02,
        limits_source="bfloat16 unit roundoff, measured margins (engine/stages/serve/precision.py)",
    )
    .judged()
    .to_dict(),
    "sweep": [
        {
            "concurrency": c,
            "requests": 4 * c,
            "completed": 4 * c,
            "errors": 0,
            "ttft_s_p50": ttft50,
            "ttft_s_p95": ttft95,
            "ttft_s_p99": ttft95,
            "tpot_s_p50": tpot50,
            "tpot_s_p95": tpot95,
            "tpot_s_p99": tpot95,
            "itl_s_p50": tpot50,
            "e2e_s_p50": e2e99 * 0.85,
            "e2e_s_p95": e2e99 * 0.97,
            "e2e_s_p99": e2e99,
            "output_tokens_per_s": tokens,
            "requests_per_s": rps,
            "duration_s": 1.6,
        }
        for c, ttft50, ttft95, tpot50, tpot95, e2e99, tokens, rps in _SWEEP
    ],
    "sweep_settings": {
        "input_tokens": 128,
        "output_tokens": 32,
        "max_concurrency": 8,
        "load_generator": "vllm.benchmarks.serve (vLLM 0.32.0)",
    },
    # engine/stages/serve/verdict.py `knee` of the sweep above: 210 -> 226 tokens/s from 4 to 8
    # is under 10% growth per doubling.
    "knee": Knee(
        concurrency=4,
        output_tokens_per_s=210.0,
        tpot_s_p50=0.018,
        rule="found",
        found=True,
        growth_threshold=0.1,
        growth_at_knee=226.4 / 210.0 - 1,
    ).to_dict(),
    "metrics": {
        "interval_s": 0.5,
        "series": [
            {
                "t_s": 0.5 * i,
                "kv_cache_usage": round(min(0.05 * i, 0.62), 3),
                "running": min(1 + i // 3, 8),
                "waiting": max(0, i // 3 - 7),
                "preemptions": 0,
                "prefix_cache_hits": 0,
                "prefix_cache_queries": 128 * (i + 1),
            }
            for i in range(30)
        ],
    },
    "tp": TPCheck(
        planned=2, launched=2, compared_with=1, greedy_match=True, tokens_compared=160
    ).to_dict(),
    "passed": True,
    "failure": None,
}

ENGINE_LINES = [
    "ERROR 01-12 10:00:04 engine.py:366] ValueError: Unsupported rope_scaling type 'longrope3'",
    "ERROR 01-12 10:00:04 engine.py:366] Traceback (most recent call last):",
    "RuntimeError: Engine core initialization failed. See root cause above.",
]

FAILED_AT_LAUNCH: dict[str, Any] = {
    "status": "failed",
    "mode": "launched",
    "engine": {
        "name": "vllm",
        "version": "0.32.0",
        "command": PLANNED_COMMAND,
        "launched_command": LAUNCHED_COMMAND,
        "command_diff": COMMAND_DIFF[:1],
    },
    "checkpoint": {
        "kind": "twin",
        "parameters": 70000000,
        "bytes": 140000000,
        "dtype": "bfloat16",
        "tokenizer": "fast",
    },
    "load_s": None,
    "peak_memory_bytes": None,
    "startup_log": ["INFO 01-12 10:00:01 api_server.py:712] vLLM API server version 0.32.0"],
    "precision": None,
    "sweep": [],
    "knee": None,
    "metrics": None,
    "tp": None,
    "passed": False,
    "failure": Failure(
        phase="launch",
        reason="vllm exited with code 1 before answering /health",
        engine_lines=ENGINE_LINES,
        culprit="release",
    ).to_dict(),
}

NOT_CONFIGURED: dict[str, Any] = {"status": "not_configured"}


def served(**changes: Any) -> dict[str, Any]:
    """A deep copy of `SERVED` with `changes` applied at the top level."""
    return copy.deepcopy(SERVED) | changes


# --- the full-size run (docs/stages/serve.md, "Full size") -----------------------------------

FULL_SIZE_COMMAND = (
    "/opt/engines/vllm/bin/python -m vllm.entrypoints.openai.api_server "
    "--model /var/day0/serve/full-size/5d1c --tensor-parallel-size 2 --max-model-len 32768 "
    "--max-num-seqs 64 --dtype bfloat16 --load-format dummy --host 127.0.0.1 --port 41901"
)


def _level(concurrency: int, tokens: float, ttft: float, tpot: float) -> dict[str, Any]:
    """One full-size level with today's sweep keys: 4 requests a slot, none failed."""
    return {
        "concurrency": concurrency,
        "requests": 4 * concurrency,
        "completed": 4 * concurrency,
        "errors": 0,
        "ttft_s_p50": ttft,
        "ttft_s_p95": ttft * 1.4,
        "tpot_s_p50": tpot,
        "tpot_s_p95": tpot * 1.2,
        "e2e_s_p50": ttft + 999 * tpot,
        "e2e_s_p99": (ttft + 999 * tpot) * 1.1,
        "output_tokens_per_s": tokens,
        "requests_per_s": tokens / 1000,
    }


# Llama-3.1-8B at full size with dummy weights on two H200s, 1000 + 1000 tokens a request.
FULL_SIZE_TP2 = [(1, 161.2, 0.031, 0.0062), (2, 309.8, 0.034, 0.0064), (4, 590.4, 0.041, 0.0067)]
FULL_SIZE_TP1 = [(1, 112.5, 0.046, 0.0089), (2, 215.0, 0.052, 0.0093), (4, 404.0, 0.066, 0.0099)]
# What the plan's fit predicted for the same levels before the measurement.
PREDICTED_BEFORE = [(1, 150.0, 0.028, 0.0066), (2, 290.0, 0.030, 0.0068), (4, 560.0, 0.036, 0.0071)]
PREDICTED_PREFILL_HEAVY = [(1, 91.0, 0.070, 0.0068), (2, 170.0, 0.081, 0.0070)]


def _predicted(rows: list[tuple[int, float, float, float]]) -> list[dict[str, Any]]:
    """Predicted levels as `predicted_sweep` writes them."""
    return [
        {
            "kind": "predicted",
            "concurrency": c,
            "output_tokens_per_s": tokens,
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2e_s": ttft + 999 * tpot,
            "batch": float(c),
        }
        for c, tokens, ttft, tpot in rows
    ]


FIT = {
    "accelerator": "h200",
    "engine": "vllm",
    "scope": "accelerator+engine",
    "points": 8,
    "residual": 1.256,
    "source": "published serving results (published/results.csv)",
    "constants": {
        "bandwidth_efficiency": 0.6786,
        "flops_efficiency": 0.433,
        "step_overhead_s": 0.0308,
        "layer_overhead_s": 2.0e-05,
        "moe_efficiency": 0.56,
    },
}

FULL_SIZE: dict[str, Any] = {
    "status": "measured",
    "reason": None,
    "load_format": "dummy",
    "launched_command": FULL_SIZE_COMMAND,
    "command_diff": [
        {
            "flag": "--load-format",
            "planned": "",
            "launched": "dummy",
            "why": "random weights from the config: the full size without its checkpoint",
        }
    ],
    "load_s": 41.7,
    "tp": 2,
    "dtype": "bfloat16",
    "peak_memory_bytes": 98_000_000_000,
    "max_model_len": 32768,
    "engine_kv_cache_tokens": 1_104_896,
    "kv_cache_space_gib": None,
    "sweep_settings": {
        "input_tokens": 1000,
        "output_tokens": 1000,
        "concurrency": [1, 2, 4],
        "requests_per_level": 16,
        "time_budget_s": 1200.0,
        "load_generator": "vllm.benchmarks.serve (vLLM 0.32.0)",
    },
    "sweep": [_level(*row) for row in FULL_SIZE_TP2],
    "stopped": None,
    "workloads": [
        {
            "label": "prefill-heavy",
            "input_tokens": 2048,
            "output_tokens": 128,
            "sweep": [_level(1, 98.4, 0.061, 0.0063), _level(2, 180.2, 0.070, 0.0066)],
            "stopped": None,
        },
        {
            "label": "decode-heavy",
            "input_tokens": 128,
            "output_tokens": 2048,
            "sweep": [_level(1, 163.0, 0.012, 0.0061)],
            "stopped": "time budget",
        },
    ],
    "tp_scaling": [
        {
            "tp": 1,
            "load_s": 37.9,
            "launched_command": FULL_SIZE_COMMAND.replace("size 2", "size 1"),
            "sweep": [_level(*row) for row in FULL_SIZE_TP1],
            "stopped": None,
            "engine_kv_cache_tokens": 455_000,
            "peak_memory_bytes": 120_000_000_000,
        }
    ],
    "tp_skipped": [],
    # engine/stages/serve/full_size.py `scaling` of the two sweeps: TP=2 over TP=1 on twice
    # the devices.
    "scaling": [
        {
            "tp": tp,
            "concurrency": c2,
            "output_tokens_per_s": t2 if tp == 2 else t1,
            "baseline_tp": 1,
            "speedup": round((t2 / t1) if tp == 2 else 1.0, 4),
            "efficiency": round((t2 / t1 / 2) if tp == 2 else 1.0, 4),
        }
        for tp in (1, 2)
        for (c2, t2, _a, _b), (_c1, t1, _d, _e) in zip(FULL_SIZE_TP2, FULL_SIZE_TP1, strict=True)
    ],
    "engine_metrics": {
        "interval_s": 0.5,
        "series": [
            {"t_s": 0.5 * i, "kv_cache_usage": round(0.004 * i, 4), "running": min(4, 1 + i // 4)}
            for i in range(20)
        ],
        "errors": 0,
        "phases": [{"label": "primary", "t_start_s": 0.0, "t_end_s": 9.5}],
        "peak": {"kv_cache_usage": 0.076, "running": 4, "waiting": 0},
    },
    "model": {
        "architecture": "LlamaForCausalLM",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "parameters": 8030261248,
        "kv_cache_bytes_per_token": 131072,
        "weight_bytes": 16060522496,
    },
    "duration_s": 412.6,
    # engine/stages/serve/full_size_prediction.py `predicted_before`: the plan's fit at the
    # launch's split, per workload (the primary's sweep also on its own).
    "predicted_before": {
        "available": True,
        "fit": FIT,
        "split": "TP2 PP1 EP1 DP1",
        "sweep": _predicted(PREDICTED_BEFORE),
        "workloads": [
            {
                "label": "primary",
                "input_tokens": 1000,
                "output_tokens": 1000,
                "sweep": _predicted(PREDICTED_BEFORE),
            },
            {
                "label": "prefill-heavy",
                "input_tokens": 2048,
                "output_tokens": 128,
                "sweep": _predicted(PREDICTED_PREFILL_HEAVY),
            },
        ],
    },
}


def full_size(**changes: Any) -> dict[str, Any]:
    """A deep copy of `FULL_SIZE` with `changes` applied at the top level."""
    return copy.deepcopy(FULL_SIZE) | changes
