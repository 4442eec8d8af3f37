"""Remote-code policy and the sandboxed child process (no Django).

The release here is a tiny custom architecture served from a local mirror folder: a Llama
subclass under a new name with `auto_map`, which transformers does not know.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
from pathlib import Path

import pytest

from engine.contract import PoolSpec, ReleaseRef, StageContext, StageFailed
from engine.registry import get_stage
from engine.remote_code import sandbox as remote_code
from engine.stages.operators import run as operators
from tests.engine.stages.realconfigs import load

# Builds and runs scaled twins with torch: left out of `make test-fast`.
pytestmark = pytest.mark.slow

CONFIGURATION = """
from transformers import LlamaConfig


class Day0TinyConfig(LlamaConfig):
    model_type = "day0tiny"
"""
MODELING = """
from transformers import LlamaForCausalLM

from .configuration_day0tiny import Day0TinyConfig
from .layers_day0tiny import DAY0_MARK


class Day0TinyForCausalLM(LlamaForCausalLM):
    config_class = Day0TinyConfig
    day0_mark = DAY0_MARK
"""
# Imported relatively by the modeling file, named nowhere in auto_map.
LAYERS = """
DAY0_MARK = "layers"
"""
SLOW = (
    MODELING
    + """

import threading


class Day0SlowForCausalLM(Day0TinyForCausalLM):
    def __init__(self, config):
        import subprocess

        subprocess.Popen(["sleep", "62.718"], start_new_session=True)  # its own session
        threading.Event().wait()  # blocks until killed
        super().__init__(config)


class Day0HungryForCausalLM(Day0TinyForCausalLM):
    def __init__(self, config):
        import torch

        self.hog = torch.empty(64 * 1024**3, dtype=torch.uint8)  # 64 GiB of address space
        super().__init__(config)


class Day0NosyForCausalLM(Day0TinyForCausalLM):
    def __init__(self, config):
        import ctypes, json, os, resource, socket, subprocess

        grandchild = subprocess.Popen(["sleep", "61.4142"])
        unsharing = os.fork()  # single-threaded, as unshare(CLONE_NEWUSER) wants
        if unsharing == 0:
            libc = ctypes.CDLL(None, use_errno=True)
            os._exit(0 if libc.unshare(0x10000000) == 0 else ctypes.get_errno())
        unshared = os.waitstatus_to_exitcode(os.waitpid(unsharing, 0)[1])
        with open("/proc/self/status") as status:
            no_new_privs = [line.split()[1] for line in status if line.startswith("NoNewPrivs")]
        raise RuntimeError(json.dumps({
            "env": sorted(os.environ),
            "home": os.environ.get("HOME"),
            "cwd": os.getcwd(),
            "uid": os.getuid(),
            "gid": os.getgid(),
            "groups": os.getgroups(),
            "hostname": socket.gethostname(),
            "no_new_privs": no_new_privs,
            "rlimit_as": resource.getrlimit(resource.RLIMIT_AS),
            "rlimit_cpu": resource.getrlimit(resource.RLIMIT_CPU)[0],
            "rlimit_nproc": resource.getrlimit(resource.RLIMIT_NPROC),
            "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "grandchild": grandchild.pid,
            "unshare_user": unshared,
        }))
