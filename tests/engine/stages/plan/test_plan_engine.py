"""Memory, fit choice, communication, roofline, scaling, artifacts and the stage (plain
pytest; no Django)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import yaml

from engine.architecture import analyze_config
from engine.contract import PoolSpec, ReleaseRef, StageContext, StageFailed
from engine.stages.plan.errors import NoFittingPlan, PlanInputError
from engine.stages.plan.fits import fit_for
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.memory import GPU_MEMORY_UTILIZATION
from engine.stages.plan.planner import plan_release
from engine.stages.plan.run import run
from tests.engine.stages.realconfigs import load


def analysis(name: str, **overrides) -> dict:
    config = load(name)
    config.update(overrides)
    return analyze_config(config).to_dict()


H100 = PoolLayout("h100", devices_per_node=8, nodes=1)


def walk(value, path=""):
    if isinstance(value, dict):
        yield path, value
        for k, v in value.items():
            yield from walk(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from walk(v, f"{path}[{i}]")


def test_to_dict_shape_and_json():
    plan = plan_release(analysis("Qwen__Qwen2.5-72B-Instruct"), H100).to_dict()
    for key in (
        "tp",
        "pp",
        "ep",
        "dp",
        "devices",
        "nodes",
        "memory_per_device_bytes",
        "fits",
        "predicted",
        "runners_up",
        "communication",
        "scaling",
        "artifacts",
        "assumptions",
        "inputs",
    ):
        assert key in plan
    mem = plan["memory_per_device_bytes"]
    for part in ("weights", "kv_cache", "activations_workspace", "runtime_overhead", "free"):
        assert mem[part] >= 0
    assert mem["budget"] == round(mem["capacity"] * GPU_MEMORY_UTILIZATION)
    assert plan["inputs"] == {
        "context_tokens": 32768,
        "concurrency": 4,
        "dtype": "checkpoint",
        "kv_dtype": "bfloat16",
    }
    json.dumps(plan, allow_nan=False)  # storable: no NaN/Infinity


def test_weights_at_the_checkpoint_dtype_equal_the_analysis_bytes():
    a = analysis("meta-llama__Llama-3.1-8B")
    plan = plan_release(a, H100).to_dict()
    assert plan["devices"] == 1
    assert plan["memory_per_device_bytes"]["weights"] == a["weight_bytes"]
    by_dtype = plan["memory_weights_by_dtype_bytes"]
    assert by_dtype["fp8"] < by_dtype["bfloat16"] == a["weight_bytes"]


def test_kv_cache_counts_context_times_concurrency():
    a = analysis("meta-llama__Llama-3.1-8B")
    plan = plan_release(a, H100, context_tokens=4096, concurrency=3).to_dict()
    assert plan["memory_per_device_bytes"]["kv_cache"] == 131_072 * 4096 * 3


def test_sliding_layers_keep_only_their_window():
    # gpt-oss: 12 of 24 layers slide over 128 tokens (config layer_types / sliding_window).
    a = analysis("openai__gpt-oss-20b")
    plan = plan_release(a, H100, context_tokens=10_000, concurrency=1).to_dict()
    per_layer = 49_152 // 24
    assert plan["memory_per_device_bytes"]["kv_cache"] == 12 * per_layer * (10_000 + 128)


def test_fewest_devices_win_and_runners_up_say_why():
    plan = plan_release(analysis("Qwen__Qwen2.5-72B-Instruct"), H100).to_dict()
    assert plan["devices"] == 4
    # Of the 4-device splits that fit, the one with the most predicted tokens/s at the
    # workload's throughput-optimal load wins (TP2 x DP2: half the all-reduces of TP4).
    best = plan["predicted"]["workload"]["max_load"]["output_tokens_per_s"]
    same = [r for r in plan["runners_up"] if r["fits"] and r["devices"] == 4]
    assert same and all(r["decode_tokens_per_s"] < best for r in same)
    reasons = [r["why_lost"] for r in plan["runners_up"]]
    assert any(r.startswith("fewer devices (2) but does not fit") for r in reasons)
    assert all(r["why_lost"] for r in plan["runners_up"])


def test_every_prediction_is_labelled_predicted():
    plan = plan_release(analysis("deepseek-ai__DeepSeek-V3"), PoolLayout("h200", 8)).to_dict()
    pred = plan["predicted"]
    assert pred["available"]
    assert pred["batch_1"]["concurrent_sequences"] == 1
    assert pred["largest_batch"]["concurrent_sequences"] == pred["largest_batch_sequences"] >= 1
    assert pred["batch_1"]["tpot_s"] == pytest.approx(1 / pred["batch_1"]["decode_tokens_per_s"])
    for point in pred["decode_curve"] + pred["prefill"] + plan["scaling"]:
        assert point["kind"] == "predicted"
    ttfts = [p["ttft_s"] for p in pred["prefill"]]
    assert ttfts == sorted(ttfts)


def test_decode_batch_1_is_bandwidth_bound():
    # Pope et al. 2022: batch-1 decode time >= bytes streamed / memory bandwidth; the plan's
    # is that at the fitted achievable bandwidth, plus the KV cache and fixed costs.
    a = analysis("meta-llama__Llama-3.1-8B")
    plan = plan_release(a, H100, context_tokens=1024, concurrency=1).to_dict()
    b1 = plan["predicted"]["batch_1"]
    streamed = a["weight_bytes"] - a["embedding_params"] * 2
    lower = streamed / 3.35e12
    fit = fit_for("h100", "vllm")
    assert plan["predicted"]["fit"]["source"] == fit.source
    eff = fit.efficiency
    isl, osl = (
        plan["predicted"]["workload"]["input_tokens"],
        plan["predicted"]["workload"]["output_tokens"],
    )
    kv = (isl + osl / 2) * 131_072
    fixed = eff.step_s + 32 * eff.layer_s
    assert b1["tpot_s"] >= lower
    assert b1["tpot_s"] == pytest.approx(
        fixed + (streamed + kv) / (3.35e12 * eff.bandwidth), rel=0.01
    )


def test_communication_of_tp_and_ep():
    plan = plan_release(analysis("Qwen__Qwen2.5-72B-Instruct"), H100).to_dict()
    comm = plan["communication"]
    tp = plan["tp"]
    # 2 all-reduces per layer x 80 layers x hidden 8192 x 2 B x 2(TP-1)/TP
    assert tp > 1
    assert comm["tp_allreduce_bytes_per_token"] == round(2 * 80 * 8192 * 2 * 2 * (tp - 1) / tp)
    assert comm["ep_alltoall_bytes_per_token"] == 0 and not comm["crosses_nodes"]
    two_nodes = plan_release(
        analysis("deepseek-ai__DeepSeek-V3"), PoolLayout("h100", 8, nodes=2)
    ).to_dict()
    assert two_nodes["communication"]["crosses_nodes"]


def test_scaling_curve_over_nodes():
    plan = plan_release(analysis("meta-llama__Llama-3.1-8B"), PoolLayout("h100", 8, nodes=2))
    rows = plan.to_dict()["scaling"]
    assert [r["devices"] for r in rows][:3] == [1, 8, 16]
    assert rows[0]["efficiency_per_device"] == 1.0
    assert all(r["decode_tokens_per_s"] > 0 for r in rows)
    assert [r["within_pool"] for r in rows][:3] == [True, True, True]


def test_artifacts_carry_the_split():
    plan = plan_release(
        analysis("deepseek-ai__DeepSeek-V3"), PoolLayout("h100", 8, nodes=2)
    ).to_dict()
    art = plan["artifacts"]
    assert f"--tensor-parallel-size {plan['tp']}" in art["vllm"]
    assert f"--pipeline-parallel-size {plan['pp']}" in art["vllm"]
    assert "--model-path" in art["sglang"] and "--nnodes 2" in art["sglang"]
    doc = yaml.safe_load(art["kubernetes_deployment"])
    assert doc["kind"] == "Deployment"
    container = doc["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TENSOR_PARALLEL_SIZE"] == str(plan["tp"])
    assert env["PIPELINE_PARALLEL_SIZE"] == str(plan["pp"])
    volumes = doc["spec"]["template"]["spec"]["volumes"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in volumes


def test_fp8_serving_uses_the_quantization_flag():
    plan = plan_release(analysis("Qwen__Qwen2.5-72B-Instruct"), H100, dtype="fp8").to_dict()
    assert "--quantization fp8" in plan["artifacts"]["vllm"]
    assert plan["inputs"]["dtype"] == "fp8"


def test_no_prediction_where_the_datasheet_is_silent():
    plan = plan_release(analysis("meta-llama__Llama-3.1-8B"), PoolLayout("ascend-910b", 8))
    pred = plan.to_dict()["predicted"]
    assert pred == {
        "kind": "predicted",
        "available": False,
        "reason": pred["reason"],
    }
    assert "memory bandwidth" in pred["reason"]


def test_no_fitting_plan_is_a_value_error_naming_what_would_fit():
    a = analysis("meta-llama__Llama-3.1-8B")
    with pytest.raises(ValueError) as err:
        plan_release(a, PoolLayout("l4", 1), context_tokens=131072, concurrency=8)
    assert isinstance(err.value, NoFittingPlan)
    message = str(err.value)
    assert "more devices would fit" in message and "smaller context" in message


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"hidden_size": 0}, "hidden_size"),
        ({"num_layers": -3}, "num_layers"),
        ({"num_layers": 5_000_000}, "implausibly large"),
        ({"num_attention_heads": 0}, "num_attention_heads"),
        ({"hidden_size": 4097, "head_dim": 128}, "not divisible"),
        ({"num_kv_heads": 3}, "multiple of num_kv_heads"),
        ({"total_params": 10}, "inconsistent"),
    ],
)
def test_bad_analysis_is_a_clear_error(overrides, words):
    a = analysis("meta-llama__Llama-3.1-8B")
    a.update(overrides)
    with pytest.raises(PlanInputError, match=words):
        plan_release(a, H100)


@pytest.mark.parametrize(
    "layout",
    [
        PoolLayout("h100", devices_per_node=0),
        PoolLayout("h100", devices_per_node=8, nodes=0),
        PoolLayout("h100", devices_per_node=-8),
        PoolLayout("h100", devices_per_node=8, nodes=10**9),
    ],
)
def test_pool_without_devices_is_a_clear_error(layout):
    with pytest.raises(PlanInputError, match="pool"):
        plan_release(analysis("meta-llama__Llama-3.1-8B"), layout)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"context_tokens": 0}, "context_tokens"),
        ({"concurrency": -1}, "concurrency"),
        ({"dtype": "float3"}, "unknown serving dtype"),
    ],
)
def test_bad_options_are_clear_errors(kwargs, words):
    with pytest.raises(PlanInputError, match=words):
        plan_release(analysis("meta-llama__Llama-3.1-8B"), H100, **kwargs)


def ten_trillion_config() -> dict:
    """DeepSeek-V3's shape with 4,096 routed experts: ~10.5T parameters."""
    config = load("deepseek-ai__DeepSeek-V3")
    config["n_routed_experts"] = 4096
    return config


