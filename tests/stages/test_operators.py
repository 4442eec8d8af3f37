"""The operators stage on the CPU pool and against a real manifest file (no Django)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.stages.realconfigs import load
from workers.stages import operators
from workers.stages.base import PoolSpec, ReleaseRef, StageContext, StageFailed
from workers.stages.operators import check_torch_backend, measure_operators
from workers.stages.twin import build_twin

MANIFEST = Path(operators.__file__).resolve().parent.parent / "manifests" / "example-npu.json"
CPU = PoolSpec(name="cpu", backend="cpu", queue="cpu")
CONFIGS = (
    "meta-llama__Llama-3.1-8B",
    "Qwen__Qwen2.5-72B-Instruct",
    "Qwen__Qwen3-235B-A22B-Instruct-2507",
    "deepseek-ai__DeepSeek-V3",
    "moonshotai__Kimi-K2-Instruct",
    "openai__gpt-oss-20b",
)


@pytest.fixture(scope="module")
def twins():
    return {name: build_twin(load(name)) for name in CONFIGS}


@pytest.fixture(scope="module")
def on_cpu(twins):
    return {name: measure_operators(twin, CPU) for name, twin in twins.items()}


def ops(result) -> dict:
    return {op["name"]: op for op in result["operators"]}


@pytest.mark.parametrize("name", CONFIGS)
def test_every_twin_records_covered_operators_on_the_cpu_pool(on_cpu, name):
    result = on_cpu[name]
    json.dumps(result, allow_nan=False)
    assert result["device"] == "cpu" and result["dtype"] == "bfloat16"
    assert result["missing"] == [] and result["counts"]["fallback"] == 0
    assert result["counts"]["covered"] == len(result["operators"]) > 15
    for op in result["operators"]:
        assert re.fullmatch(r"\w+::\w+\.\w+", op["name"]), op["name"]
        assert op["status"] == "covered" and op["dtypes"] and op["feature"]
    recorded = ops(result)
    assert "aten::embedding.default" in recorded
    assert "bfloat16" in recorded["aten::embedding.default"]["dtypes"]
    assert "argmax" not in " ".join(recorded)  # the decode loop's own argmax is not the model's


def test_gpt_oss_records_the_sinks_softmax_path_and_sliding_masks(on_cpu):
    recorded = ops(on_cpu["openai__gpt-oss-20b"])
    # eager attention with sinks: concat the sink logits, subtract the max, softmax, drop sinks
    for name in ("aten::cat.default", "aten::max.dim", "aten::_softmax.default"):
        assert "attention sinks" in recorded[name]["feature"], name
    assert (
        "sliding-window attention (GQA) with attention sinks"
        in recorded["aten::bmm.default"]["feature"]
    )
    assert "sliding-window masks" in recorded["aten::bitwise_and.Tensor"]["feature"]
    assert "yarn RoPE" in recorded["aten::cos.default"]["feature"]
    assert "MoE experts (grouped GEMM)" in recorded["aten::_grouped_mm.default"]["feature"]


def test_deepseek_v3_records_sigmoid_grouped_routing_and_mla(on_cpu):
    recorded = ops(on_cpu["deepseek-ai__DeepSeek-V3"])
    routing = "MoE routing (sigmoid scores, top-8, grouped top-k, noaux_tc)"
    assert routing in recorded["aten::sigmoid.default"]["feature"]
    assert routing in recorded["aten::topk.default"]["feature"]
    assert "float32" in recorded["aten::topk.default"]["dtypes"]  # the router scores in float32
    assert "MLA projections" in recorded["aten::mm.default"]["feature"]
    assert "yarn RoPE" in recorded["aten::sin.default"]["feature"]


def test_llama_maps_rope_to_llama3(on_cpu):
    recorded = ops(on_cpu["meta-llama__Llama-3.1-8B"])
    assert recorded["aten::cos.default"]["feature"] == "llama3 RoPE"
    assert "aten::_grouped_mm.default" not in recorded


def test_a_real_manifest_lacking_grouped_gemm_reports_it_with_its_feature(twins):
    manifest = json.loads(MANIFEST.read_text())
    npu = PoolSpec(name="npu-x1", backend="manifest", queue="npu", operator_manifest=manifest)
    result = measure_operators(twins["deepseek-ai__DeepSeek-V3"], npu)
    assert result["missing"] == ["aten::_grouped_mm.default"]
    missing = result["operators"][0]
    assert missing["status"] == "missing" and missing["feature"] == "MoE experts (grouped GEMM)"
    assert result["notes"] == [
        "MoE experts (grouped GEMM) needs aten::_grouped_mm.default, missing on pool npu-x1"
    ]
    assert result["checked_against"] == "manifest"
    assert result["counts"] == {
        "covered": len(result["operators"]) - 1,
        "missing": 1,
        "fallback": 0,
    }


def test_the_manifest_reports_a_dtype_it_lacks(twins):
    manifest = json.loads(MANIFEST.read_text())
    npu = PoolSpec(name="npu-x1", backend="manifest", queue="npu", operator_manifest=manifest)
    # gpt-oss routes on bfloat16 router logits (Qwen3 and DeepSeek upcast to float32 first)
    result = measure_operators(twins["openai__gpt-oss-20b"], npu)
    topk = ops(result)["aten::topk.default"]
    assert topk["status"] == "missing" and topk["missing_dtypes"] == ["bfloat16"]
    assert (
        "MoE routing (softmax scores, top-4) needs aten::topk.default for bfloat16, missing on "
        "pool npu-x1"
    ) in result["notes"]


def test_a_dense_model_is_fully_covered_by_the_manifest(twins):
    manifest = json.loads(MANIFEST.read_text())
    npu = PoolSpec(name="npu-x1", backend="manifest", queue="npu", operator_manifest=manifest)
    assert measure_operators(twins["meta-llama__Llama-3.1-8B"], npu)["missing"] == []


def test_dispatcher_check_uses_composite_kernels():
    assert check_torch_backend("aten::mm.default", {"cpu"}, "CPU") == "covered"
    # aten::_grouped_mm has only a CompositeExplicitAutograd kernel in torch 2.13
    assert check_torch_backend("aten::_grouped_mm.default", {"cpu"}, "CPU") == "covered"


def test_an_absent_device_fails_the_stage(twins):
    gpu = PoolSpec(name="h100", backend="cuda", queue="h100", device="cuda:0")
    with pytest.raises(StageFailed, match=r"pool h100's device cuda:0 is absent on this worker"):
        measure_operators(twins["meta-llama__Llama-3.1-8B"], gpu)


def test_run_reads_the_fetched_config_and_definition_fits():
    ctx = StageContext(
        release=ReleaseRef("mirror", "/nowhere", "openai/gpt-oss-20b", "main"),
        pool=CPU,
        previous={"fetch": {"config": load("openai__gpt-oss-20b")}},
    )
    result = operators.run(ctx)
    assert result["twin"]["class"] == "GptOssForCausalLM"
