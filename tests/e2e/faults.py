"""A fault-injection lab: a PostgreSQL and a Redis of its own, on free ports in a temporary
folder, with day0's Celery processes on them (a control worker on `day0`, a cpu pool worker
on `pool.cpu`, beat), for tests/e2e/test_faults.py and benchmarks/faults.py.

Being private, the database and the broker can be restarted, stopped and emptied without
touching the services the rest of the suite uses. The workers run the app of
`tests.e2e.fault_app`: day0's own, with stub stages that sleep, kill themselves or wait at a
gate. Their lost-work knobs are short (a heartbeat every second, stale after 10 s, the reaper
every 2 s), as the docs allow.

What runs inside day0 here runs in subprocesses: the workers and beat, and the job creation
(`FaultLab.jobs_create`: `python -m tests.e2e.faults create-jobs ...`, day0's own
`job_create` with the lab's settings, so its messages go to the lab's Redis). Whoever drives
the lab reads the database through Django's ORM on a connection to the lab's database
(`lab_database`: an extra alias in the test process; `default` in the benchmark, which
points its settings at the lab before Django starts).

PostgreSQL refuses to run as root: as root, its binaries run as the `postgres` user, which
owns the lab's folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from engine.stages.serve.process import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
PG_BIN = Path(os.environ.get("DAY0_FAULTS_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER_AS_ROOT = "postgres"

# The jobs of the lab run these two stages (stubs), so a lost first stage shows its job going on.
STAGES = ("fetch", "analyze")

# The lost-work knobs of the lab's processes (docs/operations.md, "Lost work and retries").
LOST_WORK_ENV = {
    "DAY0_HEARTBEAT_EVERY_S": "1",
    "DAY0_STALE_HEARTBEAT_S": "10",
    "DAY0_REAP_EVERY_S": "2",
}

# Environment of the suite that must not reach the lab's processes (its shared services).
_DROPPED_ENV = ("DATABASE_URL", "CELERY_BROKER_URL", "DAY0_CACHE_URL", "CELERY_TASK_ALWAYS_EAGER")

T = TypeVar("T")


def missing_tools() -> str:
    """Why the lab cannot run on this machine ("" when it can)."""
    for tool in ("initdb", "pg_ctl", "createdb"):
        if not (PG_BIN / tool).exists():
            return f"PostgreSQL's {tool} is not in {PG_BIN} (set DAY0_FAULTS_PG_BIN)"
    if shutil.which("redis-server") is None:
        return "redis-server is not on PATH"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam(PG_USER_AS_ROOT)
        except KeyError:
            return f"running as root without a {PG_USER_AS_ROOT!r} user to run PostgreSQL"
        if shutil.which("runuser") is None:
            return "running as root without runuser to start PostgreSQL as another user"
    return ""


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


class PrivatePostgres:
    """A PostgreSQL cluster in `root/pg` on a free port, database `day0`, user `day0` (trust
    authentication on 127.0.0.1), made for speed (no fsync)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "pg"
        self.log_path = root / "postgres.log"
        self.port = free_port()
        self.url = f"postgres://day0@127.0.0.1:{self.port}/day0"

    def _run(self, tool: str, *args: str) -> None:
        command = [str(PG_BIN / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", PG_USER_AS_ROOT, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if done.returncode:
            raise RuntimeError(
                f"{tool} {' '.join(args)} failed ({done.returncode}): {done.stdout}{done.stderr}"
                f"\n{_tail(self.log_path)}"
            )

    def start(self) -> None:
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-U", "day0", "--auth=trust",
                      "-E", "UTF8", "--no-sync")  # fmt: skip
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-o", options,
                  "-w", "start")  # fmt: skip
        created = self.data / "day0-created"
        if not created.exists():
            self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "day0", "day0")
            created.touch()

    def restart(self) -> None:
        """`pg_ctl restart -m fast`: every connection is cut, the server is back when it
        returns."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-m", "fast", "-w",
                  "restart")  # fmt: skip

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")


class PrivateRedis:
    """A redis-server on a free port that keeps nothing on disk: stopped (`SHUTDOWN NOSAVE`)
    and started again, it comes back empty."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log_path = root / "redis.log"
        self.process: subprocess.Popen | None = None

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.root), "--logfile", str(self.log_path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.client().ping():
                    return
            except Exception as exc:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    log = _tail(self.log_path)
                    raise RuntimeError(f"redis-server did not start:\n{log}") from exc
                time.sleep(0.05)

    def stop(self) -> None:
        """`SHUTDOWN NOSAVE`: the queued messages are gone."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self.client().shutdown(nosave=True)
        except Exception:
            self.process.terminate()
        self.process.wait(timeout=10)


@dataclass
class LabProcess:
    """A Celery process of the lab (worker or beat), the leader of its own process group."""

    name: str
    node_name: str
    process: subprocess.Popen
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill_group(self) -> None:
        """SIGKILL the whole process group: the main process and every pool child."""
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


class FaultLab:
    """The private services and day0's processes on them; a context manager (module
    docstring). `stage_s`: how long a stub stage sleeps; `concurrency`: the cpu worker's pool
    processes."""

    def __init__(self, *, stage_s: float = 3, concurrency: int = 2) -> None:
        self.stage_s = stage_s
        self.concurrency = concurrency
        self.root = Path(tempfile.mkdtemp(prefix="day0-faults-"))
        if os.geteuid() == 0:
            shutil.chown(self.root, PG_USER_AS_ROOT, PG_USER_AS_ROOT)
        self.postgres = PrivatePostgres(self.root)
        self.redis = PrivateRedis(self.root)
        self.processes: list[LabProcess] = []
        self.cpu_worker: LabProcess | None = None
        self._workers_started = 0

    # --- the lab's life ------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """The environment of every day0 process of the lab."""
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        env.update(
            LOST_WORK_ENV,
            DJANGO_SETTINGS_MODULE="day0web.settings",
            DATABASE_URL=self.postgres.url,
            CELERY_BROKER_URL=self.redis.url,
            DAY0_VAR_DIR=str(self.root / "var"),
            DAY0_FAULTS_DIR=str(self.root),
            DAY0_FAULTS_STAGE_S=str(self.stage_s),
            PYTHONUNBUFFERED="1",
        )
        return env

    def start(self) -> FaultLab:
        self.postgres.start()
        self.redis.start()
        self.python("manage.py", "migrate", "--noinput")
        self._spawn("control", ["worker", "-Q", "day0", "--concurrency", "1"])
        self._spawn("beat", ["beat", "--pidfile", str(self.root / "beat.pid"),
                             "--schedule", str(self.root / "beat-schedule")])  # fmt: skip
        self.cpu_worker = self.start_cpu_worker()
        self._wait_for_first_reap()
        return self

    def _wait_for_first_reap(self) -> None:
        """Wait until the reaper has looked at the new broker once: the first look finds no
        marker and sends every queued run again (`workers.broker_watch`), and a job created
        before it would start with a second copy of its message."""
        from workers.broker_watch import EPOCH_KEY

        self.wait_until(
            lambda: self.redis.client().exists(EPOCH_KEY),
            timeout_s=90,
            what="the reaper's first look at the broker",
        )

    def close(self) -> None:
        for process in self.processes:
            if process.alive():
                process.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.processes:
            with suppress(subprocess.TimeoutExpired):
                process.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            process.kill_group()  # pool children left behind, if any
        self.redis.stop()
        self.postgres.stop()
        if not os.environ.get("DAY0_FAULTS_KEEP"):
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> FaultLab:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self, name: str, args: list[str], node_name: str = "") -> LabProcess:
        log_path = self.root / f"{name}.log"
        hostname = ["--hostname", node_name] if node_name else []
        if args[0] == "worker":
            hostname = ["--hostname", node_name or f"faults-{name}@{socket.gethostname()}"]
            args = [*args, "--without-gossip", "--without-mingle"]
        with log_path.open("w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tests.e2e.fault_app", *args,
                 "--loglevel", "INFO", *hostname],
                cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killpg takes all of it
            )  # fmt: skip
        started = LabProcess(name, hostname[-1] if hostname else name, process, log_path)
        self.processes.append(started)
        return started

    def start_cpu_worker(self) -> LabProcess:
        """A new cpu pool worker (`faults-cpu-<n>@<host>`, n counting from 1)."""
        self._workers_started += 1
        name = f"cpu-{self._workers_started}"
        return self._spawn(
            name,
            ["worker", "-Q", "pool.cpu", "--concurrency", str(self.concurrency)],
            node_name=f"faults-{name}@{socket.gethostname()}",
        )

    def python(self, *args: str) -> str:
        """Run `python <args>` in the repository with the lab's environment; its stdout."""
        done = subprocess.run(
            [sys.executable, *args], cwd=REPO_ROOT, env=self.env, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"python {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    # --- driving it ----------------------------------------------------------------------

    def jobs_create(self, repo_ids: list[str], stages: tuple[str, ...] = STAGES) -> list[int]:
        """One release and one job (of `stages`) per repo id, created by day0's `job_create`
        in a process on the lab's settings (the first stages' messages go to the lab's
        Redis). Their ids, in order."""
        out = self.python("-m", "tests.e2e.faults", "create-jobs", ",".join(stages), *repo_ids)
        return json.loads(out.strip().splitlines()[-1])

    def completions(self) -> Counter[tuple[str, str]]:
        """How many times each (repo id, stage) stub ran to its end."""
        path = self.root / "completions.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return Counter((entry["repo_id"], entry["stage"]) for entry in map(json.loads, lines))

    def gate_ready(self, label: str) -> bool:
        return (self.root / f"{label}.ready").exists()

    def open_gate(self, label: str) -> None:
        (self.root / f"{label}.go").touch()

    def logs_tail(self, chars: int = 3000) -> str:
        """The end of every process's log, for a failure message."""
        parts = [
            f"--- {p.name} ({'alive' if p.alive() else f'exited {p.process.returncode}'}) ---\n"
            f"{_tail(p.log_path, chars)}"
            for p in self.processes
        ]
        return "\n".join(parts)

    def wait_until(self, predicate: Callable[[], T], *, timeout_s: float, what: str) -> T:
        """Poll `predicate` until it returns something true (returned); raise
        `TimeoutError` with the processes' logs when it never does."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"Timed out after {timeout_s:g} s waiting for {what}.\n"
                                   f"{self.logs_tail()}")  # fmt: skip
            time.sleep(0.2)


# --- reading the lab's database (Django's ORM, on `using`) ----------------------------------


@contextmanager
def lab_database(url: str, alias: str) -> Iterator[str]:
    """A database connection `alias` to the lab's database in this process, for reading it
    beside the suite's own `default`; removed on exit."""
    import dj_database_url
    from django.db import connections

    config = connections.configure_settings(
        {"default": {}, alias: dj_database_url.parse(url, conn_max_age=0)}
    )[alias]
    connections.settings[alias] = config
    try:
        yield alias
    finally:
        try:
            connections[alias].close()
        finally:
            del connections.settings[alias]
            with suppress(AttributeError):
                del connections[alias]


def stage_runs(job_id: int, *, using: str) -> dict[str, Any]:
    """The job's stage runs by stage name, as stored now."""
    from adaptation.models import StageRun

    return {run.stage: run for run in StageRun.objects.using(using).filter(job_id=job_id)}


def jobs_finished(job_ids: list[int], *, using: str) -> list[Any]:
    """The jobs, once every one of them has finished (succeeded, failed, cancelled); else []."""
    from adaptation.models import AdaptationJob, JobStatus

    jobs = list(AdaptationJob.objects.using(using).filter(pk__in=job_ids).order_by("pk"))
    done = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)
    return jobs if len(jobs) == len(job_ids) and all(j.status in done for j in jobs) else []


