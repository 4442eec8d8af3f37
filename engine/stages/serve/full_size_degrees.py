"""The TP degrees of the serve stage's full-size run and the scaling curve they measure.

The first launch runs at the plan's TP (or the largest degree the job asks for); each smaller
degree is launched too where the engines accept its split for the model (the plan's own
`validity.check_split`), the worker holds its devices, and one device holds the weights and a
sequence's KV cache at it (the plan's memory per device). `scaling` reads the sweeps back as
speedup and efficiency against the smallest degree measured.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.stored import as_mapping

from .command import devices_needed, parallel_sizes, tensor_parallel
from .full_size_settings import FullSizeSettings


def _valid_split(analysis: Mapping[str, Any] | None, planned: str, kind: str, tp: int) -> str:
    """ "" when the engines accept TP=`tp` with the plan's other sizes for this model, else the
    rule it breaks (`plan.validity.check_split`); "" too when the model cannot be read."""
    if not analysis:
        return ""
    from engine.stages.plan.errors import PlanInputError
    from engine.stages.plan.model import ModelShape
    from engine.stages.plan.validity import Split, check_split

    sizes = parallel_sizes(planned, kind)
    try:
        shape = ModelShape.from_analysis(analysis)
    except PlanInputError:
        return ""
    pp = sizes.get("--pipeline-parallel-size", sizes.get("--pp-size", 1))
    split = Split(tp=tp, pp=pp, dp=1, ep=1)  # the TP rules; EP off as in `valid_tp_sizes`
    validity = check_split(shape, split)
    return "" if validity.valid else "; ".join(validity.reasons)


def _fits_memory(plan: Mapping[str, Any], tp: int, plan_tp: int, device: str) -> bool:
    """Whether one device holds the plan's weights and one sequence's KV cache at TP=`tp`
    instead of its own TP (both split by TP; the workspace and overhead as planned:
    `memory_per_device_bytes`, `kv_bytes_per_sequence_per_device`). On a cpu pool every rank
    shares the host's memory: what fits at the plan's TP fits."""
    if device == "cpu" or tp >= plan_tp:
        return True
    memory = as_mapping(plan.get("memory_per_device_bytes"))
    weights, budget = memory.get("weights"), memory.get("budget")
    if not isinstance(weights, int | float) or not isinstance(budget, int | float):
        return False
    kv = float(plan.get("kv_bytes_per_sequence_per_device") or 0)
    rest = float(memory.get("activations_workspace") or 0) + float(
        memory.get("runtime_overhead") or 0
    )
    return (weights + kv) * plan_tp / tp + rest <= budget


def tp_degrees(
    *,
    settings: FullSizeSettings,
    plan: Mapping[str, Any],
    planned: str,
    kind: str,
    analysis: Mapping[str, Any] | None,
    devices_held: int,
    device: str,
) -> tuple[list[int], list[dict[str, Any]]]:
    """(degrees to launch, the plan's first; those left out, with why): the job's
    `full_size_tp_sizes`, else the plan's TP and the smaller powers of two (and TP=2 after a
    cpu pool's TP=1, the scaling curve on its cores). A degree is left
    out when the engines refuse its split for this model ("invalid_split", with the rule), the
    worker holds too few devices for it ("too_few_devices") or the weights do not fit a device
    at it ("does_not_fit")."""
    plan_tp = tensor_parallel(planned, kind)
    others = max(1, devices_needed(planned, kind) // max(1, plan_tp))
    if settings.tp_sizes:
        wanted = list(settings.tp_sizes)
    else:
        wanted = [plan_tp]
        smaller = 1
        while smaller < plan_tp:
            wanted.append(smaller)
            smaller *= 2
        wanted = [wanted[0], *sorted(wanted[1:], reverse=True)]
        if device == "cpu" and plan_tp == 1:
            # A cpu pool's plan is TP=1: TP=2 on the same cores gives its scaling curve.
            wanted.append(2)
    chosen: list[int] = []
    left_out: list[dict[str, Any]] = []
    for tp in wanted:
        rule = _valid_split(analysis, planned, kind, tp)
        if rule:
            left_out.append({"tp": tp, "reason": "invalid_split", "rule": rule})
        elif tp * others > devices_held:
            left_out.append({"tp": tp, "reason": "too_few_devices", "devices_needed": tp * others})
        elif not _fits_memory(plan, tp, plan_tp, device):
            left_out.append({"tp": tp, "reason": "does_not_fit"})
        else:
            chosen.append(tp)
    return chosen, left_out


def scaling(
    primary_tp: int | None,
    primary: Sequence[Mapping[str, Any]],
    tp_scaling: Sequence[Mapping[str, Any]],
    devices: Callable[[int], int],
) -> list[dict[str, Any]]:
    """The scaling curve at full size, per TP degree and concurrency level both measured:
    `{"tp", "concurrency", "output_tokens_per_s", "baseline_tp", "speedup", "efficiency"}`.
    The baseline is the smallest degree measured; `speedup` = output tokens/s / the
    baseline's at the same level; `efficiency` = speedup / (devices used / the baseline's
    devices), `devices(tp)` giving the devices a launch at `tp` uses (on a cpu pool every
    degree runs on the worker's same cores, so the efficiency there is the speedup)."""
    curves: dict[int, dict[int, float]] = {}
    for tp, sweep in [(primary_tp, primary)] + [
        (entry.get("tp"), entry.get("sweep") or []) for entry in tp_scaling
    ]:
        if not isinstance(tp, int):
            continue
        for point in sweep:
            rate = point.get("output_tokens_per_s")
            level = point.get("concurrency")
            usable = isinstance(rate, int | float) and rate > 0 and not point.get("errors")
            if isinstance(level, int) and usable:
                curves.setdefault(tp, {})[level] = float(rate)
    if len(curves) < 2:
        return []
    base = min(curves)
    rows = []
    for tp in sorted(curves):
        for level, rate in sorted(curves[tp].items()):
            reference = curves[base].get(level)
            if reference is None:
                continue
            speedup = rate / reference
            rows.append(
                {
                    "tp": tp,
                    "concurrency": level,
                    "output_tokens_per_s": rate,
                    "baseline_tp": base,
                    "speedup": round(speedup, 4),
                    "efficiency": round(speedup / (devices(tp) / devices(base)), 4),
                }
            )
    return rows
