"""The knee of a measured throughput curve (plain Python, no torch): the performance stage's rule,
which the serve stage applies to the engine's sweep too."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def find_knee(curve: Sequence[Mapping[str, Any]], growth: float) -> dict[str, Any] | None:
    """The knee of one measured curve (points of one dtype and prompt length), or None for an
    empty curve: {"batch_size", "tpot_s", "tpot_p95_s", "decode_tokens_per_s", "found",
    "growth_at_knee" (the fraction tokens/s grew from the knee to twice it; None when not
    found), "reason"}.

    The knee is the smallest measured batch b from which decode tokens/s grows by less than
    `growth` per doubling: tokens/s(2^k x b) < (1 + growth)^k x tokens/s(b) for every larger
    batch measured (k >= 1). Reading every larger batch, not only 2b, keeps one slow point
    (a stalled measurement) from passing for a knee when the curve climbs again after it.
    Not found when no such b has a larger batch measured: the largest batch is returned.
    """
    by_batch = {
        p["batch_size"]: p
        for p in curve
        if p.get("decode_tokens_per_s") is not None and p["decode_tokens_per_s"] > 0
    }
    if not by_batch:
        return None
    batches = sorted(by_batch)

    def tps(b: int) -> float:
        return by_batch[b]["decode_tokens_per_s"]

    knee, found, grew, reason = batches[-1], False, None, ""
    for i, b in enumerate(batches):
        later = batches[i + 1 :]
        if not later or 2 * b not in by_batch:
            continue
        if all(tps(c) < (1 + growth) ** math.log2(c / b) * tps(b) for c in later):
            knee, found, grew = b, True, tps(2 * b) / tps(b) - 1
            reason = (
                f"decode tokens/s grew {grew:+.1%} from batch {b} to {2 * b}, and less than "
                f"{growth:.0%} per doubling to every larger batch measured (up to {later[-1]})"
            )
            break
    if not found:
        reason = (
            f"decode tokens/s kept growing at least {growth:.0%} per doubling from every "
            f"batch measured, up to batch {batches[-1]}, the end of the sweep: the knee lies "
            "beyond it"
            if len(batches) > 1
            else f"only batch {batches[0]} was measured"
        )
    point = by_batch[knee]
    return {
        "batch_size": knee,
        "tpot_s": point["tpot_s"],
        "tpot_p95_s": point.get("tpot_p95_s"),
        "decode_tokens_per_s": point["decode_tokens_per_s"],
        "found": found,
        "growth_at_knee": grew,
        "reason": reason,
    }
