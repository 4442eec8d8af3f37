"""The `plan` stage as a job runs it: the pool's layout and admin catalog entry from the
`PoolSpec`, the job's options from `StageContext.options`, and the failure that keeps what
would fit (plain pytest; no Django)."""

from __future__ import annotations

import json

import pytest

from engine.architecture import analyze_config
from engine.catalog import load_catalog
from engine.contract import PoolSpec, ReleaseRef, StageContext, StageFailed
from engine.registry import get_stage, stage_names
from engine.stages.plan.errors import PlanInputError
from engine.stages.plan.options import plan_options
from engine.stages.plan.run import run
from tests.engine.stages.realconfigs import load

GIB = 2**30


def analysis(name: str) -> dict:
    return analyze_config(load(name)).to_dict()


def context(pool: PoolSpec, name: str, options: dict | None = None) -> StageContext:
    return StageContext(
        release=ReleaseRef("huggingface", "https://huggingface.co", f"org/{name}", "abc"),
        pool=pool,
        previous={"analyze": analysis(name)},
        options=options or {},
    )


def pool(**fields) -> PoolSpec:
    return PoolSpec(**{"name": "gpus", "backend": "cuda", "queue": "pool.gpus", **fields})


def test_plan_runs_after_precision_with_small_time_limits():
    assert stage_names()[3:5] == ["precision", "plan"]
    plan = get_stage("plan")
    assert plan.title == "Plan the split (predicted)" and plan.description
    assert plan.soft_time_limit_s <= 30 < plan.time_limit_s <= 60
    # A job's options are checked by the stage's own checker when the job is created.
    assert plan.checked_options({"dtype": "bf16"}) == {"dtype": "bfloat16"}
    with pytest.raises(ValueError, match="the fetch stage takes no options"):
        get_stage("fetch").checked_options({"dtype": "bf16"})


def test_a_pool_layout_with_the_catalogs_devices_per_node():
    # devices_per_node left blank: the catalog's 8 per h200 node.
    result = run(context(pool(accelerator="h200"), "deepseek-ai__DeepSeek-V3"))
    assert result["fits"] is True
    assert (result["devices"], result["nodes"], result["pool"]["devices"]) == (8, 1, 8)
    assert result["catalog_version"] == load_catalog().version
    assert result["predicted"]["batch_1"]["decode_tokens_per_s"] > 0
    json.dumps(result, allow_nan=False)


def test_nothing_fits_fails_with_what_would_fit_as_the_result():
    with pytest.raises(StageFailed) as err:
        run(context(pool(accelerator="h100", devices_per_node=8), "deepseek-ai__DeepSeek-V3"))
    reason = err.value.reason
    assert reason.startswith("org/deepseek-ai__DeepSeek-V3 does not fit 8 x h100")
    assert "more devices would fit: 16 x h100" in reason
    result = err.value.result
    assert result["fits"] is False and result["reason"] == reason
    assert result["suggestions"] == {"devices": 16}
    assert result["accelerator"] == "h100"
    assert result["pool"] == {"devices_per_node": 8, "nodes": 1, "devices": 8}
    # The defaults the planner used, resolved: DeepSeek-V3's 163,840 tokens capped at 32,768.
    assert result["inputs"] == {"context_tokens": 32768, "concurrency": 4, "dtype": "checkpoint"}
    json.dumps(result, allow_nan=False)


def test_the_jobs_options_are_honoured():
    l4 = pool(accelerator="l4", devices_per_node=1)
    # 32,768 tokens x 4 sequences of Llama-3.1-8B's KV cache (16 GiB) do not fit 24 GB...
    with pytest.raises(StageFailed) as err:
        run(context(l4, "meta-llama__Llama-3.1-8B"))
    assert err.value.result["suggestions"]["context_tokens"] < 32768
    # ... one sequence of 4,096 tokens at bf16 does.
    options = {"context_tokens": 4096, "concurrency": 1, "dtype": "bf16"}
    result = run(context(l4, "meta-llama__Llama-3.1-8B", options))
    assert result["fits"] and result["devices"] == 1
    assert result["inputs"] == {
        "context_tokens": 4096,
        "concurrency": 1,
        "dtype": "bfloat16",
        "kv_dtype": "bfloat16",
    }
    assert result["memory_per_device_bytes"]["kv_cache"] == 131_072 * 4096
    # ... and an FP8 KV cache halves it, in the commands too.
    fp8 = run(context(l4, "meta-llama__Llama-3.1-8B", {**options, "kv_dtype": "fp8"}))
    assert fp8["memory_per_device_bytes"]["kv_cache"] == 65_536 * 4096
    assert "--kv-cache-dtype fp8" in fp8["artifacts"]["vllm"]


