"""The remote-code policy and its sandboxed runner.

A release whose architecture transformers lacks can only be twinned with the modeling code it
ships (`auto_map` in config.json naming `modeling_*.py` classes, and the files those import
relatively). Running that code is `trust_remote_code`: off by default, allowed only when the
release's org (the repo id before "/") is in the pool's `trust_remote_code_orgs`.

Allowed code never runs in the calling process. `run_sandboxed` starts a child with
`subprocess.Popen([sys.executable, "-m", "engine.remote_code.child", ...])`: a fresh
interpreter, not a fork, and not `multiprocessing` (a Celery prefork pool process is daemonic,
and a daemonic process may not start `multiprocessing` children). The child inherits:

- an environment built from scratch: PATH, the device-visibility and library-path variables
  of `PASSED_ENV` that are set, PYTHONPATH = the repository, HOME/TMPDIR/HF_HOME = its private
  temporary folder, HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1. Never the worker's secrets
  (DATABASE_URL, SECRET_KEY, HF_TOKEN, broker URLs);
- its own session and process group (`start_new_session=True`), stdin (the task, JSON), and
  stdout/stderr into a log file in the temporary folder (its tail is quoted when it fails);
- no other file descriptors (`close_fds`).

The child sets its limits before importing anything heavy (see `remote_code_child`): SIGKILL
when the worker dies (`prctl(PR_SET_PDEATHSIG)`), address space (`RLIMIT_AS`; GPU pools may need
`RLIMIT_DATA`, see `memory_rlimit`) and CPU seconds (`RLIMIT_CPU`). The parent enforces the
wall-clock limit, kept below the stage's Celery soft time limit so the stage can still report
it, and kills the child's whole process group (`os.killpg`) at the deadline and after it exits.
A child that runs out of time or memory, or dies, fails the stage with that reason.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.architecture.config_reader import unwrap_text_config
from engine.contract import (
    PoolSpec,
    StageContext,
    StageFailed,
    StageTransientError,
    resolve_callable,
)

DEFAULT_TIME_LIMIT_S = 240.0
DEFAULT_MEMORY_LIMIT_BYTES = 16 * 1024**3
# Seconds the sandbox's wall-clock limit stays below the stage's Celery soft time limit: room to
# kill the child, read its log and store the failure.
SOFT_LIMIT_MARGIN_S = 30
# Environment variables the child may see when the worker has them (device visibility, the
# loader's library path, thread counts); everything else is left out.
PASSED_ENV = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "OMP_NUM_THREADS",
)
REPO_ROOT = Path(__file__).resolve().parents[2]
# transformers.dynamic_module_utils.get_relative_imports: `import .x` and `from .x import y`.
_RELATIVE_IMPORT_RES = (
    re.compile(r"^\s*import\s+\.(\S+)\s*$", re.MULTILINE),
    re.compile(r"^\s*from\s+\.(\S+)\s+import", re.MULTILINE),
)


def fetched_config(ctx: StageContext) -> dict[str, Any]:
    """`ctx.previous["fetch"]["config"]`; `StageFailed` when the fetch stage left none."""
    fetched = ctx.previous.get("fetch")
    if not isinstance(fetched, dict) or not isinstance(fetched.get("config"), dict):
        raise StageFailed("the fetch stage produced no config.json to build a twin from")
    return fetched["config"]


def native_config(ctx: StageContext, stage: str) -> dict[str, Any]:
    """The fetched config of a release transformers' own classes can build, for a stage that
    measures its twin in this process (performance, stability). Raises `StageFailed` when
    the fetch stage left no config, or the architecture needs the release's shipped modeling
    code (which runs sandboxed for operators and precision only)."""
    config = fetched_config(ctx)
    if needs_remote_code(config):
        raise StageFailed(
            f"the {stage} stage runs transformers' own classes only: this architecture "
            "needs the release's shipped modeling code, which runs in the sandbox for the "
            "operators and precision stages alone"
        )
    return config


def org_of(repo_id: str) -> str:
    """The org (or user) of a repo id: the part before "/"."""
    return repo_id.split("/", 1)[0]


def remote_code_allowed(repo_id: str, pool: PoolSpec) -> bool:
    """Whether the pool trusts the modeling code of `repo_id`'s org (case-insensitive)."""
    org = org_of(repo_id).lower()
    return any(org == allowed.lower() for allowed in pool.trust_remote_code_orgs)


