"""Which split the distributed stage validates: degree, backend, devices, expert parallelism.

Torch-free (the web process reads the option checker). The degree is the plan's TP where the
pool's worker holds that many devices, else the largest divisor of it that fits; a plan at
TP=1 is validated at the pool's smallest split (TP=2), the next point of its scaling curve.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# torch.distributed's backend per device type, as transformers maps it
# (transformers.distributed.utils.DISTRIBUTED_BACKEND_MAP); a pool may name its own.
BACKENDS = {"cpu": "gloo", "cuda": "nccl", "xpu": "xccl", "hpu": "hccl"}

DEFAULT_CPU_PROCESSES = 2
MAX_CPU_PROCESSES = 16
DEFAULT_TIMEOUT_S = 180
MIN_TIMEOUT_S = 5
MAX_TIMEOUT_S = 3600
INJECT_KEYS = ("kill_rank", "hang_rank", "wrong_shard")
# How a result's `ep_note` starts when the architecture has no expert-parallel plan; the notes
# and limitations quote what follows it.
EP_NOT_VALIDATED = "expert parallelism could not be validated: "


class DistributedOptionsError(ValueError):
    """The job's distributed options are unusable; the message says which and why."""


def distributed_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check the job's `distributed` options and fill the defaults.

    Keys: "processes" (ranks on a cpu pool, 2..16, default 2), "tp" (validate this degree
    instead of the plan's), "expert_parallel" ("auto": EP when the plan uses it and the
    architecture has an EP plan; true; false), "backend" (the torch.distributed backend the
    pool's accelerator uses, e.g. "hccl"; default `BACKENDS` by device type), "timeout_s"
    (seconds the ranks may run, 5..3600, default 180), "inject" ({"kill_rank": r} |
    {"hang_rank": r} | {"wrong_shard": weight name}: breaks the run on purpose to prove the
    checks). Raises `DistributedOptionsError`.
    """
    if options is not None and not isinstance(options, Mapping):
        raise DistributedOptionsError(
            f"distributed options must be an object, got {type(options).__name__}"
        )
    options = dict(options or {})
    known = {"processes", "tp", "expert_parallel", "timeout_s", "inject", "backend"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise DistributedOptionsError(f"unknown distributed option(s): {', '.join(unknown)}")

    def integer(key: str, default: int | None, low: int, high: int) -> int | None:
        value = options.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise DistributedOptionsError(f"{key} must be an integer from {low} to {high}")
        return value

    out: dict[str, Any] = {
        "processes": integer("processes", DEFAULT_CPU_PROCESSES, 2, MAX_CPU_PROCESSES),
        "tp": integer("tp", None, 1, 1024),
        "timeout_s": integer("timeout_s", DEFAULT_TIMEOUT_S, MIN_TIMEOUT_S, MAX_TIMEOUT_S),
    }
    backend = options.get("backend")
    if backend is not None and (
        not isinstance(backend, str) or not backend.isidentifier() or len(backend) > 32
    ):
        raise DistributedOptionsError("backend must be a torch.distributed backend name")
    out["backend"] = backend
    ep = options.get("expert_parallel", "auto")
    if ep not in ("auto", True, False):
        raise DistributedOptionsError('expert_parallel must be "auto", true or false')
    out["expert_parallel"] = ep
    inject = options.get("inject") or {}
    if not isinstance(inject, Mapping) or set(inject) - set(INJECT_KEYS) or len(inject) > 1:
        raise DistributedOptionsError(
            f"inject must be one of {{{', '.join(INJECT_KEYS)}}}: a rank or a weight name"
        )
    for key in ("kill_rank", "hang_rank"):
        if key in inject and (isinstance(inject[key], bool) or not isinstance(inject[key], int)):
            raise DistributedOptionsError(f"inject.{key} must be a rank number")
    if "wrong_shard" in inject and not isinstance(inject["wrong_shard"], str):
        raise DistributedOptionsError("inject.wrong_shard must be a weight's name")
    out["inject"] = dict(inject)
    return out


# Building, saving and running the reference twin before the ranks start, and reading their
# outputs after: well under a minute on 2 CPU cores (benchmarks/distributed.py).
SETUP_S = 60
HARD_GRACE_S = 60


def distributed_time_limits(options: Mapping[str, Any] | None) -> tuple[int, int]:
    """(soft, hard) Celery time limits in seconds for the job's `distributed` options: soft =
    timeout_s + SETUP_S, hard = soft + HARD_GRACE_S (240 s and 300 s by default). Raises
    `DistributedOptionsError` (a ValueError) for unusable options."""
    soft = distributed_options(options)["timeout_s"] + SETUP_S
    return soft, soft + HARD_GRACE_S


def validated_tp(plan_tp: int, devices: int, forced: int | None = None) -> tuple[int, str]:
    """(TP degree to validate, why) for a plan at `plan_tp` on a worker with `devices`.

    `forced` (the job's "tp" option) wins when the worker holds it. Returns (1, why) when no
    split of 2 or more devices can run here.
    """
    if devices < 2:
        return 1, f"the pool's worker holds {devices} device(s): no split to validate"
    if forced is not None:
        if forced > devices:
            return 1, f"TP={forced} was asked for, but the worker holds {devices} devices"
        return forced, f"TP={forced} as the job's options ask"
    if plan_tp == 1:
        return 2, (
            "the plan serves on one device (TP=1); validated TP=2, the next point of its "
            "scaling curve"
        )
    if plan_tp <= devices:
        return plan_tp, f"the plan's TP={plan_tp}"
    divisor = max(d for d in range(1, devices + 1) if plan_tp % d == 0)
    if divisor < 2:
        return 1, f"no divisor of the plan's TP={plan_tp} from 2 to {devices} devices"
    return divisor, (
        f"the plan's TP={plan_tp} needs more than the worker's {devices} devices; validated "
        f"TP={divisor}, the largest divisor of {plan_tp} the worker holds"
    )


def divisibility(real: Mapping[str, Any], twin: Mapping[str, Any], tp: int, ep: int) -> list:
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
