"""The processes day0 runs as: `make run`'s Procfile (which worker listens where, the supervisor
that restarts a dead worker) and docker compose's services (start order, restarts, health
checks), with the image's .dockerignore."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings

from day0web.celery import app as celery_app
from workers.supervise import exit_description, next_backoff_s

ROOT = Path(__file__).resolve().parent.parent

# A child that records its pid, sleeps, then exits with the given code. With a fourth
# argument it records "TERM" there and exits 0 on SIGTERM (as Celery's warm shutdown does).
CHILD = """
import os, signal, sys, time
if len(sys.argv) > 4:
    def on_term(signum, frame):
        open(sys.argv[4], "w").write("TERM")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
with open(sys.argv[1], "a") as pids:
    pids.write(f"{os.getpid()}\\n")
time.sleep(float(sys.argv[2]))
sys.exit(int(sys.argv[3]))
"""


# --- the supervisor --------------------------------------------------------------------------


def wait_for(predicate: Callable[[], Any], timeout_s: float = 10) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


def is_alive(pid: int) -> bool:
    """Whether a process runs; a zombie waiting to be reaped does not (Linux's /proc says)."""
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc/self/stat").exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Supervised:
    def __init__(self, tmp_path: Path) -> None:
        self.pids_file = tmp_path / "pids"
        self.term_file = tmp_path / "term"
        self.log_file = tmp_path / "supervise.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(
        self,
        *,
        sleep_s: float = 60,
        exit_code: int = 0,
        backoff_s: float = 2,
        on_term: bool = False,
    ) -> subprocess.Popen[bytes]:
        child = [sys.executable, "-c", CHILD, str(self.pids_file), str(sleep_s), str(exit_code)]
        if on_term:
            child.append(str(self.term_file))
        supervise = [sys.executable, "-m", "workers.supervise", "--name", "sleeper"]
        with self.log_file.open("wb") as log:
            # A session of its own, as honcho gives each Procfile line.
            self.process = subprocess.Popen(
                [*supervise, "--backoff-s", str(backoff_s), "--", *child],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self.process

    def pids(self) -> list[int]:
        if not self.pids_file.exists():
            return []
        return [int(line) for line in self.pids_file.read_text().split()]

    def wait_for_children(self, count: int, timeout_s: float = 10) -> list[int]:
        pids = wait_for(lambda: len(self.pids()) >= count and self.pids(), timeout_s)
        assert pids and len(pids) >= count, (self.pids(), self.log())
        return pids

    def log(self) -> str:
        return self.log_file.read_text() if self.log_file.exists() else ""

    def stop_all(self) -> None:
        """Leave nothing behind: the supervisor's process group, then any child."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        for pid in self.pids():
            if is_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Supervised]:
    runner = Supervised(tmp_path)
    yield runner
    runner.stop_all()


def test_a_child_killed_by_sigkill_is_started_again_and_sigterm_stops_both(supervised):
    supervisor = supervised.start()
    [first] = supervised.wait_for_children(1)

    os.kill(first, signal.SIGKILL)

    second = supervised.wait_for_children(2)[1]
    assert second != first
    assert is_alive(second)
    assert supervisor.poll() is None
    assert "sleeper exited by SIGKILL; restarting in 2 s" in supervised.log()

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=10) == 128 + signal.SIGTERM  # the child died by SIGTERM
    assert wait_for(lambda: not is_alive(second), 5)
    assert supervised.pids() == [first, second]


def test_a_child_signalled_by_someone_else_is_started_again(supervised):
    """SIGTERM to the child alone (not a stop of the supervisor) is a death, not a stop."""
    supervisor = supervised.start(backoff_s=0.2)
    [first] = supervised.wait_for_children(1)

    os.kill(first, signal.SIGTERM)

    supervised.wait_for_children(2)
    assert supervisor.poll() is None
    assert "sleeper exited by SIGTERM; restarting in 0.2 s" in supervised.log()


def test_a_child_that_exits_0_is_not_started_again(supervised):
    supervisor = supervised.start(sleep_s=0, exit_code=0, backoff_s=0.2)

    assert supervisor.wait(timeout=10) == 0
    time.sleep(0.5)
    assert len(supervised.pids()) == 1
    assert "sleeper exited with code 0; not restarting" in supervised.log()


def test_a_child_that_keeps_failing_is_started_again_with_a_growing_backoff(supervised):
    supervisor = supervised.start(sleep_s=0, exit_code=3, backoff_s=0.2)

    supervised.wait_for_children(3)
    log = supervised.log()
    assert "sleeper exited with code 3; restarting in 0.2 s" in log
    assert "sleeper exited with code 3; restarting in 0.4 s" in log

    supervisor.send_signal(signal.SIGTERM)
    supervisor.wait(timeout=10)
    count = len(supervised.pids())
    time.sleep(1)
    assert len(supervised.pids()) == count  # nothing started after the stop


def test_a_sigterm_to_the_whole_process_group_stops_without_a_restart(supervised):
    """What honcho does on Ctrl-C: SIGTERM to each Procfile line's process group, so the child
    gets it too. The supervisor must not take the child's death for a crash."""
    supervisor = supervised.start(backoff_s=0.2)
    [child] = supervised.wait_for_children(1)

    os.killpg(supervisor.pid, signal.SIGTERM)

    assert supervisor.wait(timeout=10) == 128 + signal.SIGTERM
    assert wait_for(lambda: not is_alive(child), 5)
    time.sleep(0.5)
    assert supervised.pids() == [child]
    assert "restarting" not in supervised.log()


def test_sigint_to_the_supervisor_asks_the_child_to_stop_with_sigterm(supervised):
    """A child in the same process group as a terminal has had SIGINT already; the supervisor
    passes on SIGTERM, a warm shutdown for Celery, rather than a second SIGINT (a cold one)."""
    supervisor = supervised.start(on_term=True)
    [child] = supervised.wait_for_children(1)

    supervisor.send_signal(signal.SIGINT)

    assert supervisor.wait(timeout=10) == 0  # the child's own exit code
    assert supervised.term_file.read_text() == "TERM"
    assert not is_alive(child)
    assert supervised.pids() == [child]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_supervisor_killed_alone_leaves_no_child_behind(supervised):
    supervisor = supervised.start(on_term=True)
    [child] = supervised.wait_for_children(1)

    supervisor.kill()  # SIGKILL to the supervisor only, not its group

    supervisor.wait(timeout=10)
    assert wait_for(lambda: not is_alive(child), 5)
    assert supervised.term_file.read_text() == "TERM"


def test_the_backoff_doubles_while_the_child_keeps_dying_and_resets_after_a_long_run():
    assert next_backoff_s(previous_s=None, ran_s=0.1, initial_s=2) == 2
    assert next_backoff_s(previous_s=2, ran_s=0.1, initial_s=2) == 4
    assert next_backoff_s(previous_s=16, ran_s=0.1, initial_s=2) == 30
    assert next_backoff_s(previous_s=30, ran_s=0.1, initial_s=2) == 30
    assert next_backoff_s(previous_s=30, ran_s=600, initial_s=2) == 2


def test_exit_descriptions_name_the_signal():
    assert exit_description(-signal.SIGKILL) == "by SIGKILL"
    assert exit_description(1) == "with code 1"


# --- the Procfile ----------------------------------------------------------------------------


def procfile() -> dict[str, list[str]]:
    processes = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, command = line.split(":", 1)
            processes[name.strip()] = shlex.split(command)
    return processes


def celery_worker_queues(argv: list[str]) -> set[str] | None:
    """The queues of a `celery ... worker -Q a,b` command line (wrapped or not), else None."""
    if "celery" not in argv or "worker" not in argv[argv.index("celery") :]:
        return None
    for flag in ("-Q", "--queues"):
        if flag in argv:
            return set(argv[argv.index(flag) + 1].split(","))
    return {settings.CELERY_TASK_DEFAULT_QUEUE}  # no -Q: Celery's default queue only


def beat_queues() -> set[str]:
    """Every queue beat's schedule sends to, as Celery routes it (options, task routes, the
    default queue)."""
    router = celery_app.amqp.router
    return {
        router.route(dict(entry.get("options", {})), entry["task"])["queue"].name
        for entry in settings.CELERY_BEAT_SCHEDULE.values()
    }


def test_the_control_worker_listens_on_day0_only_and_the_cpu_worker_not_on_day0():
    processes = procfile()
    assert celery_worker_queues(processes["control"]) == {"day0"}
    assert settings.CELERY_TASK_DEFAULT_QUEUE == "day0"
    cpu_queues = celery_worker_queues(processes["worker"])
    assert "pool.cpu" in cpu_queues
    assert "day0" not in cpu_queues


def test_every_queue_beat_sends_to_has_a_procfile_worker():
    served = set()
    for argv in procfile().values():
        served |= celery_worker_queues(argv) or set()
    sent_to = beat_queues() | {settings.CELERY_TASK_DEFAULT_QUEUE}
    assert sent_to <= served, f"no Procfile worker for {sorted(sent_to - served)}"
    assert {"day0", "pool.cpu"} <= served


def test_the_workers_run_under_the_supervisor_and_web_and_beat_do_not():
    processes = procfile()
    workers = {name for name, argv in processes.items() if celery_worker_queues(argv)}
    assert workers == {"control", "worker"}
    for name, argv in processes.items():
        wrapped = argv[:3] == ["python", "-m", "workers.supervise"]
        assert wrapped == (name in workers), name
        if wrapped:
            assert argv[argv.index("--") + 1] == "celery"
    assert processes["beat"][:3] == ["celery", "-A", "day0web"]
    assert "beat" in processes["beat"]
    assert "runserver" in processes["web"]


# --- docker compose --------------------------------------------------------------------------


def docker_compose_works() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


def render_compose() -> dict[str, Any]:
    """docker-compose.yml as compose reads it: `docker compose config` where docker compose is
    installed, else the YAML with its anchors and merge keys resolved."""
    path = ROOT / "docker-compose.yml"
    if docker_compose_works():
        rendered = subprocess.run(
            ["docker", "compose", "-f", str(path), "config", "--format", "json"],
            capture_output=True,
            text=True,
            env={**os.environ, "SECRET_KEY": "x" * 50, "DAY0_METRICS_TOKEN": "y" * 32},
            check=True,
        )
        return json.loads(rendered.stdout)
    return yaml.safe_load(path.read_text())


def command_line(service: dict[str, Any]) -> str:
    command = service.get("command") or ""
    return " ".join(command) if isinstance(command, list) else command


def healthcheck_test(service: dict[str, Any]) -> str:
    test = (service.get("healthcheck") or {}).get("test") or []
    return " ".join(test) if isinstance(test, list) else test


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return render_compose()["services"]


def test_only_the_one_shot_migrate_service_migrates(compose):
    migrating = {
        name for name, service in compose.items() if "manage.py migrate" in command_line(service)
    }
    assert migrating == {"migrate"}
    assert "collectstatic" in command_line(compose["migrate"])
    assert compose["migrate"].get("restart", "no") == "no"
    assert compose["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_every_service_on_the_database_waits_for_a_successful_migrate(compose):
    on_database = {
        name
        for name, service in compose.items()
        if "DATABASE_URL" in (service.get("environment") or {}) and name != "migrate"
    }
    assert on_database == {"web", "worker-control", "worker-cpu", "beat"}
    for name in on_database:
        depends_on = compose[name].get("depends_on") or {}
        assert depends_on.get("migrate", {}).get("condition") == (
            "service_completed_successfully"
        ), name
        assert depends_on["postgres"]["condition"] == "service_healthy", name


def test_long_running_services_have_a_restart_policy(compose):
    for name, service in compose.items():
        if name != "migrate":
            assert service.get("restart") in {"always", "unless-stopped", "on-failure"}, name


def test_web_postgres_redis_and_the_workers_have_health_checks(compose):
    assert "pg_isready" in healthcheck_test(compose["postgres"])
    assert "redis-cli ping" in healthcheck_test(compose["redis"])
    assert "/accounts/login/" in healthcheck_test(compose["web"])
    assert "inspect ping -d control@" in healthcheck_test(compose["worker-control"])
    assert "inspect ping -d cpu@" in healthcheck_test(compose["worker-cpu"])


@pytest.mark.django_db
def test_the_web_health_check_url_answers_200_without_signing_in(compose, client):
    test = healthcheck_test(compose["web"])
    url = test.split("http://127.0.0.1:8000", 1)[1].split("'", 1)[0]
    assert client.get(url).status_code == 200


def test_compose_keeps_the_control_worker_off_the_pool_queues(compose):
    def queues(name: str) -> set[str]:
        return celery_worker_queues(shlex.split(command_line(compose[name]))) or set()

    assert queues("worker-control") == {"day0"}
    assert queues("worker-cpu") == {"pool.cpu"}
    assert beat_queues() <= queues("worker-control")
    environment = compose["worker-cpu"]["environment"]
    assert environment["DAY0_ENGINE_PYTHON"] == "/opt/engines/vllm-cpu/bin/python"


def test_the_image_leaves_out_the_venv_and_var():
    patterns = {
        line.strip().strip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", "var"} <= patterns