def needs_remote_code(config: Mapping[str, Any]) -> bool:
    """True when transformers has neither the `architectures` class nor the `model_type`."""
    from engine.twin.build import _transformers_class

    raw, _ = unwrap_text_config(config)
    model_cls, _cfg, _how = _transformers_class(
        raw.get("model_type"), list(raw.get("architectures") or [])
    )
    return model_cls is None


def modeling_file_names(config: Mapping[str, Any]) -> list[str]:
    """The `*.py` files `auto_map` refers to ("modeling_x.Cls" -> "modeling_x.py").

    A reference may name another repo ("org/repo--modeling_x.Cls"); that is refused.
    """
    raw, _ = unwrap_text_config(config)
    auto_map = raw.get("auto_map") or {}
    names: set[str] = set()
    for ref in auto_map.values():
        refs = ref if isinstance(ref, list) else [ref]
        for item in refs:
            if not isinstance(item, str):
                continue
            if "--" in item:
                raise StageFailed(
                    f"auto_map entry {item!r} points to another "
                    "repo; only the release's own code may run"
                )
            module = item.rsplit(".", 1)[0]
            names.add(f"{module}.py")
    return sorted(names)


def relative_imports(source: str) -> list[str]:
    """The `*.py` files a module's source imports relatively, as transformers reads them
    (`dynamic_module_utils.get_relative_imports`): "from .configuration_x import C" ->
    "configuration_x.py".

    Raises `StageFailed` for an import that leaves the release's folder ("from ..x") or names a
    sub-package ("from .sub.mod"): only top-level files of the release are fetched.
    """
    names = set()
    for pattern in _RELATIVE_IMPORT_RES:
        for module in pattern.findall(source):
            if module.startswith(".") or "." in module:
                raise StageFailed(
                    f"the release's modeling code imports .{module}: only modules at the top "
                    "level of the release can be fetched"
                )
            names.add(f"{module}.py")
    return sorted(names)


def fetch_release_code(
    fetch: Callable[[list[str]], Mapping[str, bytes]], names: list[str]
) -> dict[str, bytes]:
    """The files `names` and every file they import relatively, transitively (as
    `transformers.dynamic_module_utils.get_relative_import_files` collects them), fetched with
    `fetch(names) -> {name: bytes}`. Raises what `fetch` raises, `StageFailed` for a file that
    is not UTF-8 or an import `relative_imports` refuses."""
    files: dict[str, bytes] = {}
    wanted = list(names)
    while wanted:
        fetched = fetch(wanted)
        files.update(fetched)
        found: set[str] = set()
        for name in wanted:
            try:
                source = fetched[name].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise StageFailed(f"the release's {name} is not UTF-8 text: {exc}") from exc
            found.update(relative_imports(source))
        wanted = sorted(found - files.keys())
    return files


def sandbox_time_limit_s(
    soft_time_limit_s: float | None, requested_s: float | None = None
) -> float:
    """The sandbox's wall-clock limit (s): `requested_s` (default `DEFAULT_TIME_LIMIT_S`),
    kept `SOFT_LIMIT_MARGIN_S` below the stage attempt's Celery soft time limit
    (`StageContext.soft_time_limit_s`) when one is known."""
    limit = DEFAULT_TIME_LIMIT_S if requested_s is None else requested_s
    if soft_time_limit_s is None:
        return limit
    return max(1.0, min(limit, soft_time_limit_s - SOFT_LIMIT_MARGIN_S))


# The stages' measurements a sandboxed child may run, by import path: those stages import
# this module, so naming them by path keeps the two free of an import circle.
SANDBOXED_MEASUREMENTS = {
    "operators": "engine.stages.operators.run:measure_operators",
    "precision": "engine.stages.precision.run:measure_precision",
}


