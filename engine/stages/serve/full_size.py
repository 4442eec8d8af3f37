"""The serve stage's full-size run: the plan's own command at full size with dummy weights.

A serving engine initialises random weights from the config alone (`--load-format dummy`):
the same kernels, shapes, memory and scheduling as the real checkpoint, and no weights
downloaded. Where the plan fits the pool, the stage launches the plan's command on a folder
holding only the release's `config.json` and the tokenizer files the fetch stage kept
(`checkpoint.full_size_folder`), and sweeps the workloads of `full_size_settings` with vLLM's
own benchmark module (`sweep.run_sweep`): the primary one, then the prefill-heavy and
decode-heavy pairs on the same engine, then the primary one again at each smaller TP degree
that fits (a launch each), so the scaling curve is measured at full size. The engine's
/metrics are scraped during the sweeps of the plan's TP.

Dummy weights say nothing about precision: the twin (or the real weights) keeps that. The run
never fails the stage: its `status` ("measured", "skipped", "failed") and `reason` say what
happened, and what it measured before a failure or the end of its time budget stays.

The result (`full_size` in the serve result; docs/stages/serve.md, "Full size"):

    {"status", "reason", "load_format": "dummy", "launched_command", "command_diff",
     "load_s", "tp", "dtype", "peak_memory_bytes", "max_model_len", "engine_kv_cache_tokens",
     "kv_cache_space_gib", "sweep_settings": {"input_tokens", "output_tokens",
     "concurrency", "requests_per_level", "time_budget_s", "load_generator"},
     "sweep": [points], "stopped", "workloads": [{"label", "input_tokens", "output_tokens",
     "sweep", "stopped"}], "tp_scaling": [{"tp", "load_s", "launched_command", "sweep",
     "stopped", "engine_kv_cache_tokens", "peak_memory_bytes"}], "tp_skipped", "scaling",
     "engine_metrics", "model", "duration_s"}

`reason` is a code: for "skipped", "not_launched", "disabled", "plan_does_not_fit",
"no_config", "no_tokenizer", "too_few_devices", "size_unknown", "over_weight_cap",
"no_valid_tp", "twin_failed_checks"; for "failed", "engine_refused", "bad_command",
"no_level_finished". `stopped`: None, "time budget" or "error: <the sweep's reason>".
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.contract import StageContext, raise_if_cancelled
from engine.stored import as_mapping

from . import degrees
from .command import (
    CommandError,
    Launch,
    devices_needed,
    launch_command,
    serving_dtype,
    tensor_parallel,
)
from .engine_log import excerpt, kv_cache_tokens, refusal_reason
from .full_size_degrees import scaling, tp_degrees
from .full_size_settings import LOAD_FORMAT, FullSizeSettings, Workload
from .launching import start_engine
from .options import DEFAULT_MEMORY_FRACTION
from .process import EngineProcess, EngineRefused
from .verdict import refusal_culprit

# Bytes of a weight in the dtype the engine computes in.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
# A sweep given fewer seconds than this is not started (a level of a full-size model takes
# longer on any pool than a bench child's start).
MIN_SWEEP_S = 30.0
# The KV cache a cpu pool's full-size launch gets holds one sequence of the launch's context
# with this much room (vLLM refuses to start when one sequence does not fit).
KV_CACHE_ROOM = 1.1
GIB = 2**30
TIME_BUDGET = "time budget"
SKIP_REASONS = (
    "not_launched",
    "disabled",
    "plan_does_not_fit",
    "no_config",
    "no_tokenizer",
    "too_few_devices",
    "size_unknown",
    "over_weight_cap",
    "no_valid_tp",
    "twin_failed_checks",
)


def skipped(reason: str, **figures: Any) -> dict[str, Any]:
    """A full-size result that did not launch: `reason` one of `SKIP_REASONS`, with the
    figures that decided it (`devices_needed`, `weight_bytes`, ...)."""
    if reason not in SKIP_REASONS:
        raise ValueError(f"unknown full-size skip reason {reason!r}")
    return {"status": "skipped", "reason": reason, "load_format": LOAD_FORMAT, **figures}


FAIL_REASONS = ("engine_refused", "bad_command", "no_level_finished")


def failed(reason: str, **figures: Any) -> dict[str, Any]:
    """A full-size result that could not measure: `reason` one of `FAIL_REASONS`."""
    if reason not in FAIL_REASONS:
        raise ValueError(f"unknown full-size failure reason {reason!r}")
    return {"status": "failed", "reason": reason, "load_format": LOAD_FORMAT, **figures}


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _analysis(ctx: StageContext, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The analyze stage's result, else the config analysed now; None when it cannot be."""
    analysis = ctx.previous.get("analyze")
    if isinstance(analysis, Mapping) and _count(analysis.get("total_params")):
        return dict(analysis)
    from engine.architecture import AnalysisError, analyze_config

    try:
        return analyze_config(dict(config)).to_dict()
    except (AnalysisError, ValueError, TypeError):
        return None


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The decoder's own keys: a multimodal config keeps them under `text_config`."""
    inner = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(inner, Mapping):
        return inner
    return config


