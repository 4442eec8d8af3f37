"""Layer-wise drift: accumulated and LOCAL errors of every decoder sub-module.

Hook points (`hook_points`): per decoder layer its norms, attention and MLP/MoE, then the
layer's output; after the last layer the final norm. For each point two errors are measured
on the prefill (shape of a point's output: [batch, prompt_tokens, hidden]):

- accumulated (`relative_error`, `max_abs_error`): the target's own end-to-end run against the
  reference. It grows layer by layer and is what a chart of drift shows.
- local (`local_relative_error`, `local_max_abs_error`): the target module fed the reference's
  input to that same module (captured by a forward pre-hook on the reference, cast to the
  dtype the target's module receives), so its error is its own and not carried in from earlier
  layers.

MoE routing is teacher-forced like the decoded tokens, in both runs: where the target's router
picks a different top-k set of experts for a token than the reference did at the same call (a
near-tie flipped by rounding), that token gets the reference's experts and weights, and the flip
is counted (`routing_flips`, local and end to end) instead of showing up as an error: a flipped
discrete choice is reported, not mistaken for a numerical bug.

Relative error is ‖t - r‖₂ / ‖r‖₂ over the whole tensor (Frobenius norms, float64); max
absolute error is in the activation's own units. The first divergent module (execution order)
is the first whose local relative error exceeds the dtype's `max_local_relative_error`
(thresholds.py), or whose local output is not finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.contract import StageFailed
from engine.twin.run import Trace, prefill_and_decode

# (qualified module name, decoder layer index, kind: "norm" | "attention" | "mlp" | "moe" |
# "output")
Point = tuple[str, int, str]
ROUTER_NAMES = ("gate", "router")


def decoder_layers(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """The qualified name and ModuleList of the decoder layers (the longest ModuleList)."""
    best: tuple[str, torch.nn.ModuleList] | None = None
    for name, module in model.named_modules():
        is_layers = isinstance(module, torch.nn.ModuleList) and name.endswith("layers")
        if is_layers and (best is None or len(module) > len(best[1])):
            best = (name, module)
    if best is None:
        raise StageFailed(
            f"{type(model).__name__} has no decoder layer list to compare layer by layer"
        )
    return best


def module_kind(child_name: str, child: torch.nn.Module) -> str | None:
    """ "attention", "moe", "mlp" or "norm" for a decoder layer's direct sub-module."""
    lowered = child_name.lower()
    if "norm" in lowered:
        return "norm"
    if "attn" in lowered or "attention" in lowered:
        return "attention"
    if lowered in ("mlp", "feed_forward", "block_sparse_moe", "moe", "ffn"):
        return "moe" if hasattr(child, "experts") else "mlp"
    return None


def hook_points(model: torch.nn.Module) -> list[Point]:
    """Every compared module, in definition order (see the module docstring)."""
    prefix, layers = decoder_layers(model)
    points: list[Point] = []
    for i, layer in enumerate(layers):
        for child_name, child in layer.named_children():
            kind = module_kind(child_name, child)
            if kind is not None:
                points.append((f"{prefix}.{i}.{child_name}", i, kind))
        points.append((f"{prefix}.{i}", i, "output"))
    parent = prefix.rsplit(".", 1)[0] if "." in prefix else ""
    for final in ("norm", "final_layernorm", "ln_f"):
        name = f"{parent}.{final}" if parent else final
        try:
            model.get_submodule(name)
        except AttributeError:
            continue
        points.append((name, len(layers), "norm"))
        break
    return points


def router_names(model: torch.nn.Module, points: list[Point]) -> dict[str, str]:
    """{MoE point name: its router's qualified name} (a child named `gate` or `router`)."""
    out = {}
    for name, _layer, kind in points:
        if kind != "moe":
            continue
        module = model.get_submodule(name)
        for child in ROUTER_NAMES:
            if isinstance(getattr(module, child, None), torch.nn.Module):
                out[name] = f"{name}.{child}"
                break
    return out