def test_ten_trillion_parameters_plan_or_say_what_fits():
    a = analyze_config(ten_trillion_config()).to_dict()
    assert a["total_params"] > 10e12
    with pytest.raises(NoFittingPlan) as err:
        plan_release(a, H100)
    needed = err.value.suggestions["devices"]
    plan = plan_release(a, PoolLayout("h100", 8, nodes=math.ceil(needed / 8)))
    assert plan.to_dict()["devices"] == needed


def context(pool, previous) -> StageContext:
    return StageContext(
        release=ReleaseRef("huggingface", "https://huggingface.co", "org/model", "abc"),
        pool=pool,
        previous=previous,
    )


def test_stage_plans_from_the_analyze_result():
    pool = SimpleNamespace(
        name="h100-pool", backend="cuda", accelerator="h100", devices_per_node=8, nodes=1
    )
    result = run(context(pool, {"analyze": analysis("Qwen__Qwen2.5-72B-Instruct")}))
    assert result["devices"] == 4 and result["release"] == "org/model"
    assert "vllm serve org/model" in result["artifacts"]["vllm"]
    json.dumps(result, allow_nan=False)


def test_stage_without_a_pool_layout_fails_clearly():
    pool = PoolSpec(name="gpu-pool", backend="cuda", queue="gpu")
    with pytest.raises(StageFailed, match="accelerator"):
        run(context(pool, {"analyze": analysis("meta-llama__Llama-3.1-8B")}))


