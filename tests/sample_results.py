"""Stage results for page tests: the engine's real analysis of DeepSeek-V3, and a made-up
new family for the "what is new" table."""

from __future__ import annotations

from typing import Any

from engine.architecture import analyze_config
from engine.stages.fetch.result import FetchResult
from tests.conftest import load_realconfig

# The real engine's output for DeepSeek-V3's published config and its index's total_size.
DEEPSEEK_V3_ANALYSIS: dict[str, Any] = {
    **analyze_config(
        load_realconfig("deepseek-ai__DeepSeek-V3"),
        weights={
            "source": "index",
            "total_size": 688_586_727_753,
            "shard_count": 163,
            "tensor_count": 91_991,
            "dtypes": {},
        },
    ).to_dict(),
    "new_against_known": [],
}

NEW_FAMILY_ANALYSIS: dict[str, Any] = {
    "architecture": "NovelMoeForCausalLM",
    "model_type": "novel_moe",
    "family": "novel_moe",
    "family_known": False,
    "num_layers": 48,
    "moe": None,
    "quantization": None,
    "total_params": 3606752256,
    "new_against_known": [
        {"aspect": "attention", "detail": "Sliding window of 4,096 tokens on 3 of every 4 layers"},
        {"aspect": "rope", "detail": "RoPE type 'llama3' with factor 8 on a new family"},
    ],
    "notes": [],
}

# What the fetch stage hands the analysis: DeepSeek-V3's published config.
FETCH_RESULT: dict[str, Any] = FetchResult(
    files=("config.json",), config=load_realconfig("deepseek-ai__DeepSeek-V3")
).to_dict()
