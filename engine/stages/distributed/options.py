"""The `distributed` stage's options and the Celery time limits that follow them.

Torch-free: the web process checks a job's options when the job is created
(`StageDefinition.check_options`) and the registry reads the time limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_CPU_PROCESSES = 2
MAX_CPU_PROCESSES = 16
DEFAULT_TIMEOUT_S = 180
MIN_TIMEOUT_S = 5
MAX_TIMEOUT_S = 3600
INJECT_KEYS = ("kill_rank", "hang_rank", "wrong_shard")
# Building, saving and running the reference twin before the ranks start, and reading their
# outputs after: well under a minute on 2 CPU cores (benchmarks/distributed.py).
SETUP_S = 60
HARD_GRACE_S = 60


class DistributedOptionsError(ValueError):
    """The job's distributed options are unusable; the message says which and why."""


def distributed_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check the job's `distributed` options and fill the defaults.

    Keys: "processes" (ranks on a cpu pool, 2..16, default 2), "tp" (validate this degree,
    2 or more, instead of the plan's), "expert_parallel" ("auto": EP when the plan uses it and the
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
        raise DistributedOptionsError(
            f"unknown distributed {'option' if len(unknown) == 1 else 'options'}: "
            f"{', '.join(unknown)}"
        )

    def integer(key: str, default: int | None, low: int, high: int) -> int | None:
        value = options.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise DistributedOptionsError(f"{key} must be an integer from {low} to {high}")
        return value

    out: dict[str, Any] = {
        "processes": integer("processes", DEFAULT_CPU_PROCESSES, 2, MAX_CPU_PROCESSES),
        "tp": integer("tp", None, 2, 1024),
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
    inject = options.get("inject", {})
    if not isinstance(inject, Mapping) or set(inject) - set(INJECT_KEYS) or len(inject) > 1:
        raise DistributedOptionsError(
            f"inject must be an object with one of {', '.join(INJECT_KEYS)}: a rank or a "
            "weight name"
        )
    for key in ("kill_rank", "hang_rank"):
        value = inject.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DistributedOptionsError(f"inject.{key} must be a rank number (0 or more)")
    if "wrong_shard" in inject and not (
        isinstance(inject["wrong_shard"], str) and inject["wrong_shard"].strip()
    ):
        raise DistributedOptionsError("inject.wrong_shard must be a weight's name")
    out["inject"] = dict(inject)
    return out


def distributed_time_limits(options: Mapping[str, Any] | None) -> tuple[int, int]:
    """(soft, hard) Celery time limits in seconds for the job's `distributed` options: soft =
    timeout_s + SETUP_S, hard = soft + HARD_GRACE_S (240 s and 300 s by default). Raises
    `DistributedOptionsError` (a ValueError) for unusable options."""
    soft = distributed_options(options)["timeout_s"] + SETUP_S
    return soft, soft + HARD_GRACE_S