def hidden_input(args: tuple, kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """A module call's hidden-state input: the first positional tensor or `hidden_states=`."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    value = kwargs.get("hidden_states")
    return value if isinstance(value, torch.Tensor) else None


def first_tensor(output: Any) -> torch.Tensor | None:
    """A module's main output: the tensor itself or the first element of a tuple."""
    tensor = output[0] if isinstance(output, tuple | list) and output else output
    return tensor if isinstance(tensor, torch.Tensor) else None


def routing_of(output: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(weights, expert indices) [tokens, top_k] of a router's output, or None.

    transformers' top-k routers (Qwen3-MoE, DeepSeek-V3, gpt-oss, Mixtral) return
    (router_logits, weights, indices) with integer indices; anything else is not recognised.
    """
    if not isinstance(output, tuple) or len(output) < 3:
        return None
    weights, indices = output[-2], output[-1]
    if (
        isinstance(weights, torch.Tensor)
        and isinstance(indices, torch.Tensor)
        and not indices.is_floating_point()
        and weights.shape == indices.shape
    ):
        return weights, indices
    return None


@dataclass
class Recording:
    """What the hooks kept from a model's first call (the prefill), float32 on the CPU.

    `inputs`/`outputs`: {point name: tensor}; `order`: point names in the order they ran;
    `routing`: {MoE point name: [(weights, indices) [tokens, top_k] per call of its router]}
    (prefill, then each decode step); `flips`: {MoE point name: [tokens whose top-k set
    differed from the reference's, tokens routed]} summed over calls, forced runs only.
    """

    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    routing: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    flips: dict[str, list[int]] = field(default_factory=dict)


def _keep(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float().cpu() if t.is_floating_point() else t.detach().cpu()


@contextmanager
def recording(
    model: torch.nn.Module,
    points: list[Point],
    *,
    inputs: bool = False,
    swap_from: Recording | None = None,
    route_from: Recording | None = None,
) -> Iterator[Recording]:
    """Hooks that record each point's first output (the prefill), every router call's choice,
    and with `inputs` each point's first input, while the block runs.

    With `swap_from` the run is LOCAL: each point's input is replaced by `swap_from`'s input to
    the same point (cast to the dtype and device the target's module received). With
    `route_from` each router call's output is forced to `route_from`'s experts and weights at
    the same call for every token whose top-k set differs (counted in `flips`).
    """
    reference = swap_from
    rec = Recording()
    handles = []
    routers = router_names(model, points)

    def pre_hook(name: str) -> Callable:
        def hook(_module: Any, args: tuple, kwargs: dict) -> tuple | None:
            actual = hidden_input(args, kwargs)
            if actual is None or name in rec.outputs:
                return None
            if inputs and name not in rec.inputs:
                rec.inputs[name] = _keep(actual)
            if reference is None or name not in reference.inputs:
                return None
            swapped = reference.inputs[name].to(device=actual.device, dtype=actual.dtype)
            if swapped.shape != actual.shape:
                return None
            if args and args[0] is actual:
                return (swapped, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": swapped}

        return hook

    def post_hook(name: str) -> Callable:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            tensor = first_tensor(output)
            if tensor is not None and name not in rec.outputs:
                rec.outputs[name] = _keep(tensor)
                rec.order.append(name)

        return hook

    def router_hook(moe: str) -> Callable:
        def hook(_module: Any, _args: Any, output: Any) -> Any:
            routed = routing_of(output)
            if routed is None:
                return None
            weights, indices = routed
            calls = rec.routing.setdefault(moe, [])
            calls.append((_keep(weights), _keep(indices)))
            ref_calls = route_from.routing.get(moe, []) if route_from is not None else []
            if len(ref_calls) < len(calls):
                return None
            ref_w, ref_i = ref_calls[len(calls) - 1]
            if ref_i.shape != indices.shape:
                return None
            ref_i = ref_i.to(indices.device)
            same = (indices.sort(-1).values == ref_i.sort(-1).values).all(-1, keepdim=True)
            counts = rec.flips.setdefault(moe, [0, 0])
            counts[0] += int((~same).sum())
            counts[1] += int(same.shape[0])
            forced_i = torch.where(same, indices, ref_i)
            forced_w = torch.where(same, weights, ref_w.to(weights.device, weights.dtype))
            return (*output[:-2], forced_w, forced_i)

        return hook

    for name, _layer, _kind in points:
        module = model.get_submodule(name)
        if inputs or swap_from is not None:
            handles.append(module.register_forward_pre_hook(pre_hook(name), with_kwargs=True))
        handles.append(module.register_forward_hook(post_hook(name)))
    for moe, router in routers.items():
        handles.append(model.get_submodule(router).register_forward_hook(router_hook(moe)))
    try:
        yield rec
    finally:
        for handle in handles:
            handle.remove()


def run_recorded(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    points: list[Point],
    *,
    forced: torch.Tensor | None,
    steps: int,
    inputs: bool = False,
    route_from: Recording | None = None,
) -> tuple[Trace, Recording]:
    """Prefill + `steps` decode steps (twin.run.prefill_and_decode) with hooks on `points`;
    `forced` tokens [batch, steps] and `route_from`'s expert choices are teacher-forced."""
    with recording(model, points, inputs=inputs, route_from=route_from) as rec:
        trace = prefill_and_decode(model, input_ids, steps=steps, forced_tokens=forced)
    return trace, rec


@torch.no_grad()
def run_local(
    model: torch.nn.Module, input_ids: torch.Tensor, points: list[Point], reference: Recording
) -> Recording:
    """One prefill of `model` with every point fed the reference's input (see `recording`)."""
    device = next(model.parameters()).device
    with recording(model, points, swap_from=reference, route_from=reference) as rec:
        model(input_ids=input_ids.to(device), use_cache=False)
    return rec


def errors(r: torch.Tensor, t: torch.Tensor) -> tuple[float, float]:
    """(max |t - r|, ‖t - r‖₂ / ‖r‖₂) in float64; (inf, inf) when `t` is not finite."""
    if not bool(torch.isfinite(t).all()):
        return math.inf, math.inf
    diff = t.double() - r.double()
    return float(diff.abs().max()), float(diff.norm() / r.double().norm().clamp_min(1e-30))


def layer_drift(
    reference: Recording, target: Recording, local: Recording, points: list[Point]
) -> list[dict[str, Any]]:
    """One row per point in the reference's execution order.

    {"layer", "module", "name", "max_abs_error", "relative_error" (accumulated),
    "local_max_abs_error", "local_relative_error", "finite" (the accumulated output), and for
    an MoE point whose router was recognised "routing_flips" (local prefill: same input, so
    rounding in the router alone), "end_to_end_routing_flips" (prefill and decode steps of the
    end-to-end run), "routed_tokens" (prefill tokens)}. Non-finite errors are `math.inf` here
    (the stage turns them into None for JSON).
    """
    meta = {name: (layer, kind) for name, layer, kind in points}
    rows = []
    for name in reference.order:
        r = reference.outputs[name]
        t, loc = target.outputs.get(name), local.outputs.get(name)
        if t is None or t.shape != r.shape:
            continue
        max_abs, rel = errors(r, t)
        local_max, local_rel = (
            errors(r, loc) if loc is not None and loc.shape == r.shape else (None, None)
        )
        layer, kind = meta[name]
        row = {
            "layer": layer,
            "module": kind,
            "name": name,
            "max_abs_error": max_abs,
            "relative_error": rel,
            "local_max_abs_error": local_max,
            "local_relative_error": local_rel,
            "finite": math.isfinite(rel),
        }
        if name in local.flips:
            row["routing_flips"], row["routed_tokens"] = local.flips[name]
            row["end_to_end_routing_flips"] = target.flips.get(name, [0, 0])[0]
        rows.append(row)
    return rows


def first_divergence(rows: list[dict[str, Any]], limit: float) -> dict[str, Any] | None:
    """The first row whose local relative error exceeds `limit` (or is not finite), or None."""
    for row in rows:
        local = row.get("local_relative_error")
        if local is not None and (not math.isfinite(local) or local > limit):
            return row
    return None
