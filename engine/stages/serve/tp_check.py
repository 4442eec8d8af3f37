"""The plan's TP against TP=1 through the engine: the same prompts' greedy tokens, compared.

Two launches of the same bf16 checkpoint sum their partial products in different orders (TP=2
all-reduces two half-sums), so their logits differ by bf16 rounding. Where the top two tokens
of a position are closer than that, either launch may pick either one: a tie, not a fault of
the split. A divergence counts as a mismatch only when the token TP=N chose is more than
`tie_margin` (the dtype's logprob limit, `precision.LIMITS`) below TP=1's choice in TP=1's own
logprobs (or outside its top-k). After the first divergence of a prompt the two runs continue
from different text, so each prompt is compared up to and including its first divergence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .precision import EngineCompletion


def compare_tp(
    main: Sequence[EngineCompletion], single: Sequence[EngineCompletion], *, tie_margin: float
) -> dict[str, Any]:
    """`{"greedy_match", "tokens_compared", "ties", "first_divergence", "tie_margin"}`:
    `first_divergence` is the first mismatch `{"prompt", "position", "tp_token", "tp1_token",
    "margin"}` (margin in TP=1's logprobs, inf when the token is outside its top-k), or None."""
    compared = ties = 0
    first = None
    for index, (a, b) in enumerate(zip(main, single, strict=False)):
        for position, (token_a, token_b) in enumerate(zip(a.tokens, b.tokens, strict=False)):
            compared += 1
            if token_a == token_b:
                continue
            top = b.top_logprobs[position] if position < len(b.top_logprobs) else {}
            chosen = top.get(token_b, b.logprobs[position] if position < len(b.logprobs) else 0.0)
            margin = chosen - top[token_a] if token_a in top else math.inf
            if margin <= tie_margin:
                ties += 1
            elif first is None:
                first = {
                    "prompt": index,
                    "position": position,
                    "tp_token": token_a,
                    "tp1_token": token_b,
                    "margin": margin if math.isfinite(margin) else None,
                }
            break
    return {
        "greedy_match": first is None,
        "tokens_compared": compared,
        "ties": ties,
        "first_divergence": first,
        "tie_margin": tie_margin,
    }
