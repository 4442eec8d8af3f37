"""The `stability` stage: the twin served back to back for a while, watched for leaks and drift.

The scaled twin (`engine.twin.build_twin`) runs on the pool's device in one serving
dtype (the `dtype` option, else the pool's first dtype the device runs: the precision stage's
`make_target` decides) for `duration_s` seconds (20 by default, for CI; hours on a real pool).
A step is one request of a fixed size: a prefill of
`batch_size` prompts of `prompt_len` tokens, then `decode_steps` greedy decode steps through a
fresh KV cache, which is dropped at the end of the step. So every step does the same work and
holds the same memory once it is over: what a step leaves behind is a leak.

How long it runs: `duration_s` is honoured. A step is begun while the duration lasts; past it
the loop runs on only to the fewest steps it needs: `min_steps` where the job asked for it,
else the verdict's floor of `MIN_JUDGED_STEPS` (10). A run that ends more than
`RAN_LONGER_TOLERANCE` (10%) past `duration_s` says why in `ran_longer_reason` (the steps
`min_steps` needed at the step time measured, or one step longer than what was left). The
stage's time budget (its soft time limit less 20%, `StageContext.soft_time_limit_s`) ends
the loop in any case, before Celery's limit can: `stopped_early` then reads "time budget",
and a run with fewer than `MIN_JUDGED_STEPS` steps is not judged.

After each step the stage samples the step's time (s, `twin.measure.StepTimer`: CUDA events
on GPUs, `time.perf_counter_ns` on the CPU) and the memory in use (bytes, `MemoryProbe`:
torch's `memory_allocated` on an accelerator, the process's resident set on the CPU after
handing the C heap's free memory back with glibc's `malloc_trim`), and counts the next-token
logit rows (one per sequence and forward) holding NaN or Inf. An exception in a step is
counted and the loop goes on; it stops after `max_errors` of them.

Verdicts (each threshold an option; the figures are reported whether they pass or not):

- memory leak: the least-squares slope of memory over step number (bytes/step,
  `statistics.linear_regression`), fitted after the warm-up (the first `warmup_fraction` of
  the steps, at least 5: allocator pools, oneDNN/cuBLAS workspaces and glibc's adaptive mmap
  threshold settle there). A leak needs BOTH a slope over `leak_bytes_per_step` AND a fitted
  growth (slope x steps fitted) over `leak_min_growth_bytes`: together, a slope over
  `leak_effective_bytes_per_step` = max(`leak_bytes_per_step`, `leak_min_growth_bytes` /
  steps fitted), which the result reports with both conditions in its reason (a slope over
  the first threshold alone is no leak on a short run). Default slope threshold: 0.1% of
  the model's weight bytes per 100 steps (1e-5 x weight bytes per step), at least 1 KiB per
  step: a process growing that fast doubles its weights' memory within 100,000 requests (a
  day at about one request a second), which is a leak to fix; below 1 KiB (a quarter of a
  4 KiB page) per step a slope is the resident set's page granularity and allocator noise.
  Default growth floor: 4 MiB, about 40 times what the C heap and torch's CPU allocator moved
  after the warm-up in clean 20 s runs (fitted growth 38 KiB and 95 KiB on the Llama-3.1-8B
  and DeepSeek-V3 twins, one thread), so a short run's noise cannot trip it. The floor sets
  what a run can see: the default 20 s (100 to 270 steps of the default size on one quiet
  CPU thread) catches leaks of about 15 to 40 KiB per step and more (a hook keeping one
  layer's hidden states leaks 80 KiB); a run of hours on a pool catches 1 KiB per step, where
  the slope threshold binds. On an accelerator `memory_allocated` counts live tensors exactly, so
  a pool may lower the floor.
- NaN/Inf: more than `max_nonfinite_outputs` (0) non-finite next-token logit rows.
- exceptions: any step raised (`errors` > 0).
- step-time drift: median step time of the last quarter of the steps after the warm-up over
  the median of the first quarter, minus 1, over `max_step_time_drift` (0.5: 50% slower).
  Medians of quarters keep a few stalled steps from counting; a sustained slowdown (a cache or
  a list growing with every request, fragmentation) shows. On an accelerator the step time is
  the timer's (CUDA events); on the CPU the verdict reads the process's CPU time per step
  (`time.process_time_ns`), since the wall time of a shared CPU host follows its neighbours'
  load (measured: -36% wall against -12% CPU-time drift on one twin while three test suites
  started and stopped beside it); the wall-time drift is reported too (`wall_time_drift`).

A crossed threshold fails the stage with `StageFailed(reason, result=...)` naming it.
`hooks` (`measure_stability`) install code on the model before the run: the test seam for a
deliberate leak (a forward hook that keeps its outputs), NaN or exception.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from engine.contract import StageContext, StageFailed, never_cancelled, raise_if_cancelled
from engine.stages.stability.options import (
    DEFAULT_DURATION_S,
    MIN_JUDGED_STEPS,
    MIN_WARMUP_STEPS,
    stability_options,
)
from engine.stages.stability.result import (
    DRIFT,
    EXCEPTIONS,
    LEAK,
    NONFINITE,
    TOO_FEW_STEPS,
    StabilityResult,
    StabilitySample,
    StabilityThresholds,
    StabilityWorkload,
)
from engine.stored import INFRASTRUCTURE, StageFailure
from engine.twin import Twin, build_twin
from engine.twin.measure import (
    MemoryProbe,
    StepTimer,
    decode_step,
    forward_kwargs,
    free_memory,
    model_bytes,
    one_line,
    p95,
    prefill_step,
    random_prompt,
)
from engine.twin.run import resolve_device

DEFAULT_BATCH_SIZE = 4
DEFAULT_PROMPT_LEN = 64
DEFAULT_DECODE_STEPS = 16
# No default `min_steps` past the duration: the verdict's floor (MIN_JUDGED_STEPS) applies.
DEFAULT_MIN_STEPS = None
# A run may end this fraction past `duration_s` (its last step) without a reason.
RAN_LONGER_TOLERANCE = 0.10
# The share of the stage's soft time limit the loop may run to (the rest: set-up, judging).
TIME_BUDGET_SHARE = 0.80
TIME_BUDGET = "time budget"
DEFAULT_WARMUP_FRACTION = 0.1
# The leak thresholds (module docstring): slope >= max(1 KiB, 1e-5 x weight bytes) per step
# and fitted growth >= 4 MiB.
LEAK_WEIGHT_FRACTION_PER_STEP = 1e-5
LEAK_MIN_BYTES_PER_STEP = 1024
DEFAULT_LEAK_MIN_GROWTH_BYTES = 4 * 2**20
DEFAULT_MAX_STEP_TIME_DRIFT = 0.5
DEFAULT_MAX_ERRORS = 3
DEFAULT_MAX_NONFINITE_OUTPUTS = 0
# Samples returned for charts (evenly spaced over the run).
MAX_SAMPLES = 200


@dataclass(frozen=True)
class StabilityOptions:
    """The run's settings (see `stability_options`). `leak_bytes_per_step` None: derived from
    the model's weight bytes (`leak_threshold_bytes_per_step`)."""

    duration_s: float = DEFAULT_DURATION_S
    batch_size: int = DEFAULT_BATCH_SIZE
    prompt_len: int = DEFAULT_PROMPT_LEN
    decode_steps: int = DEFAULT_DECODE_STEPS
    dtype: str | None = None
    min_steps: int | None = DEFAULT_MIN_STEPS
    warmup_fraction: float = DEFAULT_WARMUP_FRACTION
    leak_bytes_per_step: float | None = None
    leak_min_growth_bytes: int = DEFAULT_LEAK_MIN_GROWTH_BYTES
    max_step_time_drift: float = DEFAULT_MAX_STEP_TIME_DRIFT
    max_errors: int = DEFAULT_MAX_ERRORS
    max_nonfinite_outputs: int = DEFAULT_MAX_NONFINITE_OUTPUTS
    seed: int = 0

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> StabilityOptions:
        """Options from a job's mapping, defaults for what it leaves out. Raises `ValueError`."""
        return cls(**stability_options(options))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def leak_threshold_bytes_per_step(weight_bytes: int) -> float:
    """The default leak slope threshold: 0.1% of the weights per 100 steps, at least 1 KiB."""
    return max(float(LEAK_MIN_BYTES_PER_STEP), LEAK_WEIGHT_FRACTION_PER_STEP * weight_bytes)


