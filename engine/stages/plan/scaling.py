"""Multi-device scaling: predicted decode throughput and per-device efficiency as the
device count grows: the efficiency curve of multi-card scaling.

At each count the best fitting split (by predicted decode tokens/s at its largest batch) is
taken; extra devices become DP replicas or a wider TP/EP group, whichever the roofline
(`roofline.py`) predicts faster. Efficiency per device = (tokens/s / devices) divided by
the same at the smallest count that fits: 1.0 is linear scaling, below 1 the
communication and replication cost, above 1 the larger batch the added memory allows.
Counts past the pool's size are marked `within_pool: false` (what more nodes would give).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .layout import Candidate, PoolLayout


def scaling_curve(
    candidates: Callable[[int], Sequence[Candidate]], layout: PoolLayout, *, first: int
) -> list[dict]:
    """Predicted throughput and per-device efficiency as the device count grows: the
    fitting count, then 1, 2, 4, ... nodes (at least 4, at least the pool's).
    `candidates(n)` gives every split on n devices (the planner's search at the plan's
    dtype, context and concurrency)."""
    dpn = layout.devices_per_node
    counts = [first]
    max_nodes = max(layout.nodes, 4)
    nodes = 1
    while nodes <= max_nodes and len(counts) < 10:
        if nodes * dpn > first:
            counts.append(nodes * dpn)
        nodes *= 2
    if layout.devices > first and layout.devices not in counts:
        counts.append(layout.devices)
    rows: list[dict] = []
    base = None
    for n in sorted(set(counts)):
        cands = [c for c in candidates(n) if c.fits]
        if not cands:
            continue
        best = min(cands, key=lambda c: c.sort_key())
        tput = best.decode_tokens_per_s
        per_device = tput / n if tput is not None else None
        if base is None and per_device:
            base = per_device
        rows.append(
            {
                "kind": "predicted",
                "devices": n,
                "within_pool": n <= layout.devices,
                "nodes": n / dpn,
                "tp": best.split.tp,
                "pp": best.split.pp,
                "ep": best.split.ep,
                "dp": best.split.dp,
                "decode_tokens_per_s": tput,
                "decode_tokens_per_s_per_device": per_device,
                "efficiency_per_device": per_device / base if per_device and base else None,
            }
        )
    return rows
