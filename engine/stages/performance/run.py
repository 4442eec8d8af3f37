"""The `performance` stage: prefill and decode speed and memory of the twin on the pool's device.

The scaled twin (`engine.twin.build_twin`: the release's own transformers class at
CPU-sized widths, seeded weights) is copied onto the pool's device in each serving dtype the
pool declares and the device runs (the same targets as the precision stage,
`precision.targets.make_target`; a dtype the device cannot run is skipped with the reason).
For each prompt length and each batch size 1, 2, 4, ... up to `max_batch_size` (powers of two),
one point is measured:

- TTFT (s): one prefill forward of `batch_size` prompts of `prompt_len` tokens, with the KV
  cache, and the greedy choice of the first token; median and p95 over `prefill_repeats` runs
  after `prefill_warmup` untimed ones.
- TPOT (s): one decode forward of one token per sequence through the KV cache, and the greedy
  choice; median and p95 over `repeats` steps after `warmup` untimed ones (the cache grows by
  one token per step from the prompt length).
- prefill tokens/s = batch_size x prompt_len / TTFT; decode tokens/s = batch_size / TPOT
  (medians).
- peak memory (bytes) over the point: on an accelerator the bytes torch's allocator handed out
  (`max_memory_allocated`, weights included), on the CPU the process's resident set (VmHWM
  reset per point): `memory_kind` "device_allocated" or "process_rss" says which
  (`twin.measure.MemoryProbe`). The peak is the figure reported, but on the CPU the resident
  set carries what earlier points (other dtypes, larger batches) left behind, so a small
  point can read higher than a large one measured before it; `peak_memory_increase_bytes`
  (row metric `peak_process_rss_increase_bytes` / `peak_device_allocated_increase_bytes`) is
  what the point itself added: the peak minus `memory_before_bytes`, the memory in use as the
  point began, never below 0. Compare points by the increase.

TTFT and TPOT follow vLLM's `benchmarks/benchmark_serving.py` (TTFT: time to the first output
token; TPOT: time per output token after the first), without a server, a queue or a sampler:
here they are the model's forwards alone. p95 is the 95th percentile with linear interpolation
between order statistics (`statistics.quantiles(..., method="inclusive")`, as numpy's default
percentile that benchmark_serving uses). Timers: CUDA events with synchronisation on GPUs,
`time.perf_counter_ns` on the CPU (`twin.measure.StepTimer`).

Out of memory mid-sweep (`torch.OutOfMemoryError`, `MemoryError`, an allocator's "can't
allocate memory", or a peak over the `memory_limit_bytes` option, a ceiling for pools that must
leave room to others): the sweep of that dtype and prompt length stops there, the points
measured are kept and "stopped at batch N: out of memory (...)" is recorded in `stopped`. The
stage fails (`StageFailed(reason, result=...)`) only when no point was measured at all,
or when the twin raised anything else (naming the dtype, prompt length and batch).

A time budget ends the sweep, not the stage (`budget.py`): the stage's soft time limit
(`time_budget_s`, 180 s by default) less a 20% margin and the device probe's reserve. Each
curve gets its share of the time left, a point whose predicted cost (from the first points)
would not fit is not begun, and a point still running at the deadline is dropped (a Celery
`SoftTimeLimitExceeded` inside a point reads the same). The sweep then stops and keeps its
points, as for out of memory: `stopped` entries with "cause" "time budget", and
`time_budget` = {"stopped": "time budget", "stopped_at", ...}. The stage succeeds, and the
stop raises no known limitation.

The knee: on the measured curve of one dtype and prompt length, the smallest batch size b
from which decode tokens/s grows by less than `knee_growth` (default 10%) per doubling:
tokens/s(2^k b) < (1 + knee_growth)^k x tokens/s(b) for every larger batch measured (see
`find_knee`). Past it a larger batch buys little throughput for more TPOT. Where there is no
such b, the knee is not found and the largest batch measured is recommended (`found` False,
with why: the sweep's end). Each dtype's recommendation is its knee on the first prompt length
of `prompt_lens`; the top-level `knee_batch_size`/`knee_tpot_s` are those of the first dtype
measured (the pool's first serving dtype the device runs).

Predicted points: where the plan stage succeeded (`ctx.previous["plan"]`, `fits` true), its
roofline for the FULL-SIZE model on the pool's accelerators (`engine/stages/plan/roofline.py`,
`Roofline.predictions`: decode tokens/s and TPOT per concurrent sequences at the full target
context, TTFT per prompt length) is added as points with `kind` "predicted" and `model`
"full-size"; measured points carry `kind` "measured" and `model` "twin". They never share a
curve: a curve is one (kind, model, dtype, prompt length), and the knee reads measured points
only. Twin figures are the twin's, not the release's.

Calibration (`engine/stages/plan/calibration.py`): after the sweep the device's memory
bandwidth and matmul FLOP/s are measured on it (`probe_repeats.probe_until_stable`: each
probe sized until its figure is stable, then repeated until two quiet repeats agree, each
repeat labelled busy or quiet by the host's interference, within what the time budget
leaves; `calibration["device"]`, labelled measured, and `host_busy` when no repeat was
quiet). The same roofline formulas then predict the twin's own points on that device (on the
catalog's datasheet figures where the pool's accelerator kind has them, else on the measured
ones, whose source then says "on a busy host" where so), and each 16-bit measured point gets
its efficiency, measured / predicted (`decode_efficiency`, `prefill_efficiency`, ratios; one
above 1 is flagged a probe error and never calibrates), in
`calibration["points"]` (kind "predicted", model "twin": the twin's predicted figures with the
measured ones and the efficiencies). The pool's running calibration over its last runs
corrects the next plans' full-size predictions (`plan.calibration.calibrated_predictions`);
where this job's plan already carried a calibrated prediction, the full-size predicted points
carry it too (`calibrated_*` keys). None of it is the full-size model measured.

`performance_rows` flattens points into the rows the job stores (one metric each, with its
unit); `calibration_rows` adds the twin's predicted figures and its efficiencies. Both live in
the torch-free `measure_options` (the web process stores rows without loading torch) and are
re-exported here.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from engine import formatting as fmt
from engine.contract import StageContext, StageFailed, never_cancelled, raise_if_cancelled
from engine.stages.performance.budget import (
    TIME_BUDGET,
    SweepBudget,
    TimeBudgetReached,
    is_time_limit,
)
from engine.stages.performance.knee import find_knee
from engine.stages.performance.options import DEFAULT_TIME_BUDGET_S, performance_options
from engine.stages.performance.predictions import predicted_points
from engine.stages.performance.rows import UNITS
from engine.stages.plan.calibration import CALIBRATED_DTYPES, twin_calibration
from engine.twin import Twin, build_twin
from engine.twin.measure import (
    MemoryProbe,
    StepTimer,
    decode_step,
    forward_kwargs,
    free_memory,
    is_out_of_memory,
    one_line,
    p95,
    prefill_step,
    random_prompt,
)
from engine.twin.run import resolve_device

# Batch sizes swept by default: up to 64 on the CPU (the stage stays under 60 s on 2 cores,
# benchmarks/performance.py), 512 on an accelerator, where a twin's step is launch-bound and
# cheap up to large batches (out of memory stops the sweep earlier where it must).
DEFAULT_MAX_BATCH_SIZE_CPU = 64
DEFAULT_MAX_BATCH_SIZE_ACCELERATOR = 512
DEFAULT_PROMPT_LENS = (32, 128)
DEFAULT_PREFILL_WARMUP = 1
DEFAULT_PREFILL_REPEATS = 3
DEFAULT_WARMUP = 2
DEFAULT_REPEATS = 10
DEFAULT_KNEE_GROWTH = 0.10
KNEE_RULE = (
    "knee: the smallest measured batch size b from which decode tokens/s grows less than "
    "{growth:.0%} per doubling: tokens/s(2^k b) < (1 + {growth:g})^k x tokens/s(b) for every "
    "larger batch measured, on the measured curve of one dtype and prompt length; the largest "
    "batch measured when there is none (not found). A dtype's recommendation reads the curve "
    "of the first prompt length ({prompt_len} tokens)."
)
DEFINITIONS: Mapping[str, str] = {
    "ttft_s": (
        "one prefill forward of batch_size prompts of prompt_len tokens with the KV cache and "
        "the greedy first token, median of prefill_repeats runs after prefill_warmup (vLLM "
        "benchmark_serving's time to first token, model forward only)"
    ),
    "tpot_s": (
        "one decode forward of one token per sequence through the KV cache and the greedy "
        "choice, median of repeats steps after warmup (vLLM benchmark_serving's time per "
        "output token, model forward only)"
    ),
    "p95": "95th percentile, linear interpolation (statistics.quantiles, method inclusive)",
    "prefill_tokens_per_s": "batch_size x prompt_len / ttft_s",
    "decode_tokens_per_s": "batch_size / tpot_s",
    "peak_memory_bytes": (
        "peak over the point: device_allocated = torch's max_memory_allocated (weights "
        "included); process_rss = the whole process's resident set (VmHWM)"
    ),
    "peak_memory_increase_bytes": (
        "what the point itself added: peak_memory_bytes minus the memory in use as the point "
        "began (memory_before_bytes), at least 0; on the CPU the resident set keeps what "
        "earlier points left, so compare points by this figure, not by the peak"
    ),
}


@dataclass(frozen=True)
class PerformanceOptions:
    """The sweep's settings (see `performance_options` for each one's meaning)."""

    max_batch_size: int | None = None
    prompt_lens: tuple[int, ...] = DEFAULT_PROMPT_LENS
    warmup: int = DEFAULT_WARMUP
    repeats: int = DEFAULT_REPEATS
    prefill_warmup: int = DEFAULT_PREFILL_WARMUP
    prefill_repeats: int = DEFAULT_PREFILL_REPEATS
    dtypes: tuple[str, ...] | None = None
    knee_growth: float = DEFAULT_KNEE_GROWTH
    memory_limit_bytes: int | None = None
    time_budget_s: float = DEFAULT_TIME_BUDGET_S
    seed: int = 0

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> PerformanceOptions:
        """Options from a job's mapping, defaults for what it leaves out. Raises `ValueError`."""
        checked = performance_options(options)
        for name in ("prompt_lens", "dtypes"):
            if name in checked:
                checked[name] = tuple(checked[name])
        return cls(**checked)

    def for_device(self, device: torch.device) -> PerformanceOptions:
        """These options with `max_batch_size` set: the device's default where unset."""
        if self.max_batch_size is not None:
            return self
        default = (
            DEFAULT_MAX_BATCH_SIZE_CPU
            if device.type == "cpu"
            else DEFAULT_MAX_BATCH_SIZE_ACCELERATOR
        )
        return replace(self, max_batch_size=default)

    def batch_sizes(self) -> list[int]:
        """1, 2, 4, ... up to `max_batch_size` (the CPU's default where unset)."""
        limit = self.max_batch_size or DEFAULT_MAX_BATCH_SIZE_CPU
        sizes, b = [], 1
        while b <= limit:
            sizes.append(b)
            b *= 2
        return sizes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["prompt_lens"] = list(self.prompt_lens)
        data["dtypes"] = list(self.dtypes) if self.dtypes is not None else None
        return data


