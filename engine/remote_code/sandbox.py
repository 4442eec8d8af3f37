"""The remote-code policy and its sandboxed runner.

A release whose architecture transformers lacks can only be twinned with the modeling code it
ships (`auto_map` in config.json naming `modeling_*.py` classes, and the files those import
relatively). Running that code is `trust_remote_code`: off by default, allowed only when the
release's org (the repo id before "/") is in the pool's `trust_remote_code_orgs`.

Allowed code never runs in the calling process, and never outside bubblewrap (`bwrap.py`:
no network, its own PID namespace, read-only binds of only the Python environment, the
repository's `engine/` and the release's files, a private /tmp, nobody's uid, no new user
namespaces: `seccomp.py`). bwrap is started around `python -I -c pass` first (`bwrap.probe`),
so a worker that cannot confine fails before anything of the release runs. `run_sandboxed`
starts `python -m engine.remote_code.child` inside it: a fresh interpreter, not a fork, and not
`multiprocessing` (a Celery prefork pool process is daemonic, and a daemonic process may not
start `multiprocessing` children). The child gets:

- an environment built from an allow-list (`child_environment`): the device-visibility, locale,
  library-path and thread-count variables of `PASSED_ENV` that are set, PYTHONPATH = the
  repository, HOME/HF_HOME in its work folder, TMPDIR=/tmp, HF_HUB_OFFLINE=1 and
  TRANSFORMERS_OFFLINE=1. Never the worker's secrets (DATABASE_URL, SECRET_KEY, HF_TOKEN, broker
  URLs), and no view of the worker's /proc to read them from;
- the release's files (and its config.json) read-only at `bwrap.CODE_DIR`, written here;
- stdin (the task, JSON), and stdout/stderr into a log file outside its reach (its tail is
  quoted when it fails); no other file descriptors (`close_fds`) but the seccomp filter's,
  which bwrap reads and closes.

The child sets its limits before importing anything heavy (see `child`): address space
(`RLIMIT_AS`; GPU pools may need `RLIMIT_DATA`, see `memory_rlimit`), CPU seconds
(`RLIMIT_CPU`), processes and threads (`RLIMIT_NPROC`, `process_limit`) and file size
(`RLIMIT_FSIZE`). The parent enforces the wall-clock limit, kept below the stage's Celery soft
time limit so the stage can still report it, and kills bwrap's process group (`os.killpg`) at
the deadline and after it exits; bwrap's PID namespace takes every process the code started
with it. A child that runs out of time or memory, or dies, fails the stage with that reason.

Where bwrap is missing, or cannot confine a process on this worker (no user namespaces, a
seccomp profile forbidding them), the release's code is refused: the stage fails with that
reason, blamed on the infrastructure (`failure.culprit`), and nothing of the release runs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import signal
import stat
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
from engine.remote_code import bwrap, seccomp

DEFAULT_TIME_LIMIT_S = 240.0
DEFAULT_MEMORY_LIMIT_BYTES = 16 * 1024**3
# Seconds the sandbox's wall-clock limit stays below the stage's Celery soft time limit: room to
# kill the child, read its log and store the failure.
SOFT_LIMIT_MARGIN_S = 30
# /tmp inside the sandbox is a tmpfs, memory that RLIMIT_AS does not count: capped apart.
DEFAULT_TMP_BYTES = 1024**3
# Any one file the child writes (its log, its work folder's files).
DEFAULT_FILE_LIMIT_BYTES = 1024**3
# The most bytes of result.json read back: an operators or precision result of a large model is
# tens of KiB; the release's code could write anything there, and it is stored in the database.
MAX_RESULT_BYTES = 4 * 1024**2
# The most characters of a failure reason the child reports (it comes from the release's code).
MAX_REASON_CHARS = 2000
# Environment variables the child may see when the worker has them (device visibility, the
# loader's library path, thread counts); everything else is left out.
PASSED_ENV = (
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
    from engine.twin.build import transformers_class_for

    raw, _ = unwrap_text_config(config)
    model_cls, _cfg, _how = transformers_class_for(
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


def default_process_limit() -> int:
    """RLIMIT_NPROC for the child: 256 processes and threads plus 4 per CPU (torch's thread
    pools grow with the CPUs). A worker that runs as root shares it among its concurrent
    sandboxes (they all run as the host's uid 65534); one that is not root gets it per sandbox
    (its own user namespace)."""
    return 256 + 4 * (os.cpu_count() or 1)


def child_environment() -> dict[str, str]:
    """The child's whole environment: `PASSED_ENV` where set, a PATH of the interpreter's and
    the system's programs, the repository on PYTHONPATH, home and Hugging Face caches in its
    work folder (`bwrap.WORK_DIR`), temp in its private /tmp, hub access off."""
    env = {name: os.environ[name] for name in PASSED_ENV if name in os.environ}
    work = bwrap.WORK_DIR
    env.update(
        {
            "PATH": os.pathsep.join(
                [os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]
            ),
            "PYTHONPATH": str(REPO_ROOT),
            "PYTHONDONTWRITEBYTECODE": "1",
            "HOME": f"{work}/home",
            "USER": "nobody",
            "LOGNAME": "nobody",
            "TMPDIR": "/tmp",
            "HF_HOME": f"{work}/hf",
            "HF_MODULES_CACHE": f"{work}/modules",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
    )
    return env


def sandbox_refused(reason: str) -> StageFailed:
    """The stage's failure when the sandbox cannot run (`reason`): the infrastructure's fault
    (`failure.culprit`, read by the worker's failure classes), nothing of the release run."""
    text = f"the release's modeling code was not run: {reason}; remote code runs only sandboxed"
    return StageFailed(
        text,
        result={
            "status": "failed",
            "failure": {"phase": "sandbox", "reason": reason, "culprit": "infrastructure"},
        },
    )


def _prepare(folder: str, config: Mapping[str, Any], files: Mapping[str, bytes]) -> None:
    """The sandbox's host side in `folder`: `code/` (the release's files and config.json,
    readable by nobody, bound read-only), `work/` (writable by nobody: the child's cwd) and
    `etc/` (its passwd and group)."""
    code = os.path.join(folder, "code")
    os.makedirs(code)
    for name, data in files.items():
        with open(os.path.join(code, os.path.basename(name)), "wb") as fh:
            fh.write(data)
    with open(os.path.join(code, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(dict(config), fh)
    os.chmod(code, 0o755)
    for name in os.listdir(code):
        os.chmod(os.path.join(code, name), 0o644)
    work = os.path.join(folder, "work")
    os.makedirs(os.path.join(work, "home"))
    if bwrap.runs_as_root():
        for path in (work, os.path.join(work, "home")):
            os.chown(path, bwrap.SANDBOX_UID, bwrap.SANDBOX_GID)
    bwrap.write_identity(os.path.join(folder, "etc"))


def _read_result(path: str) -> dict[str, Any] | None:
    """The child's result.json; None when it wrote none. Opened without following a link and
    only as a regular file of at most `MAX_RESULT_BYTES` (the release's code could have put
    anything there). Raises `StageFailed` for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StageFailed(f"the sandbox's result file could not be read: {exc}") from exc
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_RESULT_BYTES:
            raise StageFailed(
                "the sandbox's result file is not a regular file of at most "
                f"{MAX_RESULT_BYTES // 1024**2} MiB"
            )
        try:
            message = json.loads(fh.read(MAX_RESULT_BYTES + 1))
        except ValueError as exc:
            raise StageFailed(f"the sandbox's result file is not JSON: {exc}") from exc
    if not isinstance(message, dict) or "ok" not in message:
        raise StageFailed("the sandbox's result file holds no result")
    if message["ok"] and not isinstance(message.get("result"), dict):
        raise StageFailed("the sandbox's result file holds a result that is not an object")
    return message


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # the child leads its own session and group


def _how_it_ended(code: int) -> str:
    """bwrap's exit status in words: it exits 128 + N when the child was killed by signal N."""
    number = -code if code < 0 else code - 128 if code > 128 else 0
    try:
        return f"killed by {signal.Signals(number).name}"
    except ValueError:
        return f"exit code {code}"


def _log_tail(path: str, chars: int = 1500) -> str:
    """The last `chars` characters of the child's log, reading only its last bytes (the
    release's code may have written up to the file limit, 1 GiB, to it)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 4 * chars))
            return fh.read().decode("utf-8", errors="replace")[-chars:].strip()
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
    process_limit: int | None = None,
    tmp_bytes: int = DEFAULT_TMP_BYTES,
    file_limit_bytes: int = DEFAULT_FILE_LIMIT_BYTES,
) -> dict[str, Any]:
    """Run `stage`'s measurement ("operators", "precision" or "twin") on a twin built from the
    release's modeling `files` ({name: bytes}) in the sandboxed child (module docstring).

    `time_limit_s`: wall clock, enforced here (bwrap's process group is killed, and its PID
    namespace with it). `memory_limit_bytes`: RLIMIT_AS (virtual address space), or RLIMIT_DATA
    with `memory_rlimit="data"` (for GPU pools whose runtime maps large virtual ranges).
    `cpu_limit_s`: RLIMIT_CPU, CPU seconds over all threads (default: the wall limit times the
    CPU count, a backstop behind the wall clock). `process_limit`: RLIMIT_NPROC, processes and
    threads (default `default_process_limit()`). `tmp_bytes`: the size of its /tmp (a tmpfs).
    `file_limit_bytes`: RLIMIT_FSIZE, the largest file it may write.

    Returns the measurement's result dict. Raises `StageFailed`: blamed on the infrastructure
    (`sandbox_refused`) when bubblewrap is missing or cannot confine a process here, before
    anything of the release runs; else when the child exceeds a limit, dies, or the measurement
    fails (the child's `StageFailed` reason, with its `result` attached when it had one).
    """
    if cpu_limit_s is None:
        cpu_limit_s = math.ceil(time_limit_s * max(1, os.cpu_count() or 1)) + 5
    if process_limit is None:
        process_limit = default_process_limit()
    try:
        program = bwrap.bwrap_executable()
    except bwrap.SandboxUnavailable as exc:
        raise sandbox_refused(exc.reason) from None
    as_root = bwrap.runs_as_root()
    task = {
        "stage": stage,
        "config": dict(config),
        "code_dir": bwrap.CODE_DIR,
        "pool": {
            **asdict(pool),
            "operator_manifest": dict(pool.operator_manifest) if pool.operator_manifest else None,
            "precision_thresholds": {
                k: dict(v) for k, v in (pool.precision_thresholds or {}).items()
            },
        },
        "org": org,
        "uid": bwrap.SANDBOX_UID,
        "gid": bwrap.SANDBOX_GID,
        "groups": bwrap.device_groups(bwrap.device_nodes(pool.backend)) if as_root else [],
        "memory_limit_bytes": memory_limit_bytes,
        "memory_rlimit": memory_rlimit,
        "cpu_limit_s": cpu_limit_s,
        "process_limit": process_limit,
        "file_limit_bytes": file_limit_bytes,
    }
    limit_gib = memory_limit_bytes / 1024**3
    with tempfile.TemporaryDirectory(prefix="day0-remote-") as folder:
        _prepare(folder, config, files)
        build = functools.partial(
            bwrap.command,
            bwrap=program,
            code_dir=os.path.join(folder, "code"),
            work_dir=os.path.join(folder, "work"),
            etc_dir=os.path.join(folder, "etc"),
            repo_root=REPO_ROOT,
            env=child_environment(),
            backend=pool.backend,
            tmp_bytes=tmp_bytes,
            as_root=as_root,
            argv=[sys.executable, "-m", "engine.remote_code.child"],
        )
        try:
            bwrap.probe(lambda fd: build(seccomp_fd=fd), sys.executable)
        except bwrap.SandboxUnavailable as exc:
            raise sandbox_refused(exc.reason) from None
        log_path = os.path.join(folder, "child.log")
        with open(log_path, "wb") as log, seccomp.filter_fd() as seccomp_fd:
            process = subprocess.Popen(
                build(seccomp_fd=seccomp_fd),
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=folder,
                env={"PATH": os.defpath},  # bwrap's own; the child's is set by --setenv
                start_new_session=True,
                close_fds=True,
                pass_fds=() if seccomp_fd is None else (seccomp_fd,),
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
            _kill_group(process)  # bwrap and its namespace's first process, if still there
            if process.poll() is None:
                process.kill()
                process.wait()
        message = _read_result(os.path.join(folder, "work", "result.json"))
        if message is None:
            how = _how_it_ended(process.returncode)
            if how in ("killed by SIGXCPU", "killed by SIGKILL"):
                how += f" (CPU limit {cpu_limit_s} s, or the kernel's out-of-memory killer)"
            tail = _log_tail(log_path)
            raise StageFailed(
                f"the sandboxed process running the release's modeling code died ({how}) with a "
                f"memory limit of {limit_gib:g} GiB"
                + (f"; its output ended: {tail}" if tail else "")
            )
    if message["ok"]:
        return message["result"]
    reason = str(message.get("reason") or "no reason given")[:MAX_REASON_CHARS]
    if message.get("kind") == "memory":
        raise StageFailed(
            f"the release's modeling code exceeded the sandbox's memory limit of {limit_gib:g} "
            f"GiB: {reason}"
        )
    exc = StageFailed(
        reason
        if message.get("kind") == "failed"
        else f"the release's modeling code failed in the sandbox: {reason}"
    )
    if isinstance(message.get("result"), dict):
        exc.result = message["result"]
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
