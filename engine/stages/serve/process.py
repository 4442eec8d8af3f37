"""Start, watch and stop one serving-engine process tree.

The engine runs in a new session (its own process group) through `engine_child.py`, so that
(1) a stop kills the engine and every worker process it spawned with one `killpg`, (2) it dies
with the day0 worker (PR_SET_PDEATHSIG), and (3) processes that left the group (a
multiprocessing worker that called setsid) are still found: each carries `DAY0_ENGINE_RUN=<id>`
in its environment, and `stop` kills every process that does.

Its environment is an allow-list: the worker's secrets (database URL, broker URL, hub token,
webhook keys) are not the engine's business. Peak memory is the largest sum of the resident
set sizes (RSS, bytes, /proc/<pid>/statm) of the engine's processes, sampled every 0.5 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from .engine_log import error_lines, excerpt

CHILD = Path(__file__).with_name("engine_child.py")
RUN_TAG = "DAY0_ENGINE_RUN"
# The pid of the day0 process that launched the engine: an engine whose owner is gone (a worker
# SIGKILLed, whose PR_SET_PDEATHSIG reached only the API server) is stopped by `reap_orphans`.
OWNER_TAG = "DAY0_ENGINE_OWNER"
# Never handed to the engine even under an allowed prefix: a key would make the engine demand it
# from day0's own health and model checks.
ENV_DENIED = frozenset({"VLLM_API_KEY"})
# What the engine inherits from the worker's environment (names, or prefixes ending in "_").
ENV_ALLOWED = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "TZ",
    "USER",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "VLLM_",
    "OMP_",
    "NCCL_",
    "HF_HOME",
    "HF_HUB_CACHE",
)
SAMPLE_INTERVAL_S = 0.5
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class EngineRefused(Exception):
    """The engine exited or never answered: `lines` are its own error lines, `reason` day0's
    short reading, `log_excerpt` the start and end of its log."""

    def __init__(self, reason: str, lines: list[str], log_excerpt: list[str]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.lines = lines
        self.log_excerpt = log_excerpt


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS picks (bound then released: the engine binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def allowed_environment() -> dict[str, str]:
    """The worker's variables a child it launches may see (`ENV_ALLOWED`, less `ENV_DENIED`):
    never its database or broker URL, secret key, hub token or webhook keys."""
    return {
        name: value
        for name, value in os.environ.items()
        if name not in ENV_DENIED
        and any(
            name == allowed or (allowed.endswith("_") and name.startswith(allowed))
            for allowed in ENV_ALLOWED
        )
    }


def engine_environment(extra: Mapping[str, str], run_id: str) -> dict[str, str]:
    """The engine's environment: `allowed_environment()`, the pool's `extra`, and the tags
    that find its processes (`RUN_TAG`) and its owner (`OWNER_TAG`)."""
    env = allowed_environment()
    env.update(extra)
    env[RUN_TAG] = run_id
    env[OWNER_TAG] = str(os.getpid())
    env["PYTHONUNBUFFERED"] = "1"
    # vLLM renames its engine core and workers with setproctitle, which by default writes the
    # new title over the memory /proc/<pid>/environ shows: the tags above would vanish from the
    # processes holding the model. SPT_NOENV keeps the environment (the title fits in argv).
    env["SPT_NOENV"] = "1"
    return env


def _environ(pid_dir: Path) -> list[bytes]:
    try:
        return (pid_dir / "environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _live_pids() -> list[Path]:
    return [entry for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def tagged_pids(run_id: str) -> list[int]:
    """Pids of live processes whose environment carries `DAY0_ENGINE_RUN=run_id`."""
    needle = f"{RUN_TAG}={run_id}".encode()
    return [int(entry.name) for entry in _live_pids() if needle in _environ(entry)]


def reap_orphans() -> list[int]:
    """SIGKILL every engine process whose owner (`DAY0_ENGINE_OWNER`) is no longer alive: what a
    worker killed mid-stage left behind. Returns the pids killed."""
    prefix = f"{OWNER_TAG}=".encode()
    killed = []
    for entry in _live_pids():
        owner = next(
            (item[len(prefix) :] for item in _environ(entry) if item.startswith(prefix)), None
        )
        if owner is None or not owner.isdigit() or Path(f"/proc/{int(owner)}").exists():
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(entry.name), signal.SIGKILL)
            killed.append(int(entry.name))
    return killed


def _rss_bytes(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
    except OSError:
        return 0
    return int(fields[1]) * _PAGE


class EngineProcess:
    """One launched engine: `start()`, `wait_ready()`, then `stop()` (also on any error)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        base_url: str,
    ) -> None:
        self.argv = list(argv)
        self.run_id = uuid.uuid4().hex
        self.env = engine_environment(env, self.run_id)
        self.log_path = log_path
        self.base_url = base_url
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.peak_memory_bytes = 0
        self._sampling = threading.Event()
        self._sampler: threading.Thread | None = None
        self._stopped = False

    def start(self) -> None:
        """Launch `python engine_child.py <module> <args>` in a new session."""
        python, module_args = self.argv[0], self.argv[1:]
        if module_args[:1] != ["-m"]:
            raise ValueError("the engine argv must be `<python> -m <module> ...`")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [python, str(CHILD), *module_args[1:]],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._sampling.wait(SAMPLE_INTERVAL_S):
            total = sum(_rss_bytes(pid) for pid in self.pids())
            self.peak_memory_bytes = max(self.peak_memory_bytes, total)

    def pids(self) -> list[int]:
        return tagged_pids(self.run_id)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def refusal(self, reason: str) -> EngineRefused:
        text = self.log_text()
        return EngineRefused(reason, error_lines(text), excerpt(text))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, *, timeout_s: float, cancelled: Callable[[], bool] | None = None) -> float:
        """Seconds from launch until `/health` and `/v1/models` both answer 200 (`load_s`).

        Raises `EngineRefused` when the engine exits first (with its error lines) or does not
        answer within `timeout_s`; calls `cancelled()` between polls and lets what it raises
        through.
        """
        deadline = self.started_at + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                if cancelled is not None:
                    cancelled()
                if not self.alive():
                    code = self.proc.returncode if self.proc else None
                    raise self.refusal(f"the engine exited with status {code} before it answered")
                if time.monotonic() > deadline:
                    raise self.refusal(f"the engine did not answer /health within {timeout_s:g} s")
                with contextlib.suppress(httpx.HTTPError):
                    health = client.get(f"{self.base_url}/health")
                    if health.status_code == 200:
                        models = client.get(f"{self.base_url}/v1/models")
                        if models.status_code == 200:
                            return time.monotonic() - self.started_at
                time.sleep(1.0)

    def stop(self, *, grace_s: float = 10.0) -> list[int]:
        """Kill the engine's process group and every tagged process; returns the pids that had
        to be killed with SIGKILL. Safe to call twice."""
        self._sampling.set()
        if self.proc is None or self._stopped:
            return []
        self._stopped = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and not self.pids():
                break
            time.sleep(0.2)
        killed = []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for _ in range(50):  # zombies of other parents are reaped by init
            if not self.pids():
                break
            time.sleep(0.1)
        return killed
