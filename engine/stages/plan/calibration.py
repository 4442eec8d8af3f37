"""Calibration of the roofline against the scaled twin's measured speed, per pool.

The datasheet roofline of `roofline.py` (the planner's model before the step-time model of
`step_time.py`), on the figures of the device the performance stage measured on, predicts the
scaled twin's own points; the measured figure over the predicted one is the roofline's
efficiency on that device:

    decode_efficiency  = measured decode tokens/s  / predicted decode tokens/s
    prefill_efficiency = measured prefill tokens/s / predicted prefill tokens/s
                       = predicted TTFT / measured TTFT

(a ratio; 1 = the twin runs at the roofline, 0.05 = at 5% of it). The roofline is a bound:
an efficiency above 1 (`MAX_EFFICIENCY`) means the device figures it read were measured too
low (a probe error: a float16 matmul probe that read 1.17 GFLOP/s against 71.5 for bfloat16
made prefill efficiencies of 353%), not a twin faster than its hardware. Such a value is kept
on its point with the flag `probe_error` (and the reason), and never used to calibrate: the
run's medians, the pool's running calibration and so the plan's factors leave it out. Per
measured point of a
16-bit dtype (`CALIBRATED_DTYPES`; the roofline's compute figure is the dense BF16 one), with:

- the twin's shape from its own config (`analyze_config(twin config)` -> `ModelShape`), whole
  on one device (`roofline.single_device_roofline`: TP1, no communication), weights at the
  point's dtype (2 bytes per param);
- decode: `batch_size` sequences, each with a KV cache of the median timed decode step
  (`prompt_len + warmup + ceil(repeats / 2)` tokens);
- prefill: `batch_size` prompts of `prompt_len` tokens in one forward;
- the device figures: the catalog's (datasheet) for a pool whose accelerator kind has them,
  else those measured on the device by `device_probe.probe_device` (triad bandwidth; the
  matmul FLOP/s of the point's dtype), labelled "measured".

The pool's running calibration (`running_calibration`, fed by the selector
`adaptation.selectors.pool_calibration`) is the median, over the pool's last successful
performance runs, of each run's median efficiency. The plan reports it beside its full-size
prediction (`calibrated_predictions`) but no longer scales that prediction by it: the factor
is the twin's efficiency against the datasheet roofline, while the step-time model already
predicts at fitted achievable figures (and the pool's full-size sweeps refit them: the
closed loop, `closed_loop.py`), so a calibrated figure would count the efficiency twice; and
a twin's short steps carry fixed per-step costs (Python, kernel launches, framework
overhead) a full model's do not, which one factor cannot tell from efficiency.

Plain Python (no torch): the plan stage imports it in the web process too.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine import formatting as fmt
from engine.catalog import Accelerator

from .errors import PlanInputError
from .model import ModelShape
from .roofline import MFU_PREFILL, single_device_roofline

CALIBRATED_DTYPES = ("bfloat16", "float16")
EFFICIENCY_METRICS = ("decode_efficiency", "prefill_efficiency")
EFFICIENCY_UNIT = "ratio"
DEFAULT_CALIBRATION_RUNS = 10
CALIBRATED_LABEL = "calibrated prediction"
NO_CALIBRATION = "no calibration yet"
DEFINITIONS: Mapping[str, str] = {
    "decode_efficiency": (
        "measured decode tokens/s of the scaled twin / the roofline's decode tokens/s for the "
        "same point on the same device (ratio; 1 = at the roofline)"
    ),
    "prefill_efficiency": (
        "measured prefill tokens/s of the scaled twin / the roofline's prefill tokens/s for "
        f"the same point on the same device (ratio; the roofline assumes {MFU_PREFILL:.0%} MFU "
        "as the plan does)"
    ),
    "predicted twin point": (
        "the plan's roofline formulas for the twin's own shape whole on one device (TP1): "
        "decode of batch_size sequences with the KV cache of the median timed decode step, "
        "prefill of batch_size prompts of prompt_len tokens in one forward"
    ),
}
# Below this decode efficiency a twin's steps are mostly fixed per-step cost (measured: about
# 1-4% on one CPU core, 0.001% on an H200, where a 4-layer twin's step takes tens of ms of
# launches for microseconds of memory traffic): the factor then says little about the full
# model, and the calibration says so.
OVERHEAD_BOUND_EFFICIENCY = 0.05
# An efficiency over the roofline is a probe error (module docstring).
MAX_EFFICIENCY = 1.0
PROBE_ERROR = (
    "{metric} {value:.0%} is above the roofline (over {limit:.0%}): the device figure the "
    "roofline read ({figure}) was measured too low; flagged as a probe error, not used to "
    "calibrate"
)


def usable_efficiency(value: Any) -> float | None:
    """`value` as an efficiency the calibration may use: positive, finite and at most
    `MAX_EFFICIENCY`; None otherwise (a probe error above it, or no figure)."""
    value = _positive(value)
    return value if value is not None and value <= MAX_EFFICIENCY else None


CAVEAT = (
    "the factor is the scaled twin's efficiency on this pool's device: fixed per-step costs "
    "(Python, kernel launches) weigh more on a twin's short steps than on the full model's, "
    "so the calibrated figure is likely pessimistic; the raw roofline is kept beside it"
)


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 < value < math.inf else None


def device_accelerator(
    *, name: str, bandwidth_bytes_per_s: float, flops: float, memory_bytes: int
) -> Accelerator:
    """One device with the given figures, for the twin's roofline: `flops` is the dense
    FLOP/s of the compute dtype of the points it predicts (the roofline reads it as
    `dense_bf16_flops`)."""
    return Accelerator(
        kind="calibration",
        name=name,
        vendor="",
        memory_bytes=max(1, int(memory_bytes)),
        memory_bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        dense_bf16_flops=flops,
        dense_fp8_flops=None,
        dtypes=CALIBRATED_DTYPES,
        intra_node_bandwidth_bytes_per_s=None,
        inter_node_bandwidth_bytes_per_s=None,
        devices_per_node=1,
    )


def decode_cache_tokens(prompt_len: int, *, warmup: int, repeats: int) -> int:
    """KV tokens per sequence at the median timed decode step of a measured point: the prompt,
    the untimed steps and half the timed ones."""
    return prompt_len + warmup + math.ceil(repeats / 2)


def predict_twin_point(
    shape: ModelShape,
    accelerator: Accelerator,
    *,
    dtype: str,
    batch_size: int,
    prompt_len: int,
    cache_tokens: int,
) -> dict[str, Any]:
    """The roofline's figures for one point of the twin on one device (module docstring):
    {"ttft_s", "tpot_s", "prefill_tokens_per_s", "decode_tokens_per_s", "cache_tokens"}."""
    decode = single_device_roofline(
        shape, accelerator, dtype=dtype, context_tokens=cache_tokens, concurrency=batch_size
    )
    tpot = decode.decode_tpot_s(batch_size)
    ttft = decode.prefill_ttft_s(prompt_len, sequences=batch_size)
    return {
        "cache_tokens": cache_tokens,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "prefill_tokens_per_s": batch_size * prompt_len / ttft,
        "decode_tokens_per_s": batch_size / tpot,
    }


def _median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def twin_calibration(
    analysis: Mapping[str, Any],
    measured: Sequence[Mapping[str, Any]],
    figures: Mapping[str, Any],
    *,
    warmup: int,
    repeats: int,
    model: str = "twin",
) -> dict[str, Any]:
    """The twin's predicted points and efficiencies for the `measured` points of one
    performance run (module docstring). `model` tags the points as the measured ones are
    ("twin"; "release" for a small release measured at full size on its real weights).

    `analysis` is `analyze_config(twin config).to_dict()`; `figures` = {"memory_bandwidth_
    bytes_per_s", "flops": {dtype: FLOP/s}, "source", "kind": "measured" | "datasheet",
    "name", "memory_bytes"}. Returns {"available", "reason" (when not), "points" ([{"kind":
    "predicted", "model": "twin", "dtype", "batch_size", "prompt_len", "cache_tokens",
    "ttft_s", "tpot_s", "prefill_tokens_per_s", "decode_tokens_per_s",
    "measured_decode_tokens_per_s", "measured_prefill_tokens_per_s", "decode_efficiency",
    "prefill_efficiency"}]), "decode_efficiency_median", "prefill_efficiency_median",
    "by_dtype" ({dtype: {"decode_efficiency_median", "prefill_efficiency_median", "points"}}),
    "skipped_dtypes" ({dtype: reason}), "twin_shape", "figures", "definitions", "basis"}.
    """
    result: dict[str, Any] = {
        "available": False,
        "points": [],
        "decode_efficiency_median": None,
        "prefill_efficiency_median": None,
        "by_dtype": {},
        "skipped_dtypes": {},
        "figures": dict(figures),
        "definitions": dict(DEFINITIONS),
    }
    try:
        shape = ModelShape.from_analysis(analysis)
    except PlanInputError as err:
        result["reason"] = f"the twin's config cannot be read as a roofline shape: {err}"
        return result
    result["twin_shape"] = {
        "total_params": shape.total_params,
        "active_params": shape.active_params,
        "num_layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "num_experts": shape.num_experts,
        "experts_per_token": shape.experts_per_token,
        "attention_kind": shape.attention_kind,
        "kv_cache_bytes_per_token": shape.kv_cache_bytes_per_token,
    }
    bandwidth = _positive(figures.get("memory_bandwidth_bytes_per_s"))
    flops_by_dtype = figures.get("flops") if isinstance(figures.get("flops"), Mapping) else {}
    if bandwidth is None:
        result["reason"] = "no memory bandwidth figure for the device"
        return result
    for point in measured:
        dtype = point.get("dtype")
        if dtype not in CALIBRATED_DTYPES:
            result["skipped_dtypes"].setdefault(
                str(dtype),
                "the roofline predicts 16-bit serving dtypes (bfloat16, float16) only",
            )
            continue
        flops = _positive(flops_by_dtype.get(dtype))
        if flops is None:
            result["skipped_dtypes"].setdefault(dtype, f"no {dtype} FLOP/s figure for the device")
            continue
        accelerator = device_accelerator(
            name=str(figures.get("name") or "device"),
            bandwidth_bytes_per_s=bandwidth,
            flops=flops,
            memory_bytes=int(figures.get("memory_bytes") or 1 << 40),
        )
        batch, prompt = int(point["batch_size"]), int(point["prompt_len"])
        predicted = predict_twin_point(
            shape,
            accelerator,
            dtype=dtype,
            batch_size=batch,
            prompt_len=prompt,
            cache_tokens=decode_cache_tokens(prompt, warmup=warmup, repeats=repeats),
        )
        decode = _positive(point.get("decode_tokens_per_s"))
        prefill = _positive(point.get("prefill_tokens_per_s"))
        entry = {
            "kind": "predicted",
            "model": model,
            "dtype": dtype,
            "batch_size": batch,
            "prompt_len": prompt,
            **predicted,
            "measured_decode_tokens_per_s": decode,
            "measured_prefill_tokens_per_s": prefill,
            "decode_efficiency": decode / predicted["decode_tokens_per_s"] if decode else None,
            "prefill_efficiency": (
                prefill / predicted["prefill_tokens_per_s"] if prefill else None
            ),
        }
        errors = {
            metric: PROBE_ERROR.format(
                metric=metric,
                value=entry[metric],
                limit=MAX_EFFICIENCY,
                figure=f"{bandwidth:.3g} bytes/s, {flops:.3g} FLOP/s in {dtype}",
            )
            for metric in EFFICIENCY_METRICS
            if entry[metric] is not None and entry[metric] > MAX_EFFICIENCY
        }
        if errors:
            entry["probe_error"] = sorted(errors)
            entry["probe_error_reason"] = "; ".join(errors.values())
        result["points"].append(entry)
    points = result["points"]
    if not points:
        result["reason"] = "no measured point of a 16-bit dtype to predict" + (
            "; " + "; ".join(f"{d}: {why}" for d, why in result["skipped_dtypes"].items())
            if result["skipped_dtypes"]
            else ""
        )
        return result
    for dtype in dict.fromkeys(p["dtype"] for p in points):
        mine = [p for p in points if p["dtype"] == dtype]
        result["by_dtype"][dtype] = {
            "decode_efficiency_median": _median(
                usable_efficiency(p["decode_efficiency"]) for p in mine
            ),
            "prefill_efficiency_median": _median(
                usable_efficiency(p["prefill_efficiency"]) for p in mine
            ),
            "points": len(mine),
            "probe_errors": sum(1 for p in mine if p.get("probe_error")),
        }
    result["decode_efficiency_median"] = _median(
        usable_efficiency(p["decode_efficiency"]) for p in points
    )
    result["prefill_efficiency_median"] = _median(
        usable_efficiency(p["prefill_efficiency"]) for p in points
    )
    flagged = [p for p in points if p.get("probe_error")]
    result["probe_errors"] = len(flagged)
    if flagged:
        result["probe_error"] = (
            f"{len(flagged)} of {len(points)} points measured above the roofline (efficiency "
            f"over {MAX_EFFICIENCY:.0%}): a probe error, left out of the medians; first: "
            f"{flagged[0]['dtype']} batch {flagged[0]['batch_size']}, prompt "
            f"{flagged[0]['prompt_len']}: {flagged[0]['probe_error_reason']}"
        )
    result["available"] = result["decode_efficiency_median"] is not None
    result["basis"] = (
        f"the scaled twin ({shape.total_params:,} params, {shape.active_params:,} active, "
        f"{shape.num_layers} layers, hidden {shape.hidden_size}) measured on "
        f"{figures.get('name') or 'the device'} against the roofline on "
        f"{figures.get('kind') or 'the'} figures ({figures.get('source') or 'unknown source'})"
    )
    if not result["available"]:
        result["reason"] = (
            "no decode efficiency at or under the roofline: every point is a probe error"
            if flagged
            else "no measured decode tokens/s to compare"
        )
    return result


def running_calibration(
    pool: str, runs: Sequence[Mapping[str, Any]], *, window: int = DEFAULT_CALIBRATION_RUNS
) -> dict[str, Any]:
    """The pool's running calibration from its last performance runs, newest first.

    A run: {"stage_run", "job", "release", "finished_at", "worker_host", "decode_efficiency"
    ([values per point]), "prefill_efficiency" ([values]), "dtypes", "twin_params",
    "device" (the run's measured device figures or None)}. Returns {"pool", "available",
    "reason" (when not: "no calibration yet: ..."), "label", "runs" (how many gave an
    efficiency), "window", "decode_factor" and "prefill_factor" (the median over runs of each
    run's median efficiency; None without data), "per_run" ([{"stage_run", "job", "release",
    "finished_at", "worker_host", "decode_efficiency_median", "prefill_efficiency_median"}]),
    "basis", "caveat", "warning" (a decode factor under `OVERHEAD_BOUND_EFFICIENCY`: mostly
    per-step overhead), "device" (the newest run's measured device figures, with "source"),
    "probe_errors" (efficiencies left out for being above the roofline, `MAX_EFFICIENCY`,
    with a run's own "probe_errors" count where its caller dropped some already) and
    "probe_error" (a sentence, when there were any)}. Efficiencies above the roofline never
    reach a factor.
    """
    per_run = []
    probe_errors = 0
    for run in runs[:window]:
        values = {metric: list(run.get(metric) or []) for metric in EFFICIENCY_METRICS}
        usable = {
            metric: [v for v in vals if usable_efficiency(v) is not None]
            for metric, vals in values.items()
        }
        dropped = sum(
            1 for vals in values.values() for v in vals if usable_efficiency(v) is None
        ) + int(run.get("probe_errors") or 0)
        probe_errors += dropped
        decode = _median(usable["decode_efficiency"])
        prefill = _median(usable["prefill_efficiency"])
        if decode is None and prefill is None:
            continue
        per_run.append(
            {
                "stage_run": run.get("stage_run"),
                "job": run.get("job"),
                "release": run.get("release"),
                "finished_at": run.get("finished_at"),
                "worker_host": run.get("worker_host"),
                "decode_efficiency_median": decode,
                "prefill_efficiency_median": prefill,
                "dtypes": list(run.get("dtypes") or []),
                "twin_params": run.get("twin_params"),
                "probe_errors": dropped,
            }
        )
    device = None
    for run in runs[:window]:
        probe = run.get("device")
        if isinstance(probe, Mapping) and _positive(probe.get("memory_bandwidth_bytes_per_s")):
            threads = probe.get("threads")
            device = dict(probe) | {
                "source": (
                    f"performance run {run.get('stage_run')} (job {run.get('job')}) on "
                    f"{run.get('worker_host') or 'a worker'} at {run.get('finished_at')}"
                    + (f", {fmt.counted(threads, 'torch thread')}" if threads else "")
                    + ": STREAM triad and matmul probes (engine/device_probe.py)"
                )
            }
            break
    result: dict[str, Any] = {
        "pool": pool,
        "label": CALIBRATED_LABEL,
        "window": window,
        "runs": len(per_run),
        "decode_factor": _median(r["decode_efficiency_median"] for r in per_run),
        "prefill_factor": _median(r["prefill_efficiency_median"] for r in per_run),
        "per_run": per_run,
        "device": device,
        "caveat": CAVEAT,
        "probe_errors": probe_errors,
    }
    result["available"] = result["decode_factor"] is not None
    if probe_errors:
        result["probe_error"] = (
            f"{probe_errors} efficiencies above the roofline (over {MAX_EFFICIENCY:.0%}) left "
            "out: probe errors, not used to calibrate"
        )
    if not result["available"]:
        result["reason"] = (
            f"{NO_CALIBRATION}: pool {pool} has no successful performance run with the twin's "
            "measured/predicted efficiency" + (" at or under the roofline" if probe_errors else "")
        )
        return result
    params = sorted({r["twin_params"] for r in per_run if r.get("twin_params")})
    hosts = sorted({str(r["worker_host"]) for r in per_run if r.get("worker_host")})
    dtypes = sorted({d for r in per_run for d in r["dtypes"]})
    twins = (
        f"twins of {params[0]:,} to {params[-1]:,} params"
        if len(params) > 1
        else (f"a twin of {params[0]:,} params" if params else "scaled twins")
    )
    result["basis"] = (
        f"median decode efficiency (measured / roofline-predicted decode tokens/s of the "
        f"scaled twin) of {fmt.counted(len(per_run), 'performance run')} on pool {pool}"
        + (f" ({', '.join(hosts)})" if hosts else "")
        + f"; {twins}, {', '.join(dtypes) or 'no dtype'}"
    )
    if result["decode_factor"] < OVERHEAD_BOUND_EFFICIENCY:
        result["warning"] = (
            f"the twins ran at {result['decode_factor']:.3%} of their decode roofline: their "
            "steps are mostly fixed per-step cost (Python, kernel launches), which a full-size "
            "model amortises over far more bytes per step, so the calibrated figure is a "
            "floor, and the raw roofline the better guide at full size"
        )
    return result


# The step-time model predicts the full size at achievable figures fitted on published results
# or on the pool's own full-size sweeps: the twin's factor, measured against the datasheet
# roofline on a twin whose short steps cannot tell fixed cost from efficiency, would count the
# efficiency twice. It is reported, not applied.
SUPERSEDED = (
    "not applied: the prediction already uses fitted achievable figures, so the twin's "
    "roofline factor would count the efficiency twice"
)


def calibrated_predictions(
    predicted: Mapping[str, Any], calibration: Mapping[str, Any] | None
) -> dict[str, Any]:
    """What the pool's running `calibration` says beside the plan's `predicted`: {"available":
    False, "label": "calibrated prediction", "kind": "calibrated", "reason" ("no calibration
    yet: ..." without calibration; "no raw prediction to calibrate: ..."; "no decode
    efficiency"; else `SUPERSEDED`), and, with a calibration, its "decode_factor",
    "prefill_factor", "runs", "basis", "caveat" and "warning" (where the factor is under
    `OVERHEAD_BOUND_EFFICIENCY`)}. The twin's factors are reported for what they say of the
    twin; no full-size figure is scaled by them (module docstring)."""
    base = {"kind": "calibrated", "label": CALIBRATED_LABEL, "available": False}
    if not isinstance(calibration, Mapping) or not calibration.get("available"):
        reason = (calibration or {}).get("reason") if isinstance(calibration, Mapping) else None
        return base | {"reason": reason or f"{NO_CALIBRATION}: the pool has no performance runs"}
    decode = _positive(calibration.get("decode_factor"))
    facts = {
        "decode_factor": decode,
        "prefill_factor": _positive(calibration.get("prefill_factor")),
        "runs": calibration.get("runs"),
        "basis": calibration.get("basis"),
        "caveat": calibration.get("caveat") or CAVEAT,
    }
    if calibration.get("warning"):
        facts["warning"] = calibration["warning"]
    if not isinstance(predicted, Mapping) or not predicted.get("available"):
        why = predicted.get("reason") if isinstance(predicted, Mapping) else None
        return base | facts | {"reason": f"no raw prediction to calibrate: {why or 'none made'}"}
    if decode is None:
        return base | facts | {"reason": f"{NO_CALIBRATION}: no decode efficiency"}
    return base | facts | {"reason": SUPERSEDED}
