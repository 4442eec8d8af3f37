"""Which split the distributed stage validates: degree, backend, devices, expert parallelism.

Torch-free (the web process reads it for the notes and limitations). The degree is the plan's
TP where the pool's worker holds that many devices, else the largest divisor of it that fits;
a plan at TP=1 is validated at the pool's smallest split (TP=2), the next point of its scaling
curve.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt

# torch.distributed's backend per device type, as transformers maps it
# (transformers.distributed.utils.DISTRIBUTED_BACKEND_MAP); a pool may name its own.
BACKENDS = {"cpu": "gloo", "cuda": "nccl", "xpu": "xccl", "hpu": "hccl"}

# How a result's `ep_note` starts when the architecture has no expert-parallel plan; the notes
# and limitations quote what follows it.
EP_NOT_VALIDATED = "expert parallelism could not be validated: "


def validated_tp(plan_tp: int, devices: int, forced: int | None = None) -> tuple[int, str]:
    """(TP degree to validate, why) for a plan at `plan_tp` on a worker with `devices`.

    `forced` (the job's "tp" option) wins when the worker holds it. Returns (1, why) when no
    split of 2 or more devices can run here.
    """
    if devices < 2:
        return 1, f"the pool's worker holds {fmt.counted(devices, 'device')}: no split to validate"
    if forced is not None:
        if forced > devices:
            return 1, f"TP={forced} was asked for, but the worker holds {devices} devices"
        return forced, f"TP={forced} as the job's options ask"
    if plan_tp == 1:
        return 2, (
            "the plan serves on one device (TP=1); TP=2, the next point of its scaling curve, "
            "is the split to validate"
        )
    if plan_tp <= devices:
        return plan_tp, f"the plan's TP={plan_tp}"
    divisor = max(d for d in range(1, devices + 1) if plan_tp % d == 0)
    if divisor < 2:
        return 1, f"no divisor of the plan's TP={plan_tp} from 2 to {devices} devices"
    return divisor, (
        f"the plan's TP={plan_tp} needs more than the worker's {devices} devices; "
        f"TP={divisor}, the largest divisor of {plan_tp} the worker holds, is the split to "
        "validate"
    )


def divisibility(
    real: Mapping[str, Any], twin: Mapping[str, Any], tp: int, ep: int
) -> list[dict[str, Any]]:
    """Rows {"name", "release", "twin", "degree", "release_divisible", "twin_divisible",
    "kept"} for query heads and K/V heads by TP and routed experts by EP, from two
    `analyze_config(...).to_dict()` results."""
    rows = []

    def add(name: str, release: Any, twin_value: Any, degree: int) -> None:
        if not isinstance(release, int) or not isinstance(twin_value, int) or degree < 1:
            return
        rd, td = release % degree == 0, twin_value % degree == 0
        rows.append(
            {
                "name": name,
                "release": release,
                "twin": twin_value,
                "degree": degree,
                "release_divisible": rd,
                "twin_divisible": td,
                "kept": rd == td,
            }
        )

    add("query heads / TP", real.get("num_attention_heads"), twin.get("num_attention_heads"), tp)
    add("K/V heads / TP", real.get("num_kv_heads"), twin.get("num_kv_heads"), tp)
    real_moe, twin_moe = real.get("moe") or {}, twin.get("moe") or {}
    if real_moe and twin_moe and ep > 1:
        add("routed experts / EP", real_moe.get("num_experts"), twin_moe.get("num_experts"), ep)
    return rows
