"""The Celery app (`celery -A tests.e2e.fault_app worker`) of the fault-injection workers
(tests/e2e/test_faults.py, benchmarks/faults.py): day0's own app, `day0web.celery`, with every
stage replaced by a stub in each pool process (`worker_process_init`). The claim, heartbeat,
stored result, requeue and reaper are day0's own; only the stage's work is a stub.

What a stub does depends on its release's repo id, `<kind>/<label>`:

- `sleep/...`: sleeps `DAY0_FAULTS_STAGE_S` seconds (default 3), stopping early when the run is
  cancelled or taken for lost (`StageContext.cancelled`), as a real stage does at its next step;
- `poison/...`: SIGKILLs its own process half a second in, on every attempt (a stage that
  runs out of memory each time);
- `gate/...`: its `fetch` writes `<DAY0_FAULTS_DIR>/<label>.ready` and waits for
  `<label>.go` before returning (the test restarts PostgreSQL in between); its other stages
  sleep.

Each stub that returns appends one line to `<DAY0_FAULTS_DIR>/completions.jsonl` (the stage,
the repo id, its pid), so a stage run twice shows even when its second result was refused.
Its result is `stub_result(stage, repo_id)`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from celery.signals import worker_process_init

from day0web.celery import app

__all__ = ["app", "stub_result"]

# How long a gate waits for its go file before failing the stage.
GATE_TIMEOUT_S = 120
# How often a stub looks whether its run was cancelled.
STEP_S = 0.2


def stub_result(stage: str, repo_id: str) -> dict[str, Any]:
    """What the stub of `stage` returns for `repo_id`'s job (the fields fetch and analyze store
    on the release, and the stub's own)."""
    result: dict[str, Any] = {"stub": stage, "repo_id": repo_id}
    if stage == "fetch":
        result.update(config={"model_type": "llama"}, files=["config.json"])
    if stage == "analyze":
        result.update(architecture="LlamaForCausalLM", family="llama", model_type="llama")
    return result


def _faults_dir() -> Path:
    return Path(os.environ["DAY0_FAULTS_DIR"])


def _sleep(ctx: Any, seconds: float) -> None:
    from engine.contract import StageCancelled

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if ctx.cancelled():
            raise StageCancelled()
        time.sleep(min(STEP_S, max(end - time.monotonic(), 0)))


def _wait_for_gate(ctx: Any, label: str) -> None:
    from engine.contract import StageFailed

    (_faults_dir() / f"{label}.ready").write_text(str(os.getpid()))
    go = _faults_dir() / f"{label}.go"
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not go.exists():
        if time.monotonic() > deadline:
            raise StageFailed(f"the gate {label} was never opened")
        _sleep(ctx, STEP_S)


def stub_stage(stage: str, ctx: Any) -> dict[str, Any]:
    """The stub run of `stage` (module docstring)."""
    repo_id = ctx.release.repo_id
    kind, _, label = repo_id.partition("/")
    if kind == "poison":
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "gate" and stage == "fetch":
        _wait_for_gate(ctx, label)
    else:
        _sleep(ctx, float(os.environ.get("DAY0_FAULTS_STAGE_S", "3")))
    line = {"stage": stage, "repo_id": repo_id, "pid": os.getpid(), "at": time.time()}
    with (_faults_dir() / "completions.jsonl").open("a") as completions:
        completions.write(json.dumps(line) + "\n")
    ctx.log(f"stub {stage} done")
    return stub_result(stage, repo_id)


@worker_process_init.connect
def install_stub_stages(**_: object) -> None:
    """In each pool process: the runner's stages become stubs (their time limits, options and
    the rest of their definition kept)."""
    import workers.runner

    real = workers.runner.get_stage

    def get_stage(name: str):
        return dataclasses.replace(real(name), run=functools.partial(stub_stage, name))

    workers.runner.get_stage = get_stage