def test_stage_turns_no_fit_into_stage_failed():
    pool = SimpleNamespace(name="h100", backend="cuda", accelerator="h100", devices_per_node=8)
    with pytest.raises(StageFailed, match="more devices would fit"):
        run(context(pool, {"analyze": analysis("moonshotai__Kimi-K2-Instruct")}))


def test_stage_without_analysis_fails():
    pool = SimpleNamespace(name="h100", backend="cuda", accelerator="h100", devices_per_node=8)
    with pytest.raises(StageFailed, match="analyze"):
        run(context(pool, {}))


def test_cpu_pool_plans_on_the_machine_itself():
    pool = PoolSpec(name="cpu", backend="cpu", queue="cpu")
    config = load("meta-llama__Llama-3.1-8B")
    config.update(hidden_size=256, intermediate_size=512, num_hidden_layers=2, vocab_size=1000)
    config.update(num_attention_heads=4, num_key_value_heads=2)
    result = run(context(pool, {"analyze": analyze_config(config).to_dict()}))
    assert result["accelerator"] == "cpu" and result["devices"] == 1
    assert result["predicted"]["available"] is False


def test_an_fp8_checkpoint_on_a_device_without_fp8_is_planned_dequantized_and_says_so():
    """A100 has no FP8 unit (catalog dtypes; vLLM's fp8 W8A8 needs compute capability 8.9):
    the DeepSeek-V3 FP8 checkpoint is planned at bf16, twice its FP8 weight bytes."""
    analysis = analyze_config(load("deepseek-ai__DeepSeek-V3")).to_dict()
    plan = plan_release(analysis, PoolLayout("a100-80gb", 8, nodes=8)).to_dict()
    assert plan["dtype"] == "bfloat16"
    assert any("a100-80gb has no FP8" in note for note in plan["notes"])
    fp8 = plan_release(analysis, PoolLayout("h100", 8, nodes=8)).to_dict()
    assert fp8["dtype"] == "checkpoint"
    with pytest.raises(PlanInputError, match=r"a100-80gb .* does not serve fp8"):
        plan_release(analysis, PoolLayout("a100-80gb", 8, nodes=8), dtype="fp8")