def _request(
    model: torch.nn.Module,
    ids: torch.Tensor,
    decode_steps: int,
    extra: dict[str, Any],
) -> torch.Tensor:
    """One step: prefill `ids`, `decode_steps` greedy decode steps; the count of next-token
    logit rows holding NaN/Inf (a 0-dim tensor on the device). The cache dies with the call."""
    cache, logits = prefill_step(model, ids, extra)
    bad = (~torch.isfinite(logits)).any(dim=-1).sum()
    for _ in range(decode_steps):
        cache, logits = decode_step(model, logits.argmax(-1), cache)
        bad = bad + (~torch.isfinite(logits)).any(dim=-1).sum()
    return bad


@dataclass
class Series:
    """What the loop saw: per completed step its number (counting failed ones), time (s) and
    memory after it (bytes, None where unreadable)."""

    steps: list[int]
    elapsed_s: list[float]  # seconds from the loop's start to the end of each step
    step_times_s: list[float]
    cpu_times_s: list[float]
    memory_bytes: list[int | None]
    nonfinite_outputs: int
    errors: int
    error_messages: list[str]
    duration_s: float
    stopped_early: str | None
    # Steps begun once `duration_s` had passed (to reach the fewest steps needed), and the
    # fewest steps the loop ran to (`min_steps`, else MIN_JUDGED_STEPS).
    steps_past_duration: int = 0
    fewest_steps: int = MIN_JUDGED_STEPS
    completed_at_duration: int | None = None


