"""The precision stage: real metrics on the CPU pool, failures that name their cause (no Django)."""

from __future__ import annotations

import json

import pytest

from tests.stages.realconfigs import load
from workers.stages import precision
from workers.stages.base import PoolSpec, ReleaseRef, StageContext, StageFailed
from workers.stages.precision import measure_precision
from workers.stages.twin import build_twin

CPU = PoolSpec(name="cpu", backend="cpu", queue="cpu")
CONFIGS = (
    "meta-llama__Llama-3.1-8B",
    "Qwen__Qwen3-235B-A22B-Instruct-2507",
    "deepseek-ai__DeepSeek-V3",
    "openai__gpt-oss-20b",
)
METRICS = (
    "max_abs_error",
    "mean_abs_error",
    "cosine_similarity",
    "top1_agreement",
    "kl_divergence",
)


@pytest.fixture(scope="module")
def twins():
    return {name: build_twin(load(name)) for name in CONFIGS}


@pytest.fixture(scope="module")
def on_cpu(twins):
    return {name: measure_precision(twin, CPU) for name, twin in twins.items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_bf16_and_fp16_pass_on_cpu_with_measured_metrics(on_cpu, twins, name):
    result = on_cpu[name]
    json.dumps(result, allow_nan=False)
    assert result["passed"] is True
    assert result["reference"] == {"device": "cpu", "dtype": "float32"}
    bf16, fp16 = result["dtypes"]["bfloat16"], result["dtypes"]["float16"]
    for entry in (bf16, fp16):
        assert entry["passed"] is True
        assert set(METRICS) <= set(entry)
        assert 0 < entry["mean_abs_error"] < entry["max_abs_error"] < 0.2
        assert 0.99 < entry["cosine_similarity"] < 1.0
        assert entry["top1_agreement"] >= entry["thresholds"]["min_top1_agreement"]
        assert 0 < entry["kl_divergence"] < entry["thresholds"]["max_kl_divergence"]
        assert entry["positions"] == 2 * (16 + 4)
    # float16 keeps 3 more significand bits than bfloat16: its errors are measurably smaller
    assert fp16["mean_abs_error"] < bf16["mean_abs_error"] / 3
    assert fp16["kl_divergence"] < bf16["kl_divergence"]
    layers = twins[name].config.num_hidden_layers
    assert {row["layer"] for row in bf16["layers"]} == set(range(layers + 1))
    assert {"attention", "norm", "output"} <= {row["module"] for row in bf16["layers"]}
    assert bf16["layers"][0]["relative_error"] < 2**-7  # the first norm: one rounding


def test_moe_layers_are_compared_as_moe(on_cpu):
    rows = on_cpu["deepseek-ai__DeepSeek-V3"]["dtypes"]["bfloat16"]["layers"]
    kinds = {(row["layer"], row["module"]) for row in rows}
    assert (0, "mlp") in kinds and (1, "moe") in kinds


def test_int8_weight_only_and_fp8_run_with_torch_kernels(twins):
    pool = PoolSpec(
        name="cpu", backend="cpu", queue="cpu", dtypes=("int8", "float8_e4m3fn", "int4")
    )
    result = measure_precision(twins["meta-llama__Llama-3.1-8B"], pool)
    int8, fp8 = result["dtypes"]["int8"], result["dtypes"]["float8_e4m3fn"]
    assert int8["passed"] and fp8["passed"]
    assert int8["mean_abs_error"] < fp8["mean_abs_error"]  # 8 bits per weight vs 4 significant
    assert "nn.Linear layers quantized to int8" in int8["notes"][0]
    assert "int4" in result["skipped_dtypes"]


def test_a_perturbed_norm_fails_naming_layer_2_and_the_norm(twins):
    with pytest.raises(StageFailed) as err:
        measure_precision(
            twins["meta-llama__Llama-3.1-8B"],
            CPU,
            perturb={"layer": 2, "module": "post_attention_layernorm", "eps": 1e-1},
        )
    reason = err.value.reason
    assert reason.startswith("bfloat16: top-1 agreement")
    assert "first divergent layer 2 (norm: model.layers.2.post_attention_layernorm" in reason
    entry = err.value.result["dtypes"]["bfloat16"]
    assert entry["passed"] is False
    assert (entry["first_divergent_layer"], entry["first_divergent_module"]) == (2, "norm")
    before = [r["relative_error"] for r in entry["layers"] if r["layer"] < 2]
    assert max(before) < 0.05  # the layers before it are untouched


def test_fp16_overflow_to_inf_fails_with_that_reason():
    # a routed scaling factor of 1e7 overflows float16's ±65504 range (not bfloat16's)
    config = dict(load("deepseek-ai__DeepSeek-V3"), routed_scaling_factor=1e7)
    pool = PoolSpec(name="cpu", backend="cpu", queue="cpu", dtypes=("bfloat16", "float16"))
    with pytest.raises(StageFailed) as err:
        measure_precision(build_twin(config), pool)
    assert err.value.reason.startswith("float16: the target's logits hold NaN/Inf")
    assert "first non-finite hidden state at layer" in err.value.reason
    result = err.value.result
    json.dumps(result, allow_nan=False)
    assert result["dtypes"]["bfloat16"]["passed"] is True
    assert result["dtypes"]["float16"]["non_finite_values"] > 0


def test_pool_thresholds_override_the_defaults(twins):
    pool = PoolSpec(
        name="strict",
        backend="cpu",
        queue="cpu",
        dtypes=("bfloat16",),
        precision_thresholds={"bfloat16": {"max_kl_divergence": 1e-12}},
    )
    with pytest.raises(StageFailed, match=r"bfloat16: KL divergence [\d.e-]+ > 1e-12"):
        measure_precision(twins["meta-llama__Llama-3.1-8B"], pool)


def test_an_absent_device_fails(twins):
    gpu = PoolSpec(name="h100", backend="cuda", queue="h100", device="cuda:0")
    with pytest.raises(StageFailed, match="absent on this worker"):
        measure_precision(twins["meta-llama__Llama-3.1-8B"], gpu)


def test_run_and_definition():
    ctx = StageContext(
        release=ReleaseRef("mirror", "/nowhere", "meta-llama/Llama-3.1-8B", "main"),
        pool=CPU,
        previous={"fetch": {"config": load("meta-llama__Llama-3.1-8B")}},
    )
    assert precision.run(ctx)["passed"] is True