def test_a_partial_node_grows_into_whole_nodes_and_context_suggestions_stay_in_the_window():
    llama = analyze_config(load("meta-llama__Llama-3.1-8B")).to_dict()
    with pytest.raises(NoFittingPlan) as info:
        plan_release(llama, PoolLayout("l4", 1), context_tokens=1_000_000)
    assert info.value.suggestions["context_tokens"] <= llama["max_position_embeddings"]
    deepseek = analyze_config(load("deepseek-ai__DeepSeek-V3")).to_dict()
    with pytest.raises(
        NoFittingPlan, match=r"more devices would fit: \d+ x h100 \(\d+ nodes of 8\)"
    ):
        plan_release(deepseek, PoolLayout("h100", 1))


def test_an_fp8_kv_cache_is_in_the_launch_commands_and_the_inputs():
    plan = plan_release(analysis("meta-llama__Llama-3.1-8B"), H100, kv_dtype="fp8").to_dict()
    assert "--kv-cache-dtype fp8 " in plan["artifacts"]["vllm"]
    assert "--kv-cache-dtype fp8_e4m3 " in plan["artifacts"]["sglang"]
    assert "--kv-cache-dtype fp8" in plan["artifacts"]["kubernetes_deployment"]
    assert plan["inputs"]["kv_dtype"] == "fp8"
    default = plan_release(analysis("meta-llama__Llama-3.1-8B"), H100).to_dict()
    assert "--kv-cache-dtype" not in default["artifacts"]["vllm"]
    assert default["inputs"]["kv_dtype"] == "bfloat16"