def fewest_steps(options: StabilityOptions) -> int:
    """The steps the loop runs to even past `duration_s`: `min_steps` where asked, else the
    verdict's floor MIN_JUDGED_STEPS."""
    return options.min_steps if options.min_steps is not None else MIN_JUDGED_STEPS


@torch.no_grad()
def stability_loop(
    model: torch.nn.Module,
    *,
    device: torch.device,
    vocab_size: int,
    pad_token_id: int | None,
    options: StabilityOptions,
    timer: StepTimer,
    memory: MemoryProbe,
    cancelled: Callable[[], bool] = never_cancelled,
    budget_end: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Series:
    """Run steps on `model` (on `device`) for `options.duration_s`, and past it only to
    `fewest_steps(options)` steps, sampling each (see the module docstring). Exceptions in a
    step are counted, not raised; the loop stops after `options.max_errors` of them, and at
    `budget_end` (a `clock` time: the stage's time budget) whatever the count
    (`stopped_early` "time budget"). Raises `StageCancelled` before a step once `cancelled()`
    is true."""
    ids = random_prompt(
        vocab_size,
        options.batch_size,
        options.prompt_len,
        seed=options.seed,
        pad_token_id=pad_token_id,
    ).to(device)
    extra = forward_kwargs(model)
    steps: list[int] = []
    times: list[float] = []
    elapsed: list[float] = []
    cpu_times: list[float] = []
    mems: list[int | None] = []
    nonfinite = errors = 0
    messages: list[str] = []
    stopped = None
    started = clock()
    deadline = started + options.duration_s
    fewest = fewest_steps(options)
    step = past = 0
    at_duration = None
    while True:
        now = clock()
        if now >= deadline and at_duration is None:
            at_duration = len(steps)
        if now >= deadline and len(steps) >= fewest:
            break
        if budget_end is not None and now >= budget_end:
            stopped = TIME_BUDGET
            break
        if now >= deadline:
            past += 1
        raise_if_cancelled(cancelled)
        failure = None
        try:
            cpu_start = time.process_time_ns()
            bad, seconds = timer.time(
                functools.partial(_request, model, ids, options.decode_steps, extra)
            )
            cpu_seconds = (time.process_time_ns() - cpu_start) / 1e9
            nonfinite += int(bad)
        except Exception as exc:  # the model's own failure: counted, the loop goes on
            failure = one_line(exc)
        step += 1
        if failure is not None:
            errors += 1
            if len(messages) < options.max_errors:
                messages.append(f"step {step}: {failure}")
            free_memory(device)
            if errors >= options.max_errors:
                stopped = f"stopped after {errors} exceptions"
                break
            continue
        steps.append(step)
        elapsed.append(clock() - started)
        times.append(seconds)
        cpu_times.append(cpu_seconds)
        mems.append(memory.current_bytes(trim=True))
    return Series(
        steps=steps,
        elapsed_s=elapsed,
        step_times_s=times,
        cpu_times_s=cpu_times,
        memory_bytes=mems,
        nonfinite_outputs=nonfinite,
        errors=errors,
        error_messages=messages,
        duration_s=clock() - started,
        stopped_early=stopped,
        steps_past_duration=past,
        fewest_steps=fewest,
        completed_at_duration=at_duration,
    )


def ran_longer_reason(series: Series, options: StabilityOptions) -> str | None:
    """Why the run took more than `duration_s` (by over `RAN_LONGER_TOLERANCE`), or None."""
    asked = options.duration_s
    if series.duration_s <= asked * (1 + RAN_LONGER_TOLERANCE):
        return None
    step_s = statistics.median(series.step_times_s) if series.step_times_s else None
    per_step = f" at a median {step_s:,.2f} s per step" if step_s is not None else ""
    if series.steps_past_duration:
        needed = (
            f"min_steps {options.min_steps}"
            if options.min_steps is not None
            else f"the verdict's floor of {series.fewest_steps} steps (MIN_JUDGED_STEPS)"
        )
        return (
            f"ran {series.duration_s:,.1f} s, past duration_s {asked:g} s: "
            f"{series.completed_at_duration or 0} steps had completed when it was reached, "
            f"and {needed} asked for {series.steps_past_duration} more{per_step}"
        )
    return (
        f"ran {series.duration_s:,.1f} s, past duration_s {asked:g} s: the last step, begun "
        f"before the duration was over, ran past it{per_step}"
    )


def _quarter_medians(times: Sequence[float]) -> tuple[float | None, float | None]:
    quarter = len(times) // 4
    if quarter < 1:
        return None, None
    return statistics.median(times[:quarter]), statistics.median(times[-quarter:])


def _samples(series: Series) -> tuple[StabilitySample, ...]:
    n = len(series.steps)
    stride = max(1, math.ceil(n / MAX_SAMPLES))
    picks = list(range(0, n, stride))
    if n and picks[-1] != n - 1:
        picks.append(n - 1)
    return tuple(
        StabilitySample(
            step=series.steps[i],
            elapsed_s=series.elapsed_s[i],
            memory_bytes=series.memory_bytes[i],
            step_time_s=series.step_times_s[i],
            cpu_time_s=series.cpu_times_s[i],
        )
        for i in picks
    )


def judge(
    series: Series, options: StabilityOptions, *, weight_bytes: int, on_cpu: bool
) -> dict[str, Any]:
    """The figures and verdicts of a run as stored (`judged_run`'s, as a dict)."""
    return judged_run(series, options, weight_bytes=weight_bytes, on_cpu=on_cpu).to_dict()


def judged_run(
    series: Series, options: StabilityOptions, *, weight_bytes: int, on_cpu: bool
) -> StabilityResult:
    """The figures and verdicts of a run (the result less the workload and how it was
    measured, which `measure_stability` adds). `on_cpu`: the drift is judged on the steps'
    process CPU time (see the module docstring)."""
    n = len(series.steps)
    warmup = min(max(MIN_WARMUP_STEPS, math.ceil(options.warmup_fraction * n)), n // 2)
    fit_steps = series.steps[warmup:]
    fit_mems = series.memory_bytes[warmup:]
    pairs = [(s, m) for s, m in zip(fit_steps, fit_mems, strict=True) if m is not None]
    slope = growth = None
    if len(pairs) >= 3 and len({s for s, _ in pairs}) >= 2:
        fit = statistics.linear_regression([s for s, _ in pairs], [m for _, m in pairs])
        slope = fit.slope
        growth = slope * (pairs[-1][0] - pairs[0][0])
    wall_first, wall_last = _quarter_medians(series.step_times_s[warmup:])
    wall_drift = wall_last / wall_first - 1 if wall_first and wall_last is not None else None
    if on_cpu:
        first_q, last_q = _quarter_medians(series.cpu_times_s[warmup:])
        drift = last_q / first_q - 1 if first_q and last_q is not None else None
        basis = "process CPU time per step (time.process_time_ns)"
    else:
        first_q, last_q, drift = wall_first, wall_last, wall_drift
        basis = "device time per step (the timer's)"
    leak_limit = (
        options.leak_bytes_per_step
        if options.leak_bytes_per_step is not None
        else leak_threshold_bytes_per_step(weight_bytes)
    )
    # Both leak conditions as one slope: over the steps fitted, growth > floor is
    # slope > floor / steps, so a leak is a slope over the larger of the two.
    fitted_steps = pairs[-1][0] - pairs[0][0] if slope is not None else None
    effective_limit = (
        max(leak_limit, options.leak_min_growth_bytes / fitted_steps) if fitted_steps else None
    )
    leak_rule = (
        f"a leak needs a slope over {leak_limit:,.0f} bytes/step AND fitted growth over "
        f"{options.leak_min_growth_bytes:,} bytes"
        + (
            f" (over the {fitted_steps:,} steps fitted: a slope over {effective_limit:,.0f} "
            "bytes/step)"
            if effective_limit is not None
            else ""
        )
    )
    limits = StabilityThresholds(
        leak_bytes_per_step=leak_limit,
        leak_min_growth_bytes=options.leak_min_growth_bytes,
        leak_effective_bytes_per_step=effective_limit,
        max_step_time_drift=options.max_step_time_drift,
        max_errors=options.max_errors,
        max_nonfinite_outputs=options.max_nonfinite_outputs,
    )
    reasons = []
    if limits.leaks(slope, growth):
        reasons.append(
            f"{LEAK}: memory grew {slope:,.0f} bytes/step over steps "
            f"{pairs[0][0]}-{pairs[-1][0]} ({growth:,.0f} bytes fitted); {leak_rule}"
        )
    if limits.nonfinite_over(series.nonfinite_outputs):
        reasons.append(
            f"{NONFINITE}: {series.nonfinite_outputs} next-token logit rows held NaN or Inf "
            f"(threshold {options.max_nonfinite_outputs})"
        )
    if series.errors:
        reasons.append(
            f"{EXCEPTIONS}: {series.errors} steps raised (first: {series.error_messages[0]})"
            + (f"; {series.stopped_early}" if series.stopped_early else "")
        )
    if limits.drifts(drift):
        reasons.append(
            f"{DRIFT}: the median step ({basis}) of the last quarter ({last_q:.4f} s) is "
            f"{drift:+.0%} on the first quarter's ({first_q:.4f} s), over the threshold of "
            f"{options.max_step_time_drift:+.0%}"
        )
    if n < MIN_JUDGED_STEPS and not series.errors:
        reasons.append(
            f"{TOO_FEW_STEPS}: {n} completed (at least {MIN_JUDGED_STEPS} needed)"
            + (
                "; the stage's time budget ended the run"
                if series.stopped_early == TIME_BUDGET
                else ""
            )
        )
    known = [m for m in series.memory_bytes if m is not None]
    # Cut short by the stage's time budget with nothing else wrong: the host was too slow for
    # a verdict, not the release unstable (workers/failures.py reads `failure.culprit`).
    too_few_only = len(reasons) == 1 and n < MIN_JUDGED_STEPS and not series.errors
    budget_cut = too_few_only and series.stopped_early == TIME_BUDGET
    return StabilityResult(
        failure=(
            StageFailure(
                phase="",
                reason="time budget ended the run before a verdict",
                culprit=INFRASTRUCTURE,
            )
            if budget_cut
            else None
        ),
        duration_s=series.duration_s,
        duration_asked_s=options.duration_s,
        ran_longer_reason=ran_longer_reason(series, options),
        steps_past_duration=series.steps_past_duration,
        steps=n,
        memory_slope_bytes_per_step=slope,
        nonfinite_outputs=series.nonfinite_outputs,
        errors=series.errors,
        step_time_drift=drift,
        step_time_drift_basis=basis,
        wall_time_drift=wall_drift,
        passed=not reasons,
        reason=(
            "; ".join(reasons)
            if reasons
            else "within every threshold"
            + (f" (memory slope {slope:,.0f} bytes/step: {leak_rule})" if slope is not None else "")
        ),
        reasons=tuple(reasons),
        memory_growth_bytes=growth,
        leak_effective_bytes_per_step=effective_limit,
        memory_start_bytes=known[0] if known else None,
        memory_end_bytes=known[-1] if known else None,
        memory_max_bytes=max(known) if known else None,
        step_time_median_s=statistics.median(series.step_times_s) if n else None,
        step_time_p95_s=p95(series.step_times_s) if n else None,
        step_time_first_quarter_s=first_q,
        step_time_last_quarter_s=last_q,
        cpu_time_median_s=statistics.median(series.cpu_times_s) if n else None,
        warmup_steps=warmup,
        error_messages=tuple(series.error_messages),
        stopped_early=series.stopped_early,
        stopped=TIME_BUDGET if series.stopped_early == TIME_BUDGET else None,
        thresholds=limits,
        samples=_samples(series),
    )


def _choose_dtype(twin: Twin, pool: Any, device: torch.device, options: StabilityOptions):
    """(dtype, model on the device, notes, skipped {dtype: reason}) for the run."""
    from engine.stages.precision.targets import make_target

    wanted = (options.dtype,) if options.dtype else (tuple(pool.dtypes) or ("float32",))
    skipped: dict[str, str] = {}
    for dtype in wanted:
        target, why, notes = make_target(twin, dtype, device)
        if target is not None:
            return dtype, target, notes, skipped
        skipped[dtype] = why
    reasons = "; ".join(f"{d}: {why}" for d, why in skipped.items())
    raise StageFailed(f"no serving dtype of pool {pool.name} runs on {device}: {reasons}")


def measure_stability(
    twin: Twin,
    pool: Any,
    *,
    options: StabilityOptions | Mapping[str, Any] | None = None,
    hooks: Sequence[Callable[[torch.nn.Module], Any]] = (),
    cancelled: Callable[[], bool] = never_cancelled,
    budget_end: float | None = None,
) -> dict[str, Any]:
    """The stability result for `twin` on `pool` (a PoolSpec or the same fields); stops with
    `StageCancelled` once `cancelled()` is true.

    Returns {"duration_s" (s, the loop's wall time), "duration_asked_s" (the option),
    "ran_longer_reason" (why the run took more than 10% over duration_s; None when it did
    not), "steps_past_duration" (steps begun after it), "stopped" ("time budget" when the
    stage's budget, `budget_end` on time.perf_counter, ended the loop; else None), "steps"
    (completed steps),
    "memory_slope_bytes_per_step" (None when too few samples), "nonfinite_outputs",
    "errors" (steps that raised), "step_time_drift" (fraction; None when too few steps),
    "passed", "reason", "reasons", "memory_growth_bytes", "leak_effective_bytes_per_step"
    (the slope a leak must exceed on this run, both leak conditions together; None when too
    few samples), "memory_start_bytes",
    "memory_end_bytes", "memory_max_bytes", "step_time_median_s", "step_time_p95_s",
    "step_time_first_quarter_s", "step_time_last_quarter_s", "warmup_steps",
    "error_messages", "stopped_early", "thresholds", "samples" ([{"step", "elapsed_s" (s since
    the start), "memory_bytes", "step_time_s"}], at most 200), "workload" ({"dtype", "device",
    "batch_size", "prompt_len", "decode_steps", "tokens_per_step", "weight_bytes"}),
    "skipped_dtypes", "memory_kind", "memory_method", "timer", "threads", "options", "twin",
    "notes"}.

    `hooks` are called with the model on the device before the run (what they return is
    removed after it where it has `remove()`): the seam for a deliberate leak, NaN or
    exception.

    Raises `StageFailed` (with `.result` where the run happened) when the device is absent, no
    dtype runs, or a threshold is crossed (the reason names it).
    """
    opts = (
        options if isinstance(options, StabilityOptions) else StabilityOptions.from_mapping(options)
    )
    device = resolve_device(pool.device, pool.name)
    dtype, model, notes, skipped = _choose_dtype(twin, pool, device, opts)
    timer, memory = StepTimer(device), MemoryProbe(device)
    weight_bytes = model_bytes(model)
    handles = []
    try:
        for hook in hooks:
            handle = hook(model)
            handles.extend(handle if isinstance(handle, (list, tuple)) else [handle])
        series = stability_loop(
            model,
            device=device,
            vocab_size=int(twin.config.vocab_size),
            pad_token_id=getattr(twin.config, "pad_token_id", None),
            options=opts,
            timer=timer,
            memory=memory,
            cancelled=cancelled,
            budget_end=budget_end,
        )
    finally:
        for handle in handles:
            if hasattr(handle, "remove"):
                handle.remove()
        del model
        free_memory(device)
    judged = replace(
        judged_run(series, opts, weight_bytes=weight_bytes, on_cpu=device.type == "cpu"),
        workload=StabilityWorkload(
            dtype=dtype,
            device=str(device),
            batch_size=opts.batch_size,
            prompt_len=opts.prompt_len,
            decode_steps=opts.decode_steps,
            tokens_per_step=opts.batch_size * (opts.prompt_len + opts.decode_steps),
            weight_bytes=weight_bytes,
        ),
        skipped_dtypes=skipped,
        memory_kind=memory.kind,
        memory_method=memory.method,
        timer=timer.name,
        threads=torch.get_num_threads() if device.type == "cpu" else None,
        options=opts.to_dict(),
        twin=twin.description,
        notes=(
            "run on the scaled twin (seeded weights): memory and step-time figures are "
            "the twin's, not the full-size model's",
            *notes,
        ),
    )
    result = judged.to_dict()
    if not judged.passed:
        raise StageFailed(judged.reason, result=result)
    return result


def run(ctx: StageContext) -> dict[str, Any]:
    """Serve the twin back to back on the pool's device and judge it (module docstring).

    Reads `ctx.previous["fetch"]["config"]` and the job's options (`ctx.options`, see
    `stability_options`). Raises `StageFailed` for bad options, a release whose architecture
    needs its own modeling code (not run by this stage), and as `measure_stability` does.
    """
    from engine.remote_code import sandbox as remote_code

    started = time.perf_counter()
    try:
        options = StabilityOptions.from_mapping(getattr(ctx, "options", None) or {})
    except ValueError as exc:
        raise StageFailed(f"stability options: {exc}") from exc
    soft_limit = getattr(ctx, "soft_time_limit_s", None)
    config = remote_code.native_config(ctx, "stability")
    result = measure_stability(
        build_twin(config),
        ctx.pool,
        options=options,
        cancelled=ctx.cancelled,
        budget_end=started + TIME_BUDGET_SHARE * soft_limit if soft_limit else None,
    )
    if result["ran_longer_reason"]:
        ctx.log(result["ran_longer_reason"])
    slope = result["memory_slope_bytes_per_step"]
    drift = result["step_time_drift"]
    ctx.log(
        f"{result['steps']} steps in {result['duration_s']:.1f} s on "
        f"{result['workload']['device']} ({result['workload']['dtype']}): memory slope "
        f"{slope if slope is None else f'{slope:,.0f}'} bytes/step, step-time drift "
        f"{drift if drift is None else f'{drift:+.1%}'}, {result['nonfinite_outputs']} NaN/Inf "
        f"rows, {result['errors']} exceptions: {result['reason']}"
    )
    return result
