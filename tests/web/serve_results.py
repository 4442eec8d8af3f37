"""Results the `serve` stage stores, shaped as docs/stages/serve.md gives them: a Llama-3.1-8B
twin served by vLLM at the plan's TP=2, a launch that failed with the engine's own error
lines, and a pool that names no engine."""

from __future__ import annotations

import copy
from typing import Any

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
    "precision": {
        "dtype": "bfloat16",
        "prompts": 10,
        "tokens_compared": 160,
        "token_agreement": 1.0,
        "first_divergence": None,
        "max_abs_logprob_diff": 0.012,
        "kl_top_k": 0.0004,
        "limits": {
            "max_abs_logprob_diff": 0.25,
            "kl_top_k": 0.02,
            "source": "bfloat16 unit roundoff, measured margins (engine/stages/serve/precision.py)",
        },
        "passed": True,
    },
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
    "knee": {
        "concurrency": 4,
        "output_tokens_per_s": 210.0,
        "tpot_s_p50": 0.018,
        "found": True,
        "growth_at_knee": 226.4 / 210.0 - 1,
        "growth_threshold": 0.1,
        "reason": "found",
    },
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
    "tp": {
        "planned": 2,
        "launched": 2,
        "compared_with": 1,
        "greedy_match": True,
        "tokens_compared": 160,
        "first_divergence": None,
        "reason": "",
    },
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
    "failure": {
        "phase": "launch",
        "reason": "vllm exited with code 1 before answering /health",
        "engine_lines": ENGINE_LINES,
        "culprit": "release",
    },
}

NOT_CONFIGURED: dict[str, Any] = {"status": "not_configured"}


def served(**changes: Any) -> dict[str, Any]:
    """A deep copy of `SERVED` with `changes` applied at the top level."""
    return copy.deepcopy(SERVED) | changes
