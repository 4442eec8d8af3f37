"""Running a twin: the pool's device, prefill and greedy decode with the KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine import formatting as fmt
from engine.contract import StageFailed

DECODE_STEPS = 4


def resolve_device(device: str, pool_name: str) -> torch.device:
    """The pool's torch device, checked present on this worker.

    Raises `StageFailed` when the string is not a torch device, or the device is absent
    (e.g. "cuda:0" on a machine without CUDA, an index beyond the device count).
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise StageFailed(f"pool {pool_name}: {device!r} is not a torch device ({exc})") from exc
    if dev.type == "cpu":
        return dev
    module = getattr(torch, dev.type, None)
    available = getattr(module, "is_available", None)
    if callable(available) and not available():
        raise StageFailed(
            f"pool {pool_name}'s device {device} is absent on this worker: torch.{dev.type}."
            "is_available() is False (this worker's torch has no usable "
            f"{dev.type} device; is the task on the right queue?)"
        )
    count = getattr(module, "device_count", None)
    if dev.index is not None and callable(count) and dev.index >= count():
        raise StageFailed(
            f"pool {pool_name}'s device {device} is absent on this worker: only "
            f"{fmt.counted(count(), f'{dev.type} device')}"
        )
    try:
        torch.empty(1, device=dev)
    except (RuntimeError, AssertionError) as exc:
        raise StageFailed(
            f"pool {pool_name}'s device {device} is absent on this worker: {exc}"
        ) from exc
    return dev


@dataclass
class Trace:
    """Logits of one prefill + decode run, on the CPU in float32.

    `prefill_logits` [batch, prompt_tokens, vocab]; `decode_logits` [batch, steps, vocab]
    (step s predicts from the prompt plus s decoded tokens); `tokens` [batch, steps] the tokens
    fed at each decode step (the greedy choice, or the forced ones).
    """

    prefill_logits: torch.Tensor
    decode_logits: torch.Tensor
    tokens: torch.Tensor


@torch.no_grad()
def prefill_and_decode(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    *,
    steps: int = DECODE_STEPS,
    forced_tokens: torch.Tensor | None = None,
) -> Trace:
    """Prefill `input_ids` then `steps` single-token decode steps through the KV cache.

    Greedy (argmax) unless `forced_tokens` [batch, steps] gives the tokens to feed (teacher
    forcing, so a target sees the reference's context at every step).
    """
    device = next(model.parameters()).device
    out = model(input_ids=input_ids.to(device), use_cache=True)
    cache = out.cache
    prefill = out.logits.float().cpu()
    last = out.logits[:, -1].float().cpu()
    decode, fed = [], []
    for step in range(steps):
        nxt = forced_tokens[:, step] if forced_tokens is not None else last.argmax(-1)
        fed.append(nxt)
        out = model(input_ids=nxt[:, None].to(device), cache=cache, use_cache=True)
        cache = out.cache
        last = out.logits[:, -1].float().cpu()
        decode.append(last)
    return Trace(
        prefill_logits=prefill,
        decode_logits=torch.stack(decode, dim=1),
        tokens=torch.stack(fed, dim=1),
    )
