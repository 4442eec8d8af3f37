"""Regression tests: jobs whose stored stage results carry chosen figures (no stage runs), in
the shapes the stages store; `perf_job` is given to the app's tests by
tests/adaptation/conftest.py."""

from __future__ import annotations

from typing import Any

import pytest

from adaptation.models import AdaptationJob, ModelRelease, StageStatus
from tests.factories import make_job

PERF_STAGES = ("fetch", "analyze", "performance")
KNEE_METRIC = "decode_tokens_per_s:twin:bfloat16:32"
TTFT_METRIC = "ttft_p95_s:twin:bfloat16:32"


def performance_result(
    *, tokens_per_s: float, ttft_p95_s: float = 0.1, model: str = "twin"
) -> dict[str, Any]:
    """A performance result (engine/stages/performance/run.py's shape, trimmed to what a
    regression reads) whose knee, bfloat16 at batch 4 and 32-token prompts, runs
    `tokens_per_s` decode tokens/s with a TTFT p95 of `ttft_p95_s` s; batch 8 is a point
    beside it (the knee's TTFT must come from the knee's own point)."""

    def point(batch: int, tokens: float, ttft: float) -> dict[str, Any]:
        return {
            "kind": "measured",
            "model": model,
            "dtype": "bfloat16",
            "batch_size": batch,
            "prompt_len": 32,
            "ttft_s": ttft * 0.8,
            "ttft_p95_s": ttft,
            "tpot_s": 0.01,
            "tpot_p95_s": 0.012,
            "prefill_tokens_per_s": 5000.0,
            "decode_tokens_per_s": tokens,
            "peak_memory_bytes": 1 << 30,
        }

    return {
        "points": [point(4, tokens_per_s, ttft_p95_s), point(8, tokens_per_s * 1.05, 9.9)],
        "knee_batch_size": 4,
        "knee_tpot_s": 0.01,
        "knee": {
            "dtype": "bfloat16",
            "prompt_len": 32,
            "batch_size": 4,
            "tpot_s": 0.01,
            "tpot_p95_s": 0.012,
            "decode_tokens_per_s": tokens_per_s,
            "found": True,
            "growth_at_knee": 0.05,
            "reason": "found",
        },
    }


@pytest.fixture
def perf_job():
    """`perf_job(release, tokens_per_s=..., ttft_p95_s=..., **fields)`: a succeeded job of
    fetch, analyze and performance whose performance result has those figures (each stage
    3 s long, as `make_job` times them)."""

    def make(release: ModelRelease, **figures: Any) -> AdaptationJob:
        pool = figures.pop("pool", None)
        return make_job(
            release=release,
            stages=PERF_STAGES,
            statuses={stage: StageStatus.SUCCEEDED for stage in PERF_STAGES},
            results={"performance": performance_result(**figures)},
            **({"pool": pool} if pool else {}),
        )

    return make