def measure_in_child(task: dict[str, Any], code_dir: str) -> dict[str, Any]:
    """The sandboxed child's measurement (called by `remote_code_child` after its limits are
    set): build the twin from the release's files in `code_dir` and run `task["stage"]`'s
    measurement ("operators", "precision" or "twin"). Raises `StageFailed` as they do."""
    from engine.twin import build_twin

    pool = PoolSpec(
        **{
            **task["pool"],
            "dtypes": tuple(task["pool"]["dtypes"]),
            "trust_remote_code_orgs": tuple(task["pool"]["trust_remote_code_orgs"]),
        }
    )
    twin = build_twin(
        task["config"], allow_remote_code=True, remote_code_dir=code_dir, org=task["org"]
    )
    stage = task["stage"]
    if stage in SANDBOXED_MEASUREMENTS:
        return resolve_callable(SANDBOXED_MEASUREMENTS[stage])(twin, pool)
    if stage == "twin":
        return {
            "twin": twin.description,
            "logits_shape": list(twin.model(twin.input_ids).logits.shape),
        }
    raise StageFailed(f"no sandboxed measurement named {stage!r}")


def child_environment(folder: str) -> dict[str, str]:
    """The child's whole environment: `PASSED_ENV` where set, the repository on PYTHONPATH,
    home, temp and Hugging Face caches in the sandbox's `folder`, hub access off."""
    env = {name: os.environ[name] for name in PASSED_ENV if name in os.environ}
    env.setdefault("PATH", os.defpath)
    env.update(
        {
            "PYTHONPATH": str(REPO_ROOT),
            "PYTHONDONTWRITEBYTECODE": "1",
            "HOME": os.path.join(folder, "home"),
            "TMPDIR": os.path.join(folder, "tmp"),
            "HF_HOME": os.path.join(folder, "hf"),
            "HF_MODULES_CACHE": os.path.join(folder, "modules"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
    )
    return env


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # the child leads its own session and group


def _log_tail(path: str, chars: int = 1500) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()[-chars:].strip()
    except OSError:
        return ""


def run_sandboxed(
    stage: str,
    config: Mapping[str, Any],
    files: Mapping[str, bytes],
    pool: PoolSpec,
    *,
    org: str,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
    cpu_limit_s: int | None = None,
    memory_rlimit: str = "as",
) -> dict[str, Any]:
    """Run `stage`'s measurement ("operators", "precision" or "twin") on a twin built from the
    release's modeling `files` ({name: bytes}) in a sandboxed child process (module docstring).

    `time_limit_s`: wall clock, enforced here (the child's process group is killed).
    `memory_limit_bytes`: RLIMIT_AS (virtual address space), or RLIMIT_DATA with
    `memory_rlimit="data"` (for GPU pools whose runtime maps large virtual ranges).
    `cpu_limit_s`: RLIMIT_CPU, CPU seconds over all threads (default: the wall limit times the
    CPU count, a backstop behind the wall clock).

    Returns the measurement's result dict. Raises `StageFailed` when the child exceeds a limit,
    dies, or the measurement fails (the child's `StageFailed` reason, with its `result` attached
    when it had one).
    """
    if cpu_limit_s is None:
        cpu_limit_s = math.ceil(time_limit_s * max(1, os.cpu_count() or 1)) + 5
    task = {
        "stage": stage,
        "config": dict(config),
        "files": {name: data.decode("utf-8") for name, data in files.items()},
        "pool": {
            **asdict(pool),
            "operator_manifest": dict(pool.operator_manifest) if pool.operator_manifest else None,
            "precision_thresholds": {
                k: dict(v) for k, v in (pool.precision_thresholds or {}).items()
            },
        },
        "org": org,
        "memory_limit_bytes": memory_limit_bytes,
        "memory_rlimit": memory_rlimit,
        "cpu_limit_s": cpu_limit_s,
    }
    limit_gib = memory_limit_bytes / 1024**3
    with tempfile.TemporaryDirectory(prefix="day0-remote-") as folder:
        for sub in ("home", "tmp"):
            os.makedirs(os.path.join(folder, sub))
        log_path = os.path.join(folder, "child.log")
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "engine.remote_code.child", str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=folder,
                env=child_environment(folder),
                start_new_session=True,
                close_fds=True,
            )
        try:
            process.communicate(json.dumps(task).encode("utf-8"), timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            process.wait()
            raise StageFailed(
                f"the release's modeling code ran past its time limit of {time_limit_s:g} s in the "
                "sandboxed process and was killed"
            ) from None
        finally:
            _kill_group(process)  # whatever it left running in its group
            if process.poll() is None:
                process.kill()
                process.wait()
        result_path = os.path.join(folder, "result.json")
        if not os.path.exists(result_path):
            code = process.returncode
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            if code == -signal.SIGXCPU or code == -signal.SIGKILL:
                how += f" (CPU limit {cpu_limit_s} s, or the kernel's out-of-memory killer)"
            tail = _log_tail(log_path)
            raise StageFailed(
                f"the sandboxed process running the release's modeling code died ({how}) with a "
                f"memory limit of {limit_gib:g} GiB"
                + (f"; its output ended: {tail}" if tail else "")
            )
        with open(result_path, encoding="utf-8") as fh:
            message = json.load(fh)
    if message["ok"]:
        return message["result"]
    if message["kind"] == "memory":
        raise StageFailed(
            "the release's modeling code exceeded the "
            f"sandbox's memory limit of {limit_gib:g} GiB: "
            f"{message['reason']}"
        )
    exc = StageFailed(
        message["reason"]
        if message["kind"] == "failed"
        else f"the release's modeling code failed in the sandbox: {message['reason']}"
    )
    if message.get("result") is not None:
        exc.result = message["result"]  # type: ignore[attr-defined]
    raise exc


def run_stage_in_sandbox(
    ctx: StageContext, stage: str, config: Mapping[str, Any], *, time_limit_s: float | None = None
) -> dict[str, Any]:
    """The policy, then the sandbox: fetch the release's modeling files (those `auto_map` names
    and what they import relatively) and run `stage` within `sandbox_time_limit_s(
    ctx.soft_time_limit_s, time_limit_s)`.

    Raises `StageFailed` when the org is not trusted (naming the architecture and org), the
    release ships no code, or the sandbox fails; `StageTransientError` when the hub cannot be
    reached.
    """
    from engine.hubs import HubSpec, hub_source
    from engine.hubs.base import HubError

    raw, _ = unwrap_text_config(config)
    arch = (raw.get("architectures") or [raw.get("model_type")])[0]
    org = org_of(ctx.release.repo_id)
    if not remote_code_allowed(ctx.release.repo_id, ctx.pool):
        raise StageFailed(
            f"transformers has no {arch}; its shipped modeling code is not allowed for org {org} "
            f"(trust_remote_code is off for pool {ctx.pool.name}): add {org} to the pool's "
            "trust_remote_code_orgs to run it in a sandboxed process"
        )
    names = modeling_file_names(config)
    if not names:
        raise StageFailed(
            f"transformers has no {arch} and the release ships no modeling code (no auto_map)"
        )
    spec = HubSpec(kind=ctx.release.hub_kind, endpoint=ctx.release.hub_endpoint)
    source = hub_source(spec)
    try:
        files = fetch_release_code(
            lambda wanted: source.fetch_files(ctx.release.repo_id, ctx.release.revision, wanted),
            names,
        )
    except HubError as exc:
        if exc.transient:
            raise StageTransientError(
                exc.message, retry_after_s=getattr(exc, "retry_after_s", None)
            ) from exc
        raise StageFailed(exc.message) from exc
    limit_s = sandbox_time_limit_s(ctx.soft_time_limit_s, time_limit_s)
    ctx.log(
        f"running {', '.join(sorted(files))} of {ctx.release.repo_id} in a sandboxed process "
        f"(org {org} trusted; {limit_s:g} s limit)"
    )
    return run_sandboxed(stage, config, files, ctx.pool, org=org, time_limit_s=limit_s)
