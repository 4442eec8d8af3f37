"""The engine's process tree, with a stand-in engine: Python's own `http.server` serving a
folder whose files answer `/health` and `/v1/models` (what the stage polls for)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.stages.serve.degrees import thread_binding
from engine.stages.serve.process import (
    OWNER_TAG,
    RUN_TAG,
    EngineProcess,
    EngineRefused,
    engine_environment,
    free_port,
    reap_orphans,
)
from tests.engine.stages.serve.engine_server import ENGINE_MISSING, engine_python


@pytest.fixture
def site(tmp_path):
    (tmp_path / "health").write_text("ok")
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text('{"data": [{"id": "m"}]}')
    return tmp_path


def _engine(args, tmp_path, port):
    argv = [sys.executable, "-m", "http.server", *args]
    return EngineProcess(
        argv, env={}, log_path=tmp_path / "engine.log", base_url=f"http://127.0.0.1:{port}"
    )


def test_ready_when_health_and_models_answer_then_stopped_with_nothing_left(site, tmp_path):
    port = free_port()
    engine = _engine([str(port), "--bind", "127.0.0.1", "--directory", str(site)], tmp_path, port)
    engine.start()
    try:
        load_s = engine.wait_ready(timeout_s=60)
        assert 0 < load_s < 60
        assert engine.pids() and engine.alive()
        time.sleep(1.2)  # two samples of the resident set
        assert engine.peak_memory_bytes > 1 << 20
    finally:
        engine.stop()
    assert engine.pids() == [] and not engine.alive()
    assert engine.stop() == []  # a second stop signals nobody


def test_an_engine_that_exits_is_refused_with_its_own_line(tmp_path):
    port = free_port()
    engine = _engine(["not-a-port"], tmp_path, port)
    engine.start()
    with pytest.raises(EngineRefused) as refused:
        engine.wait_ready(timeout_s=60)
    engine.stop()
    assert refused.value.reason.startswith("the engine exited with status 2")
    assert "error: argument port: invalid int value: 'not-a-port'" in refused.value.lines[0]


def test_a_silent_engine_times_out(tmp_path):
    port = free_port()
    engine = _engine(
        [str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)], tmp_path, port
    )
    engine.start()
    with pytest.raises(EngineRefused, match="did not answer /health within 2 s"):
        engine.wait_ready(timeout_s=2)  # the folder has no /health: 404 until the deadline
    engine.stop()
    assert engine.pids() == []


@pytest.mark.engine  # runs the engine environment's Python (its setproctitle)
def test_a_renamed_engine_process_keeps_its_tags(tmp_path):
    # vLLM renames its engine core and workers ("VLLM::EngineCore") with setproctitle, which
    # overwrites what /proc/<pid>/environ shows unless SPT_NOENV is set: untagged, a stop, the
    # peak memory and reap_orphans would all miss the processes that hold the model.
    python = engine_python()
    if python is None:
        pytest.skip(ENGINE_MISSING)
    (tmp_path / "renamed_engine.py").write_text(
        "import setproctitle, time\n"
        "setproctitle.setproctitle('VLLM::EngineCore')\n"
        "print('renamed', flush=True)\n"
        "time.sleep(60)\n"
    )
    engine = EngineProcess(
        [str(python), "-m", "renamed_engine"],
        env={"PYTHONPATH": str(tmp_path)},
        log_path=tmp_path / "engine.log",
        base_url="",
    )
    engine.start()
    try:
        deadline = time.monotonic() + 60
        while "renamed" not in engine.log_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "renamed" in engine.log_text()
        pid = engine.proc.pid
        assert Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::Engine")
        assert engine.pids() == [pid]
    finally:
        engine.stop()
    assert engine.pids() == []


def test_the_engine_sees_no_worker_secret(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/day0")
    monkeypatch.setenv("SECRET_KEY", "s3cret")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("VLLM_API_KEY", "would-lock-day0-out")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    env = engine_environment({"VLLM_CPU_OMP_THREADS_BIND": "0|1"}, "run-1")
    assert not {"DATABASE_URL", "SECRET_KEY", "HF_TOKEN", "VLLM_API_KEY"} & set(env)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert env[RUN_TAG] == "run-1" and env[OWNER_TAG] == str(os.getpid())


def test_engines_whose_owner_died_are_reaped():
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_owner = gone.stdout.strip()
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, OWNER_TAG: dead_owner},
    )
    owned = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, OWNER_TAG: str(os.getpid())},
    )
    try:
        time.sleep(0.3)
        killed = reap_orphans()
        assert orphan.pid in killed and owned.pid not in killed
        assert orphan.wait(timeout=10) == -9
        assert owned.poll() is None
    finally:
        owned.kill()
        orphan.kill()


def test_thread_binding_gives_each_rank_its_own_cores():
    assert thread_binding(2, [0, 1]) == "0|1"
    assert thread_binding(2, list(range(8))) == "0-3|4-7"
    assert thread_binding(1, [0, 1]) == "0-1"