def test_bad_options_fail_the_stage_naming_the_option():
    with pytest.raises(StageFailed, match="context_tokens must be a positive integer"):
        run(context(pool(accelerator="h100"), "meta-llama__Llama-3.1-8B", {"context_tokens": 0}))
    with pytest.raises(StageFailed, match="unknown plan option"):
        run(context(pool(accelerator="h100"), "meta-llama__Llama-3.1-8B", {"batch": 4}))


def test_an_admin_catalog_entry_replaces_the_files():
    entry = load_catalog().accelerator("h100").to_dict()
    entry["memory_bytes"] = 141 * GIB  # a mechanism test, not a real H100
    result = run(
        context(pool(accelerator="h100", accelerator_entry=entry), "deepseek-ai__DeepSeek-V3")
    )
    assert result["fits"] and result["devices"] == 8
    assert result["memory_per_device_bytes"]["capacity"] == 141 * GIB
    assert "admin row h100" in result["catalog_version"]


def test_a_malformed_admin_entry_fails_clearly():
    entry = load_catalog().accelerator("h100").to_dict()
    del entry["sources"]["memory_bytes"]
    with pytest.raises(StageFailed, match="memory_bytes has no source"):
        run(context(pool(accelerator="h100", accelerator_entry=entry), "meta-llama__Llama-3.1-8B"))


def test_a_gpu_pool_without_an_accelerator_says_what_to_set():
    with pytest.raises(StageFailed) as err:
        run(context(pool(), "meta-llama__Llama-3.1-8B"))
    assert "names no accelerator kind" in err.value.reason
    assert "set the pool's accelerator" in err.value.reason
    assert err.value.result is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"accelerator": "tpu-v9"}, "unknown accelerator kind 'tpu-v9'; known kinds: "),
        ({"accelerator": "h100", "devices_per_node": 0}, "devices_per_node must be a positive"),
        ({"accelerator": "h100", "nodes": -1}, "nodes must be a positive integer"),
        ({"accelerator": "h100", "nodes": 10**9}, "implausibly large"),
    ],
)
def test_bad_pool_layouts_fail_clearly(fields, words):
    with pytest.raises(StageFailed, match=words):
        run(context(pool(**fields), "meta-llama__Llama-3.1-8B"))


def test_a_cpu_pool_is_the_workers_machine():
    cpu = PoolSpec(name="cpu", backend="cpu", queue="pool.cpu")
    try:
        result = run(context(cpu, "openai__gpt-oss-20b"))
    except StageFailed as err:  # a machine with less than ~22 GiB of memory
        result = err.result
    assert result["accelerator"] == "cpu"
    assert "worker host" in result["accelerator_name"]
    assert result["pool"]["devices"] == 1


def test_ten_trillion_parameters_answer_with_what_fits():
    config = load("deepseek-ai__DeepSeek-V3")
    config["n_routed_experts"] = 4096  # ~10.5T parameters
    ctx = StageContext(
        release=ReleaseRef("huggingface", "https://huggingface.co", "org/huge", "abc"),
        pool=pool(accelerator="h100"),
        previous={"analyze": analyze_config(config).to_dict()},
    )
    with pytest.raises(StageFailed) as err:
        run(ctx)
    assert err.value.result["suggestions"]["devices"] > 8


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (None, {}),
        ({}, {}),
        ({"context_tokens": None, "dtype": None}, {}),
        ({"dtype": "torch.float8_e4m3fn", "concurrency": 8}, {"dtype": "fp8", "concurrency": 8}),
    ],
)
def test_plan_options_normalise(options, expected):
    assert plan_options(options) == expected


@pytest.mark.parametrize(
    "options",
    [
        {"context_tokens": True},
        {"context_tokens": 1.5},
        {"concurrency": -1},
        {"context_tokens": 10**12},
        {"dtype": "fp3"},
        {"ctx": 1},
        "8192",
    ],
)
def test_plan_options_refuse(options):
    with pytest.raises(PlanInputError):
        plan_options(options)
