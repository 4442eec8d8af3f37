"""Launch the plan's command on this worker and wait until the engine answers: the one way the
serve stage starts an engine, for the twin, its TP=1 comparison and the full-size run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.contract import StageContext, raise_if_cancelled
from engine.paths import var_dir

from . import degrees
from .command import Launch, launch_command
from .options import DEFAULT_MEMORY_FRACTION, DEFAULT_START_TIMEOUT_S
from .process import EngineProcess, EngineRefused, free_port

# A launch whose port another process took between the OS picking it and the engine binding it
# is tried again on a new port, this many times.
PORT_RETRIES = 2


def start_engine(
    ctx: StageContext,
    engine: Mapping[str, Any],
    planned: str,
    *,
    checkpoint_dir: str,
    max_context: int | None,
    tp: int | None,
    load_format: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> tuple[Launch, EngineProcess, float]:
    """Launch `planned` (the plan's command, `command.launch_command`) on `checkpoint_dir` and
    wait until `/health` and `/v1/models` answer: (launch, process, load_s in s).

    `tp` forces a TP size, `load_format` a `--load-format` ("dummy": the full size from the
    config), `env` variables set over the engine's (`degrees.engine_env`), `timeout_s` a wait
    shorter than the pool's `start_timeout_s`. Raises `EngineRefused` (the process stopped or
    did not answer in time; its `process` attribute is the stopped process) or
    `CommandError`; a port taken meanwhile is retried on a new one. The caller stops the
    process it gets back.
    """
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
            load_format=load_format,
        )
        log_path = var_dir("serve", "logs", f"{ctx.release.repo_id.replace('/', '__')}-{port}.log")
        process = EngineProcess(
            launch.argv,
            env={**degrees.engine_env(ctx.pool, engine, launch.tp), **dict(env or {})},
            log_path=log_path,
            base_url=f"http://127.0.0.1:{port}",
        )
        ctx.log(f"launching TP={launch.tp}: {launch.launched}")
        process.start()
        timeout = float(engine.get("start_timeout_s") or DEFAULT_START_TIMEOUT_S)
        if timeout_s is not None:
            timeout = max(1.0, min(timeout, timeout_s))
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