def _prefill_and_choose(model: torch.nn.Module, ids: torch.Tensor, extra: dict[str, Any]):
    cache, logits = prefill_step(model, ids, extra)
    return cache, logits.argmax(-1)


def _decode_and_choose(model: torch.nn.Module, tokens: torch.Tensor, cache: Any):
    cache, logits = decode_step(model, tokens, cache)
    return cache, logits.argmax(-1)


@dataclass
class _Sweep:
    """What one dtype's sweep produced."""

    points: list[dict[str, Any]] = field(default_factory=list)
    stopped: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    out_of_time: bool = False  # the time budget's deadline passed: no later sweep runs


@torch.no_grad()
def measure_point(
    model: torch.nn.Module,
    *,
    batch_size: int,
    prompt_len: int,
    vocab_size: int,
    pad_token_id: int | None,
    device: torch.device,
    timer: StepTimer,
    memory: MemoryProbe,
    options: PerformanceOptions,
    deadline: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """One measured point (see the module docstring), without `kind`, `model` and `dtype`.

    Raises what the model raises (`torch.OutOfMemoryError` and the like included), and
    `TimeBudgetReached` when `clock()` is past `deadline` after a forward (the point is
    dropped: the sweep's time budget is spent).
    """

    def check_clock() -> None:
        if deadline is not None and clock() >= deadline:
            raise TimeBudgetReached("the sweep's deadline passed inside the point")

    ids = random_prompt(
        vocab_size, batch_size, prompt_len, seed=options.seed, pad_token_id=pad_token_id
    ).to(device)
    extra = forward_kwargs(model)
    memory.reset_peak()
    before = memory.current_bytes()
    ttfts: list[float] = []
    cache = tokens = None
    for attempt in range(options.prefill_warmup + options.prefill_repeats):
        cache = tokens = None  # the previous run's cache is freed before the next prefill
        (cache, tokens), seconds = timer.time(
            functools.partial(_prefill_and_choose, model, ids, extra)
        )
        memory.current_bytes()
        check_clock()
        if attempt >= options.prefill_warmup:
            ttfts.append(seconds)
    tpots: list[float] = []
    for step in range(options.warmup + options.repeats):
        (cache, tokens), seconds = timer.time(
            functools.partial(_decode_and_choose, model, tokens, cache)
        )
        memory.current_bytes()
        check_clock()
        if step >= options.warmup:
            tpots.append(seconds)
    peak = memory.peak_bytes()
    ttft, tpot = statistics.median(ttfts), statistics.median(tpots)
    return {
        "batch_size": batch_size,
        "prompt_len": prompt_len,
        "ttft_s": ttft,
        "ttft_p95_s": p95(ttfts),
        "tpot_s": tpot,
        "tpot_p95_s": p95(tpots),
        "prefill_tokens_per_s": batch_size * prompt_len / ttft if ttft > 0 else None,
        "decode_tokens_per_s": batch_size / tpot if tpot > 0 else None,
        "peak_memory_bytes": peak,
        "peak_memory_increase_bytes": (
            max(0, peak - before) if peak is not None and before is not None else None
        ),
        "memory_before_bytes": before,
        "memory_kind": memory.kind,
        "prefill_samples": len(ttfts),
        "decode_samples": len(tpots),
    }


def _max_positions(config: Any) -> int | None:
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def sweep_dtype(
    model: torch.nn.Module,
    dtype: str,
    *,
    prompt_lens: Iterable[int],
    vocab_size: int,
    pad_token_id: int | None,
    device: torch.device,
    timer: StepTimer,
    memory: MemoryProbe,
    options: PerformanceOptions,
    model_tag: str = "twin",
    log: Callable[[str], None] | None = None,
    cancelled: Callable[[], bool] = never_cancelled,
    budget: SweepBudget | None = None,
    curves_after: int = 0,
) -> _Sweep:
    """Measure every (prompt length, batch size) point of one dtype's `model` (on `device`).

    Out of memory stops that prompt length's sweep (recorded in `stopped`, cause "out of
    memory"); any other exception stops the dtype's sweep (recorded in `errors`). The time
    `budget` (`budget.SweepBudget`; `curves_after`: the curves of later dtypes still to
    measure) stops a curve whose next point would not fit in its share, and the whole sweep
    when its deadline passes (recorded in `stopped`, cause "time budget"; `sweep.out_of_time`).
    Never raises for the model's failures; raises `StageCancelled` before a point once
    `cancelled()` is true.
    """
    sweep = _Sweep()
    prompt_lens = list(prompt_lens)
    clock = budget.clock if budget is not None else time.perf_counter
    for index, prompt_len in enumerate(prompt_lens):
        curve_end = (
            budget.curve_end(len(prompt_lens) - index + curves_after)
            if budget is not None
            else None
        )
        for batch_size in options.batch_sizes():
            raise_if_cancelled(cancelled)
            stop_reason = error = out_of_time = None
            point: dict[str, Any] | None = None
            if budget is not None:
                predicted = budget.predict_s(dtype, prompt_len, batch_size)
                why = None
                if budget.spent():
                    why = f"the sweep's {budget.deadline - budget.started:,.0f} s are spent"
                elif (
                    predicted is not None
                    and curve_end is not None
                    and clock() + predicted > curve_end
                ):
                    why = (
                        f"the point's predicted {predicted:,.1f} s do not fit in the "
                        f"{max(0.0, curve_end - clock()):,.1f} s left to this curve"
                    )
                if why is not None:
                    sweep.stopped.append(budget.stop(dtype, prompt_len, batch_size, why))
                    if log:
                        log(f"{dtype} prompt {prompt_len}: stopped at batch {batch_size}: {why}")
                    if budget.spent():
                        sweep.out_of_time = True
                        return sweep
                    break
            began = clock()
            try:
                point = measure_point(
                    model,
                    batch_size=batch_size,
                    prompt_len=prompt_len,
                    vocab_size=vocab_size,
                    pad_token_id=pad_token_id,
                    device=device,
                    timer=timer,
                    memory=memory,
                    options=options,
                    deadline=budget.deadline if budget is not None else None,
                    clock=clock,
                )
            except Exception as exc:  # the model's own failure, OOM or not
                text = one_line(exc)
                if is_time_limit(exc):
                    # The deadline passed inside the point, or the task queue's own soft
                    # limit fired: the point is dropped and the sweep stops, keeping the rest.
                    out_of_time = (
                        f"the point was still running at the sweep's deadline, "
                        f"{clock() - began:,.1f} s in"
                        if isinstance(exc, TimeBudgetReached)
                        else f"the task's soft time limit fired ({text})"
                    )
                elif is_out_of_memory(exc):
                    stop_reason = f"out of memory ({text})"
                else:
                    error = text
            if out_of_time is not None:
                point = None
                free_memory(device)  # after the except block: the traceback is gone
                sweep.out_of_time = True
                sweep.stopped.append(
                    budget.stop(dtype, prompt_len, batch_size, out_of_time)
                    if budget is not None
                    else {
                        "dtype": dtype,
                        "prompt_len": prompt_len,
                        "batch_size": batch_size,
                        "cause": TIME_BUDGET,
                        "reason": f"stopped at batch {batch_size}: {TIME_BUDGET} ({out_of_time})",
                    }
                )
                if log:
                    log(
                        f"{dtype} prompt {prompt_len}: stopped at batch {batch_size}: {out_of_time}"
                    )
                return sweep
            if budget is not None and point is not None:
                budget.record(dtype, prompt_len, batch_size, clock() - began)
            if stop_reason is None and error is None and point is not None:
                limit = options.memory_limit_bytes
                peak = point["peak_memory_bytes"]
                if limit is not None and peak is not None and peak > limit:
                    stop_reason = (
                        f"out of memory (peak {peak:,} bytes of {point['memory_kind']} over the "
                        f"memory_limit_bytes ceiling of {limit:,})"
                    )
                    point = None
            if stop_reason is not None or error is not None:
                point = None
                free_memory(device)  # after the except block: the traceback is gone
            if error is not None:
                sweep.errors.append(
                    {
                        "dtype": dtype,
                        "prompt_len": prompt_len,
                        "batch_size": batch_size,
                        "error": error,
                    }
                )
                if log:
                    log(f"{dtype} prompt {prompt_len} batch {batch_size}: {error}")
                return sweep
            if stop_reason is not None:
                sweep.stopped.append(
                    {
                        "dtype": dtype,
                        "prompt_len": prompt_len,
                        "batch_size": batch_size,
                        "cause": "out of memory",
                        "reason": f"stopped at batch {batch_size}: {stop_reason}",
                    }
                )
                if log:
                    log(
                        f"{dtype} prompt {prompt_len}: stopped at batch {batch_size}: {stop_reason}"
                    )
                break
            assert point is not None
            sweep.points.append({"kind": "measured", "model": model_tag, "dtype": dtype} | point)
    return sweep


def roofline_figures(pool: Any, probe: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The device figures the twin's roofline uses (`plan.calibration.twin_calibration`): the
    catalog's datasheet figures when the pool's accelerator kind has them (float16 reads the
    dense BF16 figure: datasheets give one dense 16-bit figure), else `probe`'s measured
    ones; None without either."""
    from engine.catalog import CatalogError
    from engine.stages.plan.run import pool_catalog_for_stage

    kind = getattr(pool, "accelerator", "") or ""
    if kind and kind != "cpu":
        try:
            acc = pool_catalog_for_stage(pool).accelerator(kind)
        except (CatalogError, StageFailed):
            acc = None
        if acc is not None and acc.memory_bandwidth_bytes_per_s and acc.dense_bf16_flops:
            return {
                "kind": "datasheet",
                "name": acc.name,
                "memory_bandwidth_bytes_per_s": acc.memory_bandwidth_bytes_per_s,
                "flops": dict.fromkeys(CALIBRATED_DTYPES, acc.dense_bf16_flops),
                "memory_bytes": acc.memory_bytes,
                "source": (
                    f"catalog {kind}: {acc.sources.get('memory_bandwidth_bytes_per_s', '')}; "
                    f"{acc.sources.get('dense_bf16_flops', '')}"
                ),
            }
    if not probe or not probe.get("memory_bandwidth_bytes_per_s"):
        return None
    threads = probe.get("threads")
    busy = probe.get("host_busy") is True
    return {
        "kind": "measured",
        "name": f"{probe['device']} (pool {getattr(pool, 'name', '?')})",
        "memory_bandwidth_bytes_per_s": probe["memory_bandwidth_bytes_per_s"],
        "flops": dict(probe.get("flops") or {}),
        "memory_bytes": None,
        "source": (
            f"measured on {probe['device']}"
            + (f" with {fmt.counted(threads, 'torch thread')}" if threads else "")
            + (" on a busy host" if busy else "")
            + " by this run: STREAM triad and matmul probes (engine/device_probe.py)"
        ),
        "host_busy": busy,
    }


def calibrate(
    twin: Twin,
    pool: Any,
    device: torch.device,
    measured: Sequence[Mapping[str, Any]],
    options: PerformanceOptions,
    *,
    device_figures: Mapping[str, Any] | None = None,
    time_cap_s: float | None = None,
) -> dict[str, Any]:
    """The run's calibration (module docstring): {"device" (the probe's measured figures, or
    `device_figures` as given), **`plan.calibration.twin_calibration(...)`}. `device_figures`
    replaces the probe (a test seam, and a pool that measured them already); `time_cap_s`
    bounds the probe (what the stage's time budget leaves it)."""
    from engine.architecture import AnalysisError, analyze_config
    from engine.probe_repeats import probe_until_stable

    dtypes = ["bfloat16", *(p["dtype"] for p in measured if p["dtype"] in CALIBRATED_DTYPES)]
    if device_figures is not None:
        probe: dict[str, Any] | None = dict(device_figures)
    else:
        try:
            probe = probe_until_stable(device, dtypes, time_cap_s=time_cap_s)
        except Exception as exc:  # out of device memory, a backend without the kernels
            probe = None
            probe_error = f"the device probe failed: {one_line(exc)}"
            free_memory(device)
    figures = roofline_figures(pool, probe)
    if figures is None and probe is None:
        return {"device": None, "available": False, "reason": probe_error}
    if figures is None:
        return {"device": probe, "available": False, "reason": "no device figures"}
    try:
        analysis = analyze_config(twin.config.to_dict()).to_dict()
    except AnalysisError as exc:
        return {
            "device": probe,
            "available": False,
            "reason": f"the twin's config cannot be analysed: {exc}",
        }
    model = measured[0].get("model", "twin") if measured else "twin"
    result = twin_calibration(
        analysis, measured, figures, warmup=options.warmup, repeats=options.repeats, model=model
    )
    return {"device": probe} | result


def _run_dtypes(pool: Any, options: PerformanceOptions) -> tuple[str, ...]:
    if options.dtypes is not None:
        return options.dtypes
    return tuple(pool.dtypes) or ("float32",)


def _install(model: torch.nn.Module, hooks: Sequence[Callable[[torch.nn.Module], Any]]) -> list:
    handles = []
    for hook in hooks:
        handle = hook(model)
        handles.extend(handle if isinstance(handle, (list, tuple)) else [handle])
    return [h for h in handles if hasattr(h, "remove")]


def measure_performance(
    twin: Twin,
    pool: Any,
    *,
    options: PerformanceOptions | Mapping[str, Any] | None = None,
    plan: Mapping[str, Any] | None = None,
    hooks: Sequence[Callable[[torch.nn.Module], Any]] = (),
    log: Callable[[str], None] | None = None,
    device_figures: Mapping[str, Any] | None = None,
    cancelled: Callable[[], bool] = never_cancelled,
    budget: SweepBudget | None = None,
) -> dict[str, Any]:
    """The performance result for `twin` on `pool` (a PoolSpec or the same fields).

    Returns {"points": [measured points, then predicted ones], "knee_batch_size",
    "knee_tpot_s", "knee" ({"dtype", "prompt_len", "batch_size", "tpot_s", "tpot_p95_s",
    "decode_tokens_per_s", "found", "growth_at_knee", "reason"} or None), "knees" (the same
    for every measured dtype and prompt length), "knee_by_dtype" ({dtype: knee}),
    "knee_rule", "stopped" ([{"dtype", "prompt_len", "batch_size", "reason"}]), "errors"
    ([{"dtype", "prompt_len", "batch_size", "error"}]), "skipped_dtypes" ({dtype: reason}),
    "skipped_prompt_lens" ([{"prompt_len", "reason"}]), "predicted" (see `predicted_points`),
    "calibration" (see below), "device", "backend", "memory_kind", "memory_method", "timer",
    "threads", "units", "definitions", "options", "twin", "notes", "duration_s",
    "time_budget" (`budget.SweepBudget.summary`: "budget_s", "stopped" ("time budget" when
    the budget stopped the sweep, else None), "stopped_at", ...; "not_measured_dtypes")}.
    A stop entry has "cause": "out of memory" or "time budget".

    `budget` is the sweep's time budget (`engine/stages/performance/budget.py`); without one,
    `options.time_budget_s` from now. A sweep stopped by it keeps its points and succeeds.

    A measured point: {"kind": "measured", "model": "twin", "dtype", "batch_size",
    "prompt_len", "ttft_s", "ttft_p95_s", "tpot_s", "tpot_p95_s", "prefill_tokens_per_s",
    "decode_tokens_per_s", "peak_memory_bytes", "peak_memory_increase_bytes" (peak minus
    memory_before_bytes, >= 0), "memory_before_bytes" (in use as the point began),
    "memory_kind", "prefill_samples", "decode_samples"}; a predicted one has the
    keys of `predicted_points`.

    "calibration" = {"device" (`device_probe.probe_device`: measured memory bandwidth and
    FLOP/s; or `device_figures` where given, which skips the probe), and
    `plan.calibration.twin_calibration`'s keys: "available", "points" (the twin's predicted
    figures per measured 16-bit point with "decode_efficiency" and "prefill_efficiency"),
    "decode_efficiency_median", "prefill_efficiency_median", "by_dtype", "figures" (what the
    roofline used: "datasheet" or "measured"), "basis", "twin_shape", "skipped_dtypes",
    "definitions"}; {"available": False, "reason"} when nothing was measured.

    `hooks` are called with each dtype's model on the device before its sweep (a test seam:
    e.g. a forward hook that raises `torch.OutOfMemoryError`); what they return is removed
    after the sweep where it has `remove()`.

    Raises `StageFailed` when the device is absent, no dtype can run, no point was measured,
    or the twin raised something else than out of memory; `exc.result` holds this dict where
    it was built.
    """
    from engine.stages.precision.targets import make_target

    started = time.perf_counter()
    opts = (
        options
        if isinstance(options, PerformanceOptions)
        else PerformanceOptions.from_mapping(options)
    )
    if budget is None:
        budget = SweepBudget(opts.time_budget_s, started, source="time_budget_s option")
    device = resolve_device(pool.device, pool.name)
    opts = opts.for_device(device)
    timer, memory = StepTimer(device), MemoryProbe(device)
    config = twin.config
    positions = _max_positions(config)
    prompt_lens, skipped_lens = [], []
    for n in opts.prompt_lens:
        needed = n + opts.warmup + opts.repeats
        if positions is not None and needed > positions:
            skipped_lens.append(
                {
                    "prompt_len": n,
                    "reason": f"{needed} positions (prompt + decode steps) exceed the twin's "
                    f"max_position_embeddings of {positions}",
                }
            )
        else:
            prompt_lens.append(n)
    model_tag = "twin" if twin.description.get("weights_source") != "real" else "release"
    result: dict[str, Any] = {
        "points": [],
        "knee_batch_size": None,
        "knee_tpot_s": None,
        "knee": None,
        "knees": [],
        "knee_by_dtype": {},
        "knee_rule": KNEE_RULE.format(
            growth=opts.knee_growth, prompt_len=prompt_lens[0] if prompt_lens else "-"
        ),
        "stopped": [],
        "errors": [],
        "skipped_dtypes": {},
        "skipped_prompt_lens": skipped_lens,
        "predicted": {},
        "device": str(device),
        "backend": getattr(pool, "backend", device.type),
        "memory_kind": memory.kind,
        "memory_method": memory.method,
        "timer": timer.name,
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "units": dict(UNITS),
        "definitions": dict(DEFINITIONS),
        "options": opts.to_dict(),
        "twin": twin.description,
        "notes": [
            f"measured on the {model_tag}"
            + (
                f" ({twin.description.get('parameters', 0):,} parameters, seeded weights): "
                "speed and memory of the scaled twin, not of the full-size model"
                if model_tag == "twin"
                else " at full size with the release's real weights"
            )
        ],
    }
    vocab = int(config.vocab_size)
    pad = getattr(config, "pad_token_id", None)
    measured: list[dict[str, Any]] = []
    run_dtypes = _run_dtypes(pool, opts)
    out_of_time = soft_limit_fired = False
    not_measured: list[str] = []
    for number, dtype in enumerate(run_dtypes):
        if out_of_time:
            not_measured.append(dtype)
            continue
        target, skip, notes = make_target(twin, dtype, device)
        if target is None:
            result["skipped_dtypes"][dtype] = skip
            continue
        result["notes"].extend(f"{dtype}: {note}" for note in notes)
        handles = _install(target, hooks)
        try:
            sweep = sweep_dtype(
                target,
                dtype,
                prompt_lens=prompt_lens,
                vocab_size=vocab,
                pad_token_id=pad,
                device=device,
                timer=timer,
                memory=memory,
                options=opts,
                model_tag=model_tag,
                log=log,
                cancelled=cancelled,
                budget=budget,
                curves_after=(len(run_dtypes) - number - 1) * len(prompt_lens),
            )
        finally:
            for handle in handles:
                handle.remove()
            del target
            free_memory(device)
        measured.extend(sweep.points)
        result["stopped"].extend(sweep.stopped)
        result["errors"].extend(sweep.errors)
        out_of_time = sweep.out_of_time
        soft_limit_fired = soft_limit_fired or any(
            "soft time limit" in s["reason"] for s in sweep.stopped
        )
        if log:
            best = max(
                (p["decode_tokens_per_s"] or 0 for p in sweep.points),
                default=0.0,
            )
            log(
                f"{dtype}: {len(sweep.points)} points on {device}, best decode {best:,.0f} tokens/s"
            )
    for dtype in dict.fromkeys(p["dtype"] for p in measured):
        for prompt_len in prompt_lens:
            curve = [p for p in measured if p["dtype"] == dtype and p["prompt_len"] == prompt_len]
            knee = find_knee(curve, opts.knee_growth)
            if knee is None:
                continue
            entry = {"dtype": dtype, "prompt_len": prompt_len} | knee
            result["knees"].append(entry)
            result["knee_by_dtype"].setdefault(dtype, entry)
    if result["knee_by_dtype"]:
        first = next(iter(result["knee_by_dtype"].values()))
        result["knee"] = first
        result["knee_batch_size"] = first["batch_size"]
        result["knee_tpot_s"] = first["tpot_s"]
    predicted, info = predicted_points(plan)
    result["predicted"] = info
    result["points"] = measured + predicted
    probe_time_s = budget.end - budget.clock()
    if measured and device_figures is None and (soft_limit_fired or probe_time_s < 0.5):
        result["calibration"] = {
            "device": None,
            "available": False,
            "reason": "no time left in the stage's time budget for the device probe",
        }
    elif measured:
        result["calibration"] = calibrate(
            twin,
            pool,
            device,
            measured,
            opts,
            device_figures=device_figures,
            time_cap_s=probe_time_s if math.isfinite(probe_time_s) else None,
        )
        if log:
            cal = result["calibration"]
            log(
                "calibration: "
                + (
                    f"decode efficiency {cal['decode_efficiency_median']:.1%}, prefill "
                    f"{cal['prefill_efficiency_median'] or 0:.1%} of the roofline on "
                    f"{cal['figures']['kind']} figures (median over {len(cal['points'])} points)"
                    if cal.get("available")
                    else cal.get("reason", "none")
                )
            )
    else:
        result["calibration"] = {"available": False, "reason": "no point was measured"}
    result["time_budget"] = budget.summary() | {"not_measured_dtypes": not_measured}
    if budget.stopped_at is not None:
        at = budget.stopped_at
        result["notes"].append(
            f"the sweep stopped at {at['dtype']}, prompt {at['prompt_len']}, batch "
            f"{at['batch_size']} to stay within its time budget of {budget.budget_s:,.0f} s "
            f"({budget.source}); the points measured before are kept"
            + (f"; not measured: {', '.join(not_measured)}" if not_measured else "")
        )
    result["duration_s"] = time.perf_counter() - started
    failure = None
    if result["errors"]:
        failure = "; ".join(
            f"{e['dtype']} at prompt {e['prompt_len']}, batch {e['batch_size']}: the twin raised "
            f"{e['error']}"
            for e in result["errors"]
        )
    elif not measured:
        why = [r["reason"] for r in result["stopped"]]
        why += [f"{d} skipped: {r}" for d, r in result["skipped_dtypes"].items()]
        why += [f"prompt {s['prompt_len']} skipped: {s['reason']}" for s in skipped_lens]
        failure = "no point was measured: " + ("; ".join(why) or "nothing to measure")
    if failure is not None:
        raise StageFailed(failure, result=result)
    return result


def run(ctx: StageContext) -> dict[str, Any]:
    """Sweep the twin's prefill and decode on the pool's device (see the module docstring).

    Reads `ctx.previous["fetch"]["config"]`, the job's options (`ctx.options`, see
    `performance_options`) and the plan's predictions (`ctx.previous["plan"]`). Raises
    `StageFailed` for bad options, a release whose architecture needs its own modeling code
    (not run by this stage), and as `measure_performance` does.
    """
    from engine.remote_code import sandbox as remote_code

    started = time.perf_counter()
    try:
        options = PerformanceOptions.from_mapping(getattr(ctx, "options", None) or {})
    except ValueError as exc:
        raise StageFailed(f"performance options: {exc}") from exc
    soft_limit = getattr(ctx, "soft_time_limit_s", None)
    budget = (
        SweepBudget(float(soft_limit), started, source="the stage's soft time limit")
        if soft_limit
        else SweepBudget(options.time_budget_s, started, source="time_budget_s option")
    )
    config = remote_code.native_config(ctx, "performance")
    twin = build_twin(config)
    result = measure_performance(
        twin,
        ctx.pool,
        options=options,
        plan=ctx.previous.get("plan"),
        log=ctx.log,
        cancelled=ctx.cancelled,
        budget=budget,
    )
    if result["knee"] is not None:
        knee = result["knee"]
        ctx.log(
            f"recommended batch {knee['batch_size']} ({knee['dtype']}, prompt "
            f"{knee['prompt_len']}): TPOT {knee['tpot_s'] * 1e3:.2f} ms, "
            f"{knee['decode_tokens_per_s']:,.0f} tokens/s; {knee['reason']}"
        )
    return result