def running_attempt(job_id: int, stage: str, *, using: str) -> dict[str, Any] | None:
    """The open attempt of the job's `stage` once it runs (with its pid); else None."""
    from adaptation.models import StageRun, StageStatus

    run = StageRun.objects.using(using).filter(job_id=job_id, stage=stage).first()
    if run is None or run.status != StageStatus.RUNNING or not run.attempts:
        return None
    current = run.attempts[-1]
    return current if current.get("pid") and not current.get("ended") else None


def attempt_started(attempt: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(attempt["started_at"])


def succeeded_attempts(run: Any) -> int:
    return sum(1 for attempt in run.attempts or [] if attempt.get("ended") == "succeeded")


# --- inside a lab process -------------------------------------------------------------------


def _create_jobs(stages: list[str], repo_ids: list[str]) -> list[int]:
    """Run in a process on the lab's settings (`FaultLab.jobs_create`)."""
    import django

    django.setup()
    from adaptation.models import AcceleratorPool, HubKind, ModelRelease, Trigger
    from adaptation.services.jobs import job_create

    pool = AcceleratorPool.objects.get(name="cpu")
    ids = []
    for repo_id in repo_ids:
        release = ModelRelease.objects.create(
            hub_kind=HubKind.MIRROR,
            hub_endpoint="/faults",
            repo_id=repo_id,
            revision="faults",
            found_by=Trigger.MANUAL,
        )
        job = job_create(release=release, pool=pool, trigger=Trigger.MANUAL, stages=stages)
        ids.append(job.pk)
    return ids


if __name__ == "__main__":
    if sys.argv[1:2] != ["create-jobs"] or len(sys.argv) < 4:
        sys.exit("usage: python -m tests.e2e.faults create-jobs STAGE[,STAGE...] REPO_ID...")
    print(json.dumps(_create_jobs(sys.argv[2].split(","), sys.argv[3:])))