def served_model(config: Mapping[str, Any], analysis: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the full-size run serves, from the config (and its analysis): `architecture`,
    `num_hidden_layers`, `hidden_size`, `num_attention_heads`, `num_key_value_heads`,
    `vocab_size`, `parameters` (the analysis's `total_params`) and `kv_cache_bytes_per_token`
    (bytes, bf16 K/V over every layer that keeps them)."""
    text = _text_config(config)
    names = config.get("architectures")
    analysis = analysis or {}
    return {
        "architecture": str(names[0]) if isinstance(names, list) and names else "",
        "num_hidden_layers": _count(text.get("num_hidden_layers")),
        "hidden_size": _count(text.get("hidden_size")),
        "num_attention_heads": _count(text.get("num_attention_heads")),
        "num_key_value_heads": _count(
            text.get("num_key_value_heads", text.get("num_attention_heads"))
        ),
        "vocab_size": _count(text.get("vocab_size")),
        "parameters": _count(analysis.get("total_params")),
        "kv_cache_bytes_per_token": _count(analysis.get("kv_cache_bytes_per_token")),
    }


def _kv_space_gib(
    engine: Mapping[str, Any], bytes_per_token: int | None, context: int | None
) -> float | None:
    """A cpu pool's `VLLM_CPU_KVCACHE_SPACE` (GiB) for the full-size launch: the pool's, or
    enough for one sequence of the launch's context with `KV_CACHE_ROOM`, whichever is more.
    None when either figure is unknown (the pool's setting stays)."""
    if not bytes_per_token or not context:
        return None
    env = as_mapping(engine.get("env"))
    try:
        pool_gib = float(env.get("VLLM_CPU_KVCACHE_SPACE") or degrees.DEFAULT_CPU_KVCACHE_GIB)
    except ValueError:
        pool_gib = float(degrees.DEFAULT_CPU_KVCACHE_GIB)
    needed = math.ceil(bytes_per_token * context * KV_CACHE_ROOM / GIB)
    return max(pool_gib, float(needed))


def _served_max_model_len(process: EngineProcess, served: str) -> int | None:
    """The `max_model_len` the engine reports for the served model on /v1/models."""
    import httpx

    with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError, TypeError):
        answer = httpx.get(f"{process.base_url}/v1/models", timeout=10)
        for entry in answer.json().get("data", []):
            if entry.get("id") == served:
                return _count(entry.get("max_model_len"))
    return None


# The engine's figures kept per level, from the scrapes during it: point key -> scrape key.
LEVEL_PEAKS = {
    "kv_cache_usage_peak": "kv_cache_usage",
    "running_peak": "running",
    "waiting_peak": "waiting",
}


def _peaks(series: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The largest KV cache usage (0 to 1), running and waiting requests of a scrape series."""
    peaks: dict[str, Any] = {}
    for key in ("kv_cache_usage", "running", "waiting"):
        values = [s[key] for s in series if isinstance(s.get(key), int | float)]
        peaks[key] = max(values) if values else None
    return peaks


def mark_level_peaks(
    points: Sequence[dict[str, Any]],
    ends: Sequence[float],
    began: float,
    series: Sequence[Mapping[str, Any]],
) -> None:
    """Add to each point the engine's peaks during its level (`LEVEL_PEAKS`: KV cache usage
    0 to 1, running and waiting requests): the scrapes after the level before it ended (or
    after `began`) up to its own end, `ends` being when each level's line arrived on the
    series' clock (s). None where no scrape fell inside (a level shorter than the interval)."""
    start = began
    for point, end in zip(points, ends, strict=False):
        window = [s for s in series if start < float(s.get("t_s") or 0.0) <= end]
        peaks = _peaks(window)
        for key, source in LEVEL_PEAKS.items():
            point[key] = peaks[source]
        start = end


class _Budget:
    """The full-size run's clock: seconds left until its deadline."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def left(self) -> float:
        return self.deadline - time.monotonic()


def run_full_size(
    ctx: StageContext,
    *,
    engine: Mapping[str, Any],
    planned: str,
    settings: FullSizeSettings,
    python: str,
    version: str,
    processes: list[EngineProcess],
    deadline: float,
) -> dict[str, Any]:
    """The full-size run (see the module docstring) until `deadline` (time.monotonic()).

    Every engine it launches is appended to `processes` (the stage stops them all in its
    `finally`) and stopped here once swept. Raises only `StageCancelled` (the job was
    cancelled) and what the stage's soft time limit raises."""
    kind = engine["kind"]
    if not settings.enabled:
        return skipped("disabled", by=settings.disabled_by)
    plan = as_mapping(ctx.previous.get("plan"))
    if plan.get("fits") is False:
        return skipped("plan_does_not_fit")
    fetch = as_mapping(ctx.previous.get("fetch"))
    config = fetch.get("config")
    if not isinstance(config, Mapping):
        return skipped("no_config")
    from .checkpoint import fetched_tokenizer, full_size_folder

    tokenizer_dir = fetched_tokenizer(ctx)
    if tokenizer_dir is None:
        return skipped("no_tokenizer")
    analysis = _analysis(ctx, config)
    model = served_model(config, analysis)
    device = getattr(ctx.pool, "device", "cpu")
    held = degrees.devices_for_engine(ctx.pool)
    needed = devices_needed(planned, kind)
    if needed > held:
        return skipped("too_few_devices", devices_needed=needed, devices_held=held, model=model)
    try:
        dry = launch_command(
            planned,
            kind=kind,
            python=python,
            checkpoint_dir="config",
            port=0,
            devices=held,
            memory_fraction=float(engine.get("memory_fraction") or DEFAULT_MEMORY_FRACTION),
            max_context=_count(_text_config(config).get("max_position_embeddings")),
            device=device,
            load_format=LOAD_FORMAT,
        )
    except CommandError as exc:
        return failed("bad_command", error=str(exc), model=model)
    checkpoint_dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    dtype = serving_dtype(dry, checkpoint_dtype)
    weight_bytes = (
        model["parameters"] * DTYPE_BYTES[dtype] if model["parameters"] is not None else None
    )
    model["weight_bytes"] = weight_bytes
    if settings.max_weight_bytes is not None:
        if weight_bytes is None:
            return skipped("size_unknown", max_weight_bytes=settings.max_weight_bytes, model=model)
        if weight_bytes > settings.max_weight_bytes:
            return skipped(
                "over_weight_cap",
                weight_bytes=weight_bytes,
                max_weight_bytes=settings.max_weight_bytes,
                model=model,
            )
    chosen, left_out = tp_degrees(
        settings=settings,
        plan=plan,
        planned=planned,
        kind=kind,
        analysis=analysis,
        devices_held=held,
        device=device,
    )
    if not chosen:
        return skipped("no_valid_tp", tp_skipped=left_out, model=model)
    folder = full_size_folder(config, tokenizer_dir)
    env: dict[str, str] = {}
    kv_gib = None
    if device == "cpu" and kind == "vllm":
        context = _count(_launch_int(dry, "--max-model-len")) or _count(
            _text_config(config).get("max_position_embeddings")
        )
        kv_gib = _kv_space_gib(engine, model["kv_cache_bytes_per_token"], context)
        if kv_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = f"{kv_gib:g}"
    from .measure import plan_concurrency
    from .sweep import levels_for, load_generator_name

    levels = levels_for(plan_concurrency(plan), settings.max_concurrency)
    requests = settings.requests_for(levels)
    budget = _Budget(deadline)
    result: dict[str, Any] = {
        "status": "failed",
        "reason": None,
        "load_format": LOAD_FORMAT,
        "launched_command": "",
        "command_diff": [],
        "load_s": None,
        "tp": chosen[0],
        "dtype": dtype,
        "peak_memory_bytes": None,
        "max_model_len": None,
        "engine_kv_cache_tokens": None,
        "kv_cache_space_gib": kv_gib,
        "folder": str(folder),
        "sweep_settings": {
            "input_tokens": settings.primary.input_tokens,
            "output_tokens": settings.primary.output_tokens,
            "concurrency": levels,
            "requests_per_level": requests,
            "time_budget_s": round(max(0.0, budget.left()), 1),
            "load_generator": load_generator_name(python, version=version),
        },
        "sweep": [],
        "stopped": None,
        "workloads": [],
        "tp_scaling": [],
        "tp_skipped": left_out,
        "scaling": [],
        "engine_metrics": None,
        "model": model,
        "duration_s": None,
    }
    started = time.monotonic()
    ctx.log(
        f"full size with dummy weights: {model['architecture']} "
        f"({model['num_hidden_layers']} layers, hidden {model['hidden_size']}), TP "
        f"{', '.join(str(tp) for tp in chosen)}, levels {levels}, "
        f"{budget.left():.0f} s budget"
    )
    runner = _Runner(
        ctx,
        engine,
        planned,
        folder=str(folder),
        env=env,
        python=python,
        max_context=_count(_text_config(config).get("max_position_embeddings")),
        processes=processes,
    )
    try:
        _primary(runner, result, settings, levels, requests, budget, smaller=len(chosen) - 1)
        if result["sweep"]:
            _scaling_launches(runner, result, chosen[1:], settings, levels, requests, budget)
    finally:
        result["duration_s"] = round(time.monotonic() - started, 3)

    def devices(tp: int) -> int:
        if device == "cpu":
            return len(degrees.worker_cores())
        return tp * max(1, needed // max(1, tensor_parallel(planned, kind)))

    result["scaling"] = scaling(result["tp"], result["sweep"], result["tp_scaling"], devices)
    if result["sweep"]:
        result["status"], result["reason"] = "measured", None
    elif result["reason"] is None:
        result["reason"] = "no_level_finished"
    return result


def _launch_int(launch: Launch, flag: str) -> int | None:
    value = launch.flag(flag)
    return int(value) if value is not None and value.isdigit() else None


class _Runner:
    """Launches and sweeps of one full-size run (the same folder, environment and engine)."""

    def __init__(
        self,
        ctx: StageContext,
        engine: Mapping[str, Any],
        planned: str,
        *,
        folder: str,
        env: Mapping[str, str],
        python: str,
        max_context: int | None,
        processes: list[EngineProcess],
    ) -> None:
        self.ctx = ctx
        self.engine = engine
        self.planned = planned
        self.folder = folder
        self.env = dict(env)
        self.python = python
        self.max_context = max_context
        self.processes = processes

    def launch(self, tp: int, timeout_s: float) -> tuple[Launch, EngineProcess, float]:
        """Launch at TP=`tp` and wait at most `timeout_s`; the process is added to the stage's
        list (stopped in its `finally`) before it is returned."""
        launch, process, load_s = start_engine(
            self.ctx,
            self.engine,
            self.planned,
            checkpoint_dir=self.folder,
            max_context=self.max_context,
            tp=tp,
            load_format=LOAD_FORMAT,
            env=self.env,
            timeout_s=timeout_s,
        )
        self.processes.append(process)
        return launch, process, load_s

    def sweep(
        self,
        process: EngineProcess,
        launch: Launch,
        workload: Workload,
        levels: Sequence[int],
        requests: int | None,
        timeout_s: float,
        clock: Callable[[], float],
        ends: list[float],
    ) -> tuple[list[dict[str, Any]], str | None]:
        """(points, stopped) of one workload's sweep: `stopped` None when every level
        finished, "time budget" when `timeout_s` ran out, "error: ..." otherwise; `ends` gets
        `clock()` as each level finishes. Raises `StageCancelled` when the job was
        cancelled."""
        from .sweep import SweepError, run_sweep

        self.ctx.log(
            f"full size, TP={launch.tp}, {workload.label}: {workload.input_tokens} + "
            f"{workload.output_tokens} tokens"
        )
        try:
            points = run_sweep(
                python=self.python,
                base_url=process.base_url,
                model=launch.served_model_name,
                tokenizer_dir=self.folder,
                levels=levels,
                input_tokens=workload.input_tokens,
                output_tokens=workload.output_tokens,
                requests_per_level=requests,
                timeout_s=timeout_s,
                log=self.ctx.log,
                cancelled=self.ctx.cancelled,
                on_point=lambda _point: ends.append(clock()),
            )
        except SweepError as exc:
            if exc.kind == "cancelled":
                raise_if_cancelled(self.ctx.cancelled)
            if exc.kind == "timeout":
                return list(exc.points), TIME_BUDGET
            gone = "" if process.alive() else "the engine died: "
            return list(exc.points), f"error: {gone}{exc.reason}"
        return points, None


def _refused(
    result: dict[str, Any], exc: EngineRefused, engine: Mapping[str, Any], budget: _Budget
) -> None:
    """The primary launch's refusal into `result` (status failed, the engine's own lines;
    `stopped` "time budget" when it was still loading as the budget ran out)."""
    import shlex

    if budget.left() <= 1.0 and "did not answer" in exc.reason:
        result["stopped"] = TIME_BUDGET
    refused = getattr(exc, "process", None)
    if refused is not None:
        result["launched_command"] = shlex.join(refused.argv)
        result["peak_memory_bytes"] = refused.peak_memory_bytes or None
    result["reason"] = "engine_refused"
    result["error"] = refusal_reason(exc.lines) if exc.lines else exc.reason
    result["engine_lines"] = list(exc.lines)
    result["startup_log"] = list(exc.log_excerpt)
    result["culprit"] = refusal_culprit(exc.reason, exc.lines, list(engine.get("flags") or []))


def _phase(label: str, began: float, ended: float) -> dict[str, Any]:
    """When a workload's sweep ran, on the clock of the scrape series' `t_s` (s)."""
    return {"label": label, "t_start_s": began, "t_end_s": ended}


class _Scraped:
    """The /metrics scrapes of one launch and which sweep ran when on their clock, so each
    level gets the engine's peaks during it (`mark_level_peaks`) once the scraping stops."""

    def __init__(self, process: EngineProcess) -> None:
        from .metrics import Scraper

        self.scraper = Scraper(process.base_url)
        self.phases: list[dict[str, Any]] = []
        self.metrics: dict[str, Any] | None = None
        self._marks: list[tuple[list[dict[str, Any]], list[float], float]] = []

    def __enter__(self) -> _Scraped:
        self.scraper.start()
        return self

    def sweep(
        self,
        runner: _Runner,
        process: EngineProcess,
        launch: Launch,
        workload: Workload,
        levels: Sequence[int],
        requests: int | None,
        timeout_s: float,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """`runner.sweep` with the sweep's phase and its levels' ends marked."""
        ends: list[float] = []
        began = self.scraper.elapsed_s()
        points, stopped = runner.sweep(
            process,
            launch,
            workload,
            levels,
            requests,
            timeout_s,
            clock=self.scraper.elapsed_s,
            ends=ends,
        )
        self.phases.append(_phase(workload.label, began, self.scraper.elapsed_s()))
        self._marks.append((points, ends, began))
        return points, stopped

    def __exit__(self, *exc_info: object) -> None:
        self.metrics = self.scraper.stop()
        for points, ends, began in self._marks:
            mark_level_peaks(points, ends, began, self.metrics["series"])

    def summary(self) -> dict[str, Any] | None:
        """`Scraper.stop()`'s dict with the sweeps' `phases` and the `peak` of the series (None
        when the scraping never started)."""
        if self.metrics is None:
            return None
        return {**self.metrics, "phases": self.phases, "peak": _peaks(self.metrics["series"])}


def _primary(
    runner: _Runner,
    result: dict[str, Any],
    settings: FullSizeSettings,
    levels: list[int],
    requests: int | None,
    budget: _Budget,
    *,
    smaller: int,
) -> None:
    """Launch at the primary TP, sweep the primary workload, then the other workloads on the
    same engine with the time the smaller TP degrees will not need; scrape /metrics meanwhile."""
    ctx = runner.ctx
    if budget.left() < MIN_SWEEP_S:
        result["stopped"] = TIME_BUDGET
        return
    try:
        launch, process, load_s = runner.launch(result["tp"], budget.left())
    except CommandError as exc:
        result["reason"], result["error"] = "bad_command", str(exc)
        return
    except EngineRefused as exc:
        _refused(result, exc, runner.engine, budget)
        ctx.log(f"full size: the engine refused: {result['error']}")
        return
    try:
        result.update(
            launched_command=launch.launched,
            command_diff=launch.diff,
            load_s=round(load_s, 3),
            max_model_len=_served_max_model_len(process, launch.served_model_name),
            engine_kv_cache_tokens=kv_cache_tokens(process.log_text()),
            startup_log=excerpt(process.log_text()),
        )
        ctx.log(f"full size ready in {load_s:.1f} s")
        scraped = _Scraped(process)
        try:
            with scraped:
                swept_from = time.monotonic()
                result["sweep"], result["stopped"] = scraped.sweep(
                    runner, process, launch, settings.primary, levels, requests, budget.left()
                )
                # What each smaller TP degree will take: a launch and the primary sweep again.
                spent = load_s + (time.monotonic() - swept_from)
                reserve = spent * smaller if result["stopped"] is None else 0.0
                _other_workloads(
                    runner,
                    (process, launch),
                    result,
                    scraped,
                    settings,
                    levels,
                    requests,
                    budget,
                    reserve,
                )
        finally:
            result["engine_metrics"] = scraped.summary()
        result["peak_memory_bytes"] = process.peak_memory_bytes or None
    finally:
        process.stop()


def _other_workloads(
    runner: _Runner,
    engine: tuple[EngineProcess, Launch],
    result: dict[str, Any],
    scraped: _Scraped,
    settings: FullSizeSettings,
    levels: list[int],
    requests: int | None,
    budget: _Budget,
    reserve: float,
) -> None:
    """The prefill-heavy and decode-heavy pairs on the primary launch, each given an equal
    share of the budget left once `reserve` (s) is set aside for the smaller TP degrees."""
    process, launch = engine
    pending = list(settings.workloads)
    while pending and result["stopped"] is None:
        workload = pending.pop(0)
        share = (budget.left() - reserve) / (len(pending) + 1)
        entry: dict[str, Any] = {
            "label": workload.label,
            "input_tokens": workload.input_tokens,
            "output_tokens": workload.output_tokens,
            "sweep": [],
            "stopped": None,
        }
        result["workloads"].append(entry)
        if share < MIN_SWEEP_S:
            entry["stopped"] = TIME_BUDGET
            continue
        entry["sweep"], entry["stopped"] = scraped.sweep(
            runner, process, launch, workload, levels, requests, share
        )
        if entry["stopped"] is not None and entry["stopped"] != TIME_BUDGET:
            break  # the engine failed: the other workloads would too


def _scaling_launches(
    runner: _Runner,
    result: dict[str, Any],
    smaller: list[int],
    settings: FullSizeSettings,
    levels: list[int],
    requests: int | None,
    budget: _Budget,
) -> None:
    """The primary workload at each smaller TP degree, a launch each, while the budget lasts;
    each launch's /metrics scraped for its levels' peaks (`engine_peak`: the launch's)."""
    for tp in smaller:
        entry: dict[str, Any] = {
            "tp": tp,
            "load_s": None,
            "launched_command": "",
            "sweep": [],
            "stopped": None,
            "engine_kv_cache_tokens": None,
            "peak_memory_bytes": None,
            "engine_peak": None,
        }
        result["tp_scaling"].append(entry)
        if budget.left() < MIN_SWEEP_S:
            entry["stopped"] = TIME_BUDGET
            continue
        raise_if_cancelled(runner.ctx.cancelled)
        try:
            launch, process, load_s = runner.launch(tp, budget.left())
        except EngineRefused as exc:
            timed_out = budget.left() <= 1.0 and "did not answer" in exc.reason
            entry["stopped"] = (
                TIME_BUDGET
                if timed_out
                else f"error: {refusal_reason(exc.lines) if exc.lines else exc.reason}"
            )
            refused = getattr(exc, "process", None)
            if refused is not None:
                import shlex

                entry["launched_command"] = shlex.join(refused.argv)
            continue
        try:
            entry.update(
                load_s=round(load_s, 3),
                launched_command=launch.launched,
                engine_kv_cache_tokens=kv_cache_tokens(process.log_text()),
            )
            if budget.left() < MIN_SWEEP_S:
                entry["stopped"] = TIME_BUDGET
                continue
            scraped = _Scraped(process)
            try:
                with scraped:
                    entry["sweep"], entry["stopped"] = scraped.sweep(
                        runner, process, launch, settings.primary, levels, requests, budget.left()
                    )
            finally:
                entry["engine_peak"] = (scraped.summary() or {}).get("peak")
            entry["peak_memory_bytes"] = process.peak_memory_bytes or None
        finally:
            process.stop()