"""
)
FILES = {
    "configuration_day0tiny.py": CONFIGURATION.encode(),
    "modeling_day0tiny.py": SLOW.encode(),
    "layers_day0tiny.py": LAYERS.encode(),
}


def tiny_config(model_class: str = "Day0TinyForCausalLM") -> dict:
    return dict(
        load("meta-llama__Llama-3.1-8B"),
        model_type="day0tiny",
        architectures=[model_class],
        auto_map={
            "AutoConfig": "configuration_day0tiny.Day0TinyConfig",
            "AutoModelForCausalLM": f"modeling_day0tiny.{model_class}",
        },
    )


@pytest.fixture
def mirror(tmp_path: Path) -> Path:
    folder = tmp_path / "acme" / "tiny-1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(tiny_config()))
    (folder / "configuration_day0tiny.py").write_text(CONFIGURATION)
    (folder / "modeling_day0tiny.py").write_text(MODELING)
    (folder / "layers_day0tiny.py").write_text(LAYERS)
    return tmp_path


def context(root: Path, trusted: tuple[str, ...]) -> StageContext:
    return StageContext(
        release=ReleaseRef("mirror", str(root), "acme/tiny-1", "main"),
        pool=PoolSpec(name="cpu", backend="cpu", queue="cpu", trust_remote_code_orgs=trusted),
        previous={"fetch": {"config": tiny_config()}},
    )


def test_policy_is_off_by_default_and_per_org():
    pool = PoolSpec(name="cpu", backend="cpu", queue="cpu", trust_remote_code_orgs=("Acme",))
    assert remote_code.remote_code_allowed("acme/tiny-1", pool)
    assert not remote_code.remote_code_allowed("other/tiny-1", pool)
    assert not remote_code.remote_code_allowed("acme/tiny-1", PoolSpec("cpu", "cpu", "cpu"))


def test_only_architectures_transformers_lacks_need_remote_code():
    # DeepSeek-V3 ships modeling code too, but transformers has the class: that one is used
    assert not remote_code.needs_remote_code(load("deepseek-ai__DeepSeek-V3"))
    assert remote_code.needs_remote_code(tiny_config())
    assert remote_code.modeling_file_names(tiny_config()) == [
        "configuration_day0tiny.py",
        "modeling_day0tiny.py",
    ]


def test_an_untrusted_org_fails_without_running_anything(mirror):
    with pytest.raises(StageFailed) as err:
        operators.run(context(mirror, trusted=()))
    assert err.value.reason.startswith(
        "transformers has no Day0TinyForCausalLM; its shipped modeling code is not allowed for "
        "org acme (trust_remote_code is off for pool cpu)"
    )


def test_a_trusted_org_runs_its_code_in_a_child_process(mirror):
    result = operators.run(context(mirror, trusted=("acme",)))
    assert result["twin"]["code_source"] == "remote"
    assert result["twin"]["class"] == "Day0TinyForCausalLM"
    assert result["missing"] == [] and "aten::embedding.default" in {
        op["name"] for op in result["operators"]
    }


def test_relatively_imported_files_are_fetched_too():
    fetched = []

    def fetch(names):
        fetched.append(list(names))
        return {name: FILES[name] for name in names}

    files = remote_code.fetch_release_code(fetch, remote_code.modeling_file_names(tiny_config()))
    assert sorted(files) == sorted(FILES)
    assert fetched == [
        ["configuration_day0tiny.py", "modeling_day0tiny.py"],
        ["layers_day0tiny.py"],
    ]
    with pytest.raises(StageFailed, match=r"imports \.\.secrets: only modules at the top level"):
        remote_code.relative_imports("from ..secrets import TOKEN\n")


def test_the_sandbox_limit_stays_below_the_stage_soft_limit():
    soft = get_stage("operators").soft_time_limit_s
    assert remote_code.sandbox_time_limit_s(soft) == min(
        remote_code.DEFAULT_TIME_LIMIT_S, soft - remote_code.SOFT_LIMIT_MARGIN_S
    )
    assert remote_code.sandbox_time_limit_s(soft, 10_000) < soft
    assert remote_code.sandbox_time_limit_s(get_stage("precision").soft_time_limit_s, 3) == 3
    assert remote_code.sandbox_time_limit_s(None) == remote_code.DEFAULT_TIME_LIMIT_S


def test_the_child_is_killed_at_its_time_limit():
    # its model blocks for ever: only the kill at the limit ends this test
    with pytest.raises(StageFailed, match=r"ran past its time limit of 3 s .* was killed"):
        remote_code.run_sandboxed(
            "twin",
            tiny_config("Day0SlowForCausalLM"),
            FILES,
            PoolSpec("cpu", "cpu", "cpu"),
            org="acme",
            time_limit_s=3,
        )
    # what it started in a session of its own died with the sandbox's PID namespace
    assert _host_processes(["sleep", "62.718"]) == []


def test_the_child_fails_at_its_memory_limit():
    with pytest.raises(StageFailed, match=r"exceeded the sandbox's memory limit of 4 GiB"):
        remote_code.run_sandboxed(
            "twin",
            tiny_config("Day0HungryForCausalLM"),
            FILES,
            PoolSpec("cpu", "cpu", "cpu"),
            org="acme",
            memory_limit_bytes=4 * 1024**3,
        )


def _sandbox_in_a_daemon(queue) -> None:
    try:
        remote_code.run_sandboxed(
            "twin",
            tiny_config("Day0NosyForCausalLM"),
            FILES,
            PoolSpec("cpu", "cpu", "cpu"),
            org="acme",
            time_limit_s=60,
            memory_limit_bytes=8 * 1024**3,
            cpu_limit_s=120,
            process_limit=300,
        )
        queue.put("no error")
    except BaseException as exc:
        queue.put(f"{type(exc).__name__}: {exc}")


def test_the_child_starts_from_a_daemonic_process_confined_by_bubblewrap(monkeypatch):
    # A Celery prefork pool process is daemonic: multiprocessing children are refused there.
    monkeypatch.setenv("SECRET_KEY", "not-for-the-child")
    monkeypatch.setenv("DATABASE_URL", "postgres://user:secret@db/day0")
    monkeypatch.setenv("HF_TOKEN", "hf_not_for_the_child")
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    daemon = context.Process(target=_sandbox_in_a_daemon, args=(queue,), daemon=True)
    daemon.start()
    message = queue.get(timeout=120)
    daemon.join(10)
    # the modeling code reports what it sees by raising (build_twin wraps that error)
    assert message.startswith("StageFailed: transformers rejects the twin"), message
    seen = json.loads(message.split("RuntimeError: ", 1)[1])
    assert "SECRET_KEY" not in seen["env"] and "DATABASE_URL" not in seen["env"]
    assert "HF_TOKEN" not in seen["env"]
    assert {"PATH", "HOME", "PYTHONPATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"} <= set(
        seen["env"]
    )
    assert seen["cwd"] == "/sandbox/work" and seen["home"] == "/sandbox/work/home"
    assert (seen["uid"], seen["gid"], seen["groups"]) == (65534, 65534, [])
    assert seen["hostname"] == "day0-sandbox" and seen["no_new_privs"] == ["1"]
    # soft and hard limits alike, so the code cannot raise them back
    assert seen["rlimit_as"] == [8 * 1024**3, 8 * 1024**3] and seen["rlimit_cpu"] == 120
    assert seen["rlimit_nproc"] == [300, 300]
    assert seen["unshare_user"] == errno.EPERM  # no user namespace of its own (seccomp)
    # its own PID namespace: bwrap's first process, the child, and what the child started
    assert seen["pids"][0] == 1 and seen["grandchild"] in seen["pids"]
    assert len(seen["pids"]) <= 4, seen["pids"]
    # what it left running died with the namespace
    assert _host_processes(["sleep", "61.4142"]) == []


def _host_processes(argv: list[str]) -> list[int]:
    """The host's processes whose command line is `argv`."""
    wanted = ("\0".join(argv) + "\0").encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == wanted:
                found.append(int(entry.name))
        except OSError:
            continue
    return found
