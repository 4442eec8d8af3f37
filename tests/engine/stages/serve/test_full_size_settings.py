"""The full-size run's settings, the rules that decide where it runs and at which TP degrees,
and what it reads from the engine, without launching one (test_full_size.py launches it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.architecture import analyze_config
from engine.contract import PoolSpec, ReleaseRef, StageContext
from engine.registry import get_stage
from engine.stages.plan.artifacts import vllm_command
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from engine.stages.plan.validity import Split
from engine.stages.serve.checkpoint import full_size_folder
from engine.stages.serve.engine_log import kv_cache_tokens
from engine.stages.serve.full_size import _kv_space_gib, mark_level_peaks, run_full_size
from engine.stages.serve.full_size_degrees import scaling, tp_degrees
from engine.stages.serve.full_size_settings import FullSizeSettings, Workload, full_size_settings
from engine.stages.serve.options import serve_options, serve_time_limits
from tests.engine.stages.realconfigs import load

TOKENIZER = Path(__file__).resolve().parents[3] / "data" / "tokenizers" / "qwen3"
GIB = 2**30


def settings_for(device="cpu", pool=None, **options) -> FullSizeSettings:
    return full_size_settings(device=device, pool_settings=pool, options=serve_options(options))


def test_the_cpu_pool_sweeps_short_workloads_that_finish_on_two_cores():
    settings = settings_for("cpu")
    assert settings.enabled and settings.disabled_by == ""
    assert settings.primary == Workload("primary", 128, 64)
    assert settings.workloads == (
        Workload("prefill-heavy", 256, 16),
        Workload("decode-heavy", 16, 256),
    )
    assert settings.max_concurrency == 4
    assert settings.requests_for([1, 2, 4]) == 4  # one wave at the top level, serial at 1
    assert settings.max_weight_bytes == 4 * GIB
    assert settings.time_budget_s == 1200
    assert settings.tp_sizes is None  # the plan's TP, then the scaling degrees (tp_degrees)


def test_an_accelerator_pool_sweeps_the_workloads_teams_publish():
    settings = settings_for("cuda:0")
    assert (settings.primary.input_tokens, settings.primary.output_tokens) == (1000, 1000)
    assert [(w.input_tokens, w.output_tokens) for w in settings.workloads] == [
        (2048, 128),
        (128, 2048),
    ]
    assert settings.max_concurrency == 64
    assert settings.requests_for([1, 2, 4]) is None  # four per concurrent slot
    assert settings.max_weight_bytes is None


def test_the_pool_overrides_the_device_and_the_job_the_pool():
    pool = {
        "input_tokens": 512,
        "output_tokens": 32,
        "decode_heavy": None,
        "max_concurrency": 8,
        "max_weight_bytes": None,
    }
    settings = settings_for("cpu", pool)
    assert settings.primary == Workload("primary", 512, 32)
    assert [w.label for w in settings.workloads] == ["prefill-heavy"]
    assert (settings.max_concurrency, settings.max_weight_bytes) == (8, None)
    job = settings_for(
        "cpu",
        pool,
        full_size_input_tokens=64,
        full_size_max_concurrency=2,
        full_size_requests_per_level=3,
        full_size_workloads=False,
        full_size_time_budget_s=300,
        full_size_tp_sizes=[1, 2],
    )
    assert job.primary == Workload("primary", 64, 32)
    assert job.workloads == ()
    assert (job.max_concurrency, job.requests_for([1, 2]), job.time_budget_s) == (2, 3, 300)
    assert job.tp_sizes == (2, 1)  # largest first: the first launch


def test_a_pool_turns_it_off_and_a_job_turns_it_back_on_or_off():
    assert settings_for("cpu", {"enabled": False}).disabled_by == "pool"
    assert settings_for("cpu", {"enabled": False}, full_size=True).enabled
    assert settings_for("cpu", full_size=False).disabled_by == "job"


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"full_size": "yes"}, "full_size must be true or false, got 'yes'"),
        (
            {"full_size_tp_sizes": [3]},
            "full_size_tp_sizes must be a list of distinct powers of two",
        ),
        ({"full_size_tp_sizes": [2, 2]}, "full_size_tp_sizes must be a list of distinct powers"),
        ({"full_size_time_budget_s": 10}, "full_size_time_budget_s must be a number from 60"),
        ({"full_size_output_tokens": 0}, "full_size_output_tokens must be a whole number from 1"),
        ({"full_size_workload": True}, "unknown serve option full_size_workload"),
    ],
)
def test_bad_job_options_are_refused_naming_the_option(options, words):
    with pytest.raises(ValueError) as refused:
        serve_options(options)
    assert words in str(refused.value)


def test_the_stage_limits_grow_by_the_full_size_budget():
    assert serve_time_limits({}) == (1500 + 1200, 1560 + 1200)
    assert serve_time_limits({"full_size_time_budget_s": 600}) == (2100, 2160)
    assert serve_time_limits({"full_size": False}) == (1500, 1560)
    serve = get_stage("serve")
    assert serve.time_limits_s({"full_size": False}) == (1500, 1560)
    assert serve.time_limits_s({"full_size": "no"}) == (2700, 2760)  # refused: the fixed ones


def _analysis(name):
    return analyze_config(load(name)).to_dict()


def test_smollm2s_nine_heads_refuse_tp2_with_the_rule():
    analysis = _analysis("HuggingFaceTB__SmolLM2-135M")
    planned = vllm_command(
        "HuggingFaceTB/SmolLM2-135M", Split(1, 1, 1, 1), "bfloat16", context_tokens=2048,
        max_num_seqs=4,
    )  # fmt: skip
    chosen, left_out = tp_degrees(
        settings=settings_for("cpu", full_size_tp_sizes=[2, 1]),
        plan={"tp": 1},
        planned=planned,
        kind="vllm",
        analysis=analysis,
        devices_held=2,
        device="cpu",
    )
    assert chosen == [1]
    rule = "TP 2 does not divide the 9 attention heads; TP 2 does not divide the 3 KV heads"
    assert left_out == [{"tp": 2, "reason": "invalid_split", "rule": rule}]


@pytest.mark.parametrize(
    ("name", "chosen", "refused"),
    [("Qwen__Qwen3-0.6B", [1, 2], []), ("HuggingFaceTB__SmolLM2-135M", [1], [2])],
)
def test_a_cpu_pool_measures_tp2_against_tp1_where_the_heads_split(name, chosen, refused):
    planned = vllm_command("org/m", Split(1, 1, 1, 1), "bfloat16", context_tokens=2048,
                           max_num_seqs=4)  # fmt: skip
    got, left_out = tp_degrees(
        settings=settings_for("cpu"),
        plan={"tp": 1},
        planned=planned,
        kind="vllm",
        analysis=_analysis(name),
        devices_held=2,
        device="cpu",
    )
    assert got == chosen
    assert [(e["tp"], e["reason"]) for e in left_out] == [(tp, "invalid_split") for tp in refused]


def _gpu_plan(name):
    analysis = _analysis(name)
    return analysis, plan_release(analysis, PoolLayout("h100", devices_per_node=8), release=name)


def test_a_smaller_degree_is_launched_only_where_the_weights_fit_a_device():
    analysis, plan = _gpu_plan("Qwen__Qwen2.5-72B-Instruct")
    planned = plan.to_dict()["artifacts"]["vllm"]
    assert (plan.split.tp, plan.split.pp) == (2, 2)
    chosen, left_out = tp_degrees(
        settings=settings_for("cuda:0"),
        plan=plan.to_dict(),
        planned=planned,
        kind="vllm",
        analysis=analysis,
        devices_held=8,
        device="cuda:0",
    )
    # 72.7 GB of bf16 weights and a 32k-token sequence's KV on one 80 GB H100: no.
    assert (chosen, left_out) == ([2], [{"tp": 1, "reason": "does_not_fit"}])


def test_asked_degrees_need_the_devices():
    analysis, plan = _gpu_plan("meta-llama__Llama-3.1-8B")
    planned = plan.to_dict()["artifacts"]["vllm"]
    chosen, left_out = tp_degrees(
        settings=settings_for("cuda:0", full_size_tp_sizes=[1, 4, 8]),
        plan=plan.to_dict(),
        planned=planned,
        kind="vllm",
        analysis=analysis,
        devices_held=4,
        device="cuda:0",
    )
    assert chosen == [4, 1]
    assert left_out == [{"tp": 8, "reason": "too_few_devices", "devices_needed": 8}]


def test_the_scaling_curve_is_per_device_against_the_smallest_degree():
    primary = [
        {"concurrency": 1, "output_tokens_per_s": 10.0, "errors": 0},
        {"concurrency": 2, "output_tokens_per_s": 30.0, "errors": 0},
    ]
    smaller = [
        {
            "tp": 1,
            "sweep": [
                {"concurrency": 1, "output_tokens_per_s": 8.0, "errors": 0},
                {"concurrency": 2, "output_tokens_per_s": 20.0, "errors": 1},  # failed: out
            ],
        }
    ]
    rows = scaling(2, primary, smaller, devices=lambda tp: tp)
    assert rows == [
        {
            "tp": 1,
            "concurrency": 1,
            "output_tokens_per_s": 8.0,
            "baseline_tp": 1,
            "speedup": 1.0,
            "efficiency": 1.0,
        },
        {
            "tp": 2,
            "concurrency": 1,
            "output_tokens_per_s": 10.0,
            "baseline_tp": 1,
            "speedup": 1.25,
            "efficiency": 0.625,
        },
    ]
    # On a cpu pool both degrees run on the same cores: the efficiency is the speedup.
    same_cores = scaling(2, primary, smaller, devices=lambda tp: 2)
    assert same_cores[1]["efficiency"] == same_cores[1]["speedup"] == 1.25
    assert scaling(2, primary, [], devices=lambda tp: tp) == []


def test_each_level_gets_the_engines_peaks_of_the_scrapes_during_it():
    series = [
        {"t_s": 0.0, "kv_cache_usage": 0.0, "running": 0, "waiting": 0},
        {"t_s": 0.5, "kv_cache_usage": 0.01, "running": 1, "waiting": 0},
        {"t_s": 1.0, "kv_cache_usage": 0.02, "running": 1, "waiting": 0},  # level 1 ends here
        {"t_s": 1.5, "kv_cache_usage": 0.05, "running": 2, "waiting": 3},
        {"t_s": 2.0, "kv_cache_usage": 0.04, "running": 2, "waiting": 1},
        {"t_s": 9.0, "kv_cache_usage": 0.9, "running": 9, "waiting": 9},  # after the sweep
    ]
    points = [{"concurrency": 1}, {"concurrency": 2}, {"concurrency": 4}]
    mark_level_peaks(points, [1.0, 2.2, 2.3], 0.0, series)
    assert [(p["kv_cache_usage_peak"], p["running_peak"], p["waiting_peak"]) for p in points] == [
        (0.02, 1, 0),
        (0.05, 2, 3),
        (None, None, None),
    ]  # no scrape in the last 0.1 s


def test_the_engines_kv_cache_line_is_read():
    line = (
        "(EngineCore pid=10281) INFO 12-07 18:11:31 [kv_cache_utils.py:2327] CPU KV cache size: "
        "46,592 tokens, Maximum concurrency for 2,048 tokens per request: 22.75x"
    )
    assert kv_cache_tokens(f"first\n{line}\nlast\n") == 46_592
    assert kv_cache_tokens("GPU KV cache size: 1,234,560 tokens\n") == 1_234_560
    assert kv_cache_tokens("no cache line\n") is None


def test_a_cpu_pools_kv_cache_grows_to_hold_one_sequence():
    # Llama-3.2-1B: 16 layers x 8 KV heads x 64 x 2 x 2 bytes = 32 KiB a token; 32k tokens
    # fill 1 GiB exactly, so with room it needs 2.
    assert _kv_space_gib({}, 32_768, 32_768) == 2.0
    assert _kv_space_gib({"env": {"VLLM_CPU_KVCACHE_SPACE": "4"}}, 32_768, 32_768) == 4.0
    assert _kv_space_gib({}, 23_040, 2048) == 1.0  # SmolLM2 at 2k: the pool's 1 GiB holds it
    assert _kv_space_gib({}, None, 2048) is None


def test_the_full_size_folder_holds_the_config_and_tokenizer_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path))
    config = load("HuggingFaceTB__SmolLM2-135M")
    folder = full_size_folder(config, TOKENIZER)
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert json.loads((folder / "config.json").read_text()) == config
    assert full_size_folder(config, TOKENIZER) == folder  # content-addressed, written once
    other = full_size_folder({**config, "num_hidden_layers": 29}, TOKENIZER)
    assert other != folder


def _context(repo_id, config, *, plan, pool=None, tokenizer=True, options=None):
    pool = pool or PoolSpec(name="cpu", backend="cpu", queue="cpu", engine={"kind": "vllm"})
    fetch = {"config": config, "tokenizer": {"dir": str(TOKENIZER)} if tokenizer else {}}
    return StageContext(
        release=ReleaseRef("mirror", "", repo_id, "main"),
        pool=pool,
        previous={"fetch": fetch, "plan": plan},
        options=serve_options(options or {}),
    )


def _run(ctx, planned):
    processes = []
    result = run_full_size(
        ctx,
        engine=dict(ctx.pool.engine),
        planned=planned,
        settings=full_size_settings(
            device=ctx.pool.device, pool_settings=None, options=ctx.options
        ),
        python="/no/engine/python",
        version="0.32.0",
        processes=processes,
        deadline=0.0,
    )
    assert processes == []  # nothing was launched
    return result


def _planned(repo_id, tp=1):
    return vllm_command(
        repo_id, Split(tp, 1, 1, 1), "bfloat16", context_tokens=2048, max_num_seqs=4
    )


def test_a_release_too_large_for_the_cpu_pool_is_skipped_with_its_size():
    repo = "Qwen/Qwen3-235B-A22B-Instruct-2507"
    config = load("Qwen__Qwen3-235B-A22B-Instruct-2507")
    result = _run(_context(repo, config, plan={"tp": 1}), _planned(repo))
    assert (result["status"], result["reason"]) == ("skipped", "over_weight_cap")
    assert result["weight_bytes"] == 2 * 235_093_634_560  # bf16, every parameter
    assert result["max_weight_bytes"] == 4 * GIB
    assert result["model"]["num_hidden_layers"] == 94


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"plan": {"fits": False}}, "plan_does_not_fit"),
        ({"plan": {"tp": 1}, "tokenizer": False}, "no_tokenizer"),
        ({"plan": {"tp": 1}, "options": {"full_size": False}}, "disabled"),
    ],
)
def test_where_the_plan_does_not_fit_or_nothing_can_be_served_it_is_skipped(kwargs, reason):
    repo = "HuggingFaceTB/SmolLM2-135M"
    config = load("HuggingFaceTB__SmolLM2-135M")
    result = _run(_context(repo, config, **kwargs), _planned(repo))
    assert (result["status"], result["reason"], result["load_format"]) == (
        "skipped",
        reason,
        "dummy",
    )


def test_a_plan_needing_more_devices_than_the_worker_holds_is_skipped(monkeypatch):
    from engine.stages.serve import degrees

    monkeypatch.setattr(degrees, "worker_cores", lambda: [0, 1])
    repo = "meta-llama/Llama-3.1-8B"
    result = _run(
        _context(repo, load("meta-llama__Llama-3.1-8B"), plan={"tp": 4}), _planned(repo, 4)
    )
    assert (result["reason"], result["devices_needed"], result["devices_held"]) == (
        "too_few_devices",
        4,
        2,
    )
