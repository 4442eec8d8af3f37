"""What one process records from a model: logits, hidden states at named modules, timings.

Shared by the single-process float32 reference (the stage's own process) and every rank of the
distributed run (`rank.py`), so both sides record the same things the same way. Torch only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch


def _tensor(output: Any) -> torch.Tensor | None:
    """The hidden-state tensor of a module's output, as a full local tensor.

    Decoder layers and attention blocks return tuples (hidden states first); a DTensor output
    (a module whose plan keeps it sharded) is gathered with `full_tensor()`.
    """
    value = output[0] if isinstance(output, tuple | list) and output else output
    if hasattr(value, "full_tensor"):
        value = value.full_tensor()
    return value if isinstance(value, torch.Tensor) else None


@torch.no_grad()
def record_run(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    names: Sequence[str],
    *,
    steps: int,
    forced_tokens: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Prefill `input_ids` [batch, prompt] then `steps` decode steps through the KV cache.

    Returns {"prefill_logits" [batch, prompt, vocab], "decode_logits" [batch, steps, vocab],
    "tokens" [batch, steps] (the tokens fed: `forced_tokens` when given, else greedy), "hidden":
    {module name: its prefill output [batch, prompt, hidden]}}, all float32 on the CPU.
    """
    device = next(model.parameters()).device
    hidden: dict[str, torch.Tensor] = {}
    handles = []
    for name in names:
        module = model.get_submodule(name)

        def hook(_module, _args, output, name=name):
            value = _tensor(output)
            if value is not None:
                hidden[name] = value.detach().float().cpu()

        handles.append(module.register_forward_hook(hook))
    try:
        out = model(input_ids=input_ids.to(device), use_cache=True)
    finally:
        for handle in handles:
            handle.remove()
    prefill = out.logits.float().cpu()
    last = prefill[:, -1]
    cache = out.cache
    decode, fed = [], []
    for step in range(steps):
        nxt = forced_tokens[:, step] if forced_tokens is not None else last.argmax(-1)
        fed.append(nxt)
        out = model(input_ids=nxt[:, None].to(device), cache=cache, use_cache=True)
        cache = out.cache
        last = out.logits[:, -1].float().cpu()
        decode.append(last)
    return {
        "prefill_logits": prefill,
        "decode_logits": torch.stack(decode, dim=1),
        "tokens": torch.stack(fed, dim=1),
        "hidden": hidden,
    }


def _sync(device: torch.device) -> None:
    module = getattr(torch, device.type, None)
    synchronize = getattr(module, "synchronize", None)
    if device.type != "cpu" and callable(synchronize):
        synchronize()


@torch.no_grad()
def time_steps(model: torch.nn.Module, input_ids: torch.Tensor, *, steps: int) -> dict[str, Any]:
    """Wall-clock seconds of one prefill and of `steps` greedy decode steps (measured).

    Returns {"prefill_s": float, "decode_step_s": [float] * steps}. The device is synchronised
    around each step, so a step's time includes its collectives.
    """
    device = next(model.parameters()).device
    ids = input_ids.to(device)
    _sync(device)
    start = time.perf_counter()
    out = model(input_ids=ids, use_cache=True)
    _sync(device)
    prefill_s = time.perf_counter() - start
    cache, nxt = out.cache, out.logits[:, -1].argmax(-1)
    step_s = []
    for _ in range(steps):
        start = time.perf_counter()
        out = model(input_ids=nxt[:, None], cache=cache, use_cache=True)
        _sync(device)
        step_s.append(time.perf_counter() - start)
        cache, nxt = out.cache, out.logits[:, -1].argmax(-1)
    return {"prefill_s": prefill_s, "decode_step_s": step_s}


# Profiler events that are collectives or waits on them: c10d's ops on a process group
# (`c10d::allreduce_`), the functional collectives DTensor issues and their waits
# (`_c10d_functional::all_reduce`, `_c10d_functional::wait_tensor`), and the backends' kernels.
COLLECTIVE_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::")
COLLECTIVE_KERNEL_MARKS = ("nccl", "gloo", "xccl")


def is_collective(name: str) -> bool:
    """Whether a profiler event `name` is communication (see `COLLECTIVE_PREFIXES`)."""
    lowered = name.lower()
    marked = any(mark in lowered for mark in COLLECTIVE_KERNEL_MARKS)
    return name.startswith(COLLECTIVE_PREFIXES) or marked


@torch.no_grad()
def profile_comm(model: torch.nn.Module, input_ids: torch.Tensor, *, steps: int) -> dict[str, Any]:
    """The share of a prefill + `steps` decode steps spent in collectives, from torch.profiler.

    Returns {"wall_s" (the profiled run's wall-clock seconds), "comm_s" (seconds: the self
    time of collective events, device time on an accelerator, CPU time otherwise), "fraction"
    (comm_s / wall_s, capped at 1), "ops": {event name: {"calls", "time_s"}}}. The profiler
    adds its own overhead to both sides; the step times come from `time_steps`, unprofiled.
    """
    from torch.profiler import ProfilerActivity, profile

    device = next(model.parameters()).device
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        time_steps(model, input_ids, steps=steps)
        wall_s = time.perf_counter() - start
    ops: dict[str, dict[str, Any]] = {}
    comm_us = 0.0
    for event in prof.key_averages():
        if not is_collective(event.key):
            continue
        device_us = float(getattr(event, "self_device_time_total", 0.0) or 0.0)
        us = device_us if device.type != "cpu" and device_us else float(event.self_cpu_time_total)
        comm_us += us
        ops[event.key] = {"calls": int(event.count), "time_s": us / 1e6}
    comm_s = comm_us / 1e6
    return {
        "wall_s": wall_s,
        "comm_s": comm_s,
        "fraction": min(1.0, comm_s / wall_s) if wall_s > 0 else None,
        "ops": ops,
    }
