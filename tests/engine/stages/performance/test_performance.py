"""The performance stage on the CPU pool: measured curves, the knee, out of memory, predictions
from the plan kept apart (no Django)."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch

from engine.architecture import analyze_config
from engine.contract import PoolSpec, ReleaseRef, StageContext, StageFailed
from engine.stages.performance import run as performance
from engine.stages.performance.knee import find_knee
from engine.stages.performance.options import performance_options
from engine.stages.performance.predictions import predicted_points
from engine.stages.performance.rows import performance_rows
from engine.stages.performance.run import PerformanceOptions, measure_performance
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from engine.twin.measure import model_bytes
from tests.engine.stages.realconfigs import load

# Builds and runs scaled twins with torch: left out of `make test-fast`.
pytestmark = pytest.mark.slow

CPU = PoolSpec(name="cpu", backend="cpu", queue="cpu")
DENSE = "meta-llama__Llama-3.1-8B"
MOE = "deepseek-ai__DeepSeek-V3"
# Small sweeps: 2 dtypes x 2 prompt lengths x batches 1, 2, 4, 8.
SWEEP = {
    "max_batch_size": 8,
    "prompt_lens": [16, 48],
    "warmup": 2,
    "repeats": 5,
    "prefill_warmup": 1,
    "prefill_repeats": 2,
    "dtypes": ["float32", "bfloat16"],
}
POINT_KEYS = {
    "dtype",
    "batch_size",
    "prompt_len",
    "ttft_s",
    "tpot_s",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "peak_memory_bytes",
    "kind",
}


# Device figures as the probe reports them, for the tests that are not about calibration (the
# probe takes about a second).
FIGURES = {
    "kind": "measured",
    "device": "cpu",
    "threads": 1,
    "memory_bandwidth_bytes_per_s": 1.5e10,
    "flops": {"bfloat16": 1e12, "float16": 1.6e11},
}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """As a worker process runs (DAY0_TORCH_THREADS=1): two threads on a shared 2-core host
    stall for whole time slices, which is the neighbours' noise, not the twin's speed."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def swept(seeded_twin):
    return {
        name: measure_performance(seeded_twin(name), CPU, options=SWEEP) for name in (DENSE, MOE)
    }


def context(name: str, options: dict, *, previous: dict | None = None) -> StageContext:
    return StageContext(
        release=ReleaseRef("mirror", "/nowhere", name.replace("__", "/"), "main"),
        pool=CPU,
        previous={"fetch": {"config": load(name)}} | (previous or {}),
        options=options,
    )


@pytest.mark.parametrize("name", [DENSE, MOE])
def test_curves_have_every_point_asked_for_in_their_units(swept, seeded_twin, name):
    result = swept[name]
    json.dumps(result, allow_nan=False)
    points = result["points"]
    assert {(p["dtype"], p["prompt_len"], p["batch_size"]) for p in points} == {
        (d, n, b) for d in ("float32", "bfloat16") for n in (16, 48) for b in (1, 2, 4, 8)
    }
    assert len(points) == 16 and result["stopped"] == [] and result["errors"] == []
    assert result["units"]["ttft_s"] == "s" and result["units"]["tpot_s"] == "s"
    assert result["units"]["decode_tokens_per_s"] == "tokens/s"
    assert result["units"]["peak_memory_bytes"] == "bytes"
    assert result["memory_kind"] == "process_rss" and result["timer"] == "time.perf_counter_ns"
    weights = model_bytes(seeded_twin(name).model)
    for p in points:
        assert set(p) >= POINT_KEYS
        assert p["kind"] == "measured" and p["model"] == "twin"
        assert p["prefill_samples"] == 2 and p["decode_samples"] == 5
        # seconds, not milliseconds: a tiny twin's forward takes well under a second
        assert 1e-5 < p["tpot_s"] <= p["tpot_p95_s"] < 2.0
        assert 1e-5 < p["ttft_s"] <= p["ttft_p95_s"] < 5.0
        b, n = p["batch_size"], p["prompt_len"]
        assert p["prefill_tokens_per_s"] == pytest.approx(b * n / p["ttft_s"])
        assert p["decode_tokens_per_s"] == pytest.approx(b / p["tpot_s"])
        # the whole process's resident set: more than the float32 weights, under 64 GiB
        assert weights < p["peak_memory_bytes"] < 64 * 2**30
        # what the point itself added: never negative, never over the peak
        assert 0 <= p["peak_memory_increase_bytes"] <= p["peak_memory_bytes"]
        assert p["peak_memory_increase_bytes"] == max(
            0, p["peak_memory_bytes"] - p["memory_before_bytes"]
        )


@pytest.mark.parametrize("name", [DENSE, MOE])
def test_throughput_rises_with_batch_until_the_knee(swept, name):
    result = swept[name]
    growth = result["options"]["knee_growth"]
    assert growth == 0.10 and "10%" in result["knee_rule"]
    assert {(k["dtype"], k["prompt_len"]) for k in result["knees"]} == {
        (d, n) for d in ("float32", "bfloat16") for n in (16, 48)
    }
    for knee in result["knees"]:
        curve = {
            p["batch_size"]: p["decode_tokens_per_s"]
            for p in result["points"]
            if p["dtype"] == knee["dtype"] and p["prompt_len"] == knee["prompt_len"]
        }
        # below the knee, some larger batch beats each batch by the rule's growth
        for b in (b for b in curve if b < knee["batch_size"]):
            assert any(
                curve[c] >= (1 + growth) ** math.log2(c / b) * curve[b] for c in curve if c > b
            )
        assert knee["tpot_s"] == next(
            p["tpot_s"]
            for p in result["points"]
            if (p["dtype"], p["prompt_len"], p["batch_size"])
            == (knee["dtype"], knee["prompt_len"], knee["batch_size"])
        )
        # a tiny twin's decode step costs about the same at batch 1 and 8: 8 sequences per
        # step give several times the tokens/s of one
        assert max(curve.values()) > 2 * curve[1]
    first = result["knee_by_dtype"]["float32"]
    assert first["prompt_len"] == 16
    assert result["knee"] == first
    assert result["knee_batch_size"] == first["batch_size"]
    assert result["knee_tpot_s"] == first["tpot_s"]


@pytest.mark.parametrize("name", [DENSE, MOE])
def test_the_twin_is_predicted_on_the_measured_device_and_its_efficiency_kept(swept, name):
    result = swept[name]
    calibration = result["calibration"]
    device = calibration["device"]
    assert device["kind"] == "measured" and device["threads"] == 1
    assert device["memory_bandwidth_bytes_per_s"] > 1e8 and device["flops"]["bfloat16"] > 1e8
    figures = calibration["figures"]
    assert figures["kind"] == "measured"
    assert figures["memory_bandwidth_bytes_per_s"] == device["memory_bandwidth_bytes_per_s"]
    assert calibration["available"] is True
    # the 16-bit points only: the roofline has no float32 serving dtype
    assert set(calibration["skipped_dtypes"]) == {"float32"}
    measured = {
        (p["prompt_len"], p["batch_size"]): p
        for p in result["points"]
        if p["kind"] == "measured" and p["dtype"] == "bfloat16"
    }
    predicted = {(p["prompt_len"], p["batch_size"]): p for p in calibration["points"]}
    assert set(predicted) == set(measured)
    for key, p in predicted.items():
        assert (p["kind"], p["model"]) == ("predicted", "twin")
        assert p["cache_tokens"] == key[0] + 2 + 3  # the median timed decode step's cache
        m = measured[key]
        assert p["decode_efficiency"] == m["decode_tokens_per_s"] / p["decode_tokens_per_s"]
        assert p["prefill_efficiency"] == m["prefill_tokens_per_s"] / p["prefill_tokens_per_s"]
        # a twin's forward is far from the roofline on a CPU, never 10 times past it
        assert 0 < p["decode_efficiency"] < 10 and 0 < p["prefill_efficiency"] < 10
    twin_params = calibration["twin_shape"]["total_params"]
    assert f"{twin_params:,} params" in calibration["basis"]
    assert twin_params == result["twin"]["parameters"]


def test_the_knee_is_where_a_doubling_stops_paying():
    def curve(values):
        return [
            {"batch_size": 2**i, "decode_tokens_per_s": v, "tpot_s": 2**i / v}
            for i, v in enumerate(values)
        ]

    saturating = find_knee(curve([100, 200, 400, 600, 640, 650]), 0.10)
    assert saturating["batch_size"] == 8 and saturating["found"] is True
    assert saturating["growth_at_knee"] == pytest.approx(640 / 600 - 1)
    assert saturating["tpot_s"] == pytest.approx(8 / 600)
    # one stalled point that the curve climbs past is not a knee
    dip = find_knee(curve([100, 200, 150, 800, 1600]), 0.10)
    assert dip["batch_size"] == 16 and dip["found"] is False
    assert "end of the sweep" in dip["reason"]
    # 8% per doubling is under 10% from the start
    assert find_knee(curve([100, 108, 116.6, 126]), 0.10)["batch_size"] == 1
    assert find_knee(curve([100, 108, 116.6, 126]), 0.05)["found"] is False
    assert find_knee([], 0.1) is None
    single = find_knee(curve([100]), 0.1)
    assert single["batch_size"] == 1 and single["found"] is False


def test_out_of_memory_mid_sweep_keeps_the_points_measured(seeded_twin):
    def out_of_memory_from_batch_4(model):
        def hook(_module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None and ids.shape[0] >= 4:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        return model.register_forward_pre_hook(hook, with_kwargs=True)

    result = measure_performance(
        seeded_twin(DENSE),
        CPU,
        options=SWEEP | {"dtypes": ["float32"], "repeats": 2},
        hooks=[out_of_memory_from_batch_4],
        device_figures=FIGURES,
    )
    assert {(p["prompt_len"], p["batch_size"]) for p in result["points"]} == {
        (16, 1),
        (16, 2),
        (48, 1),
        (48, 2),
    }
    assert [(s["prompt_len"], s["batch_size"]) for s in result["stopped"]] == [(16, 4), (48, 4)]
    reason = result["stopped"][0]["reason"]
    assert reason.startswith("stopped at batch 4: out of memory (OutOfMemoryError: CUDA out")
    assert result["errors"] == [] and result["knee_batch_size"] in (1, 2)


def test_no_point_under_the_memory_ceiling_fails_the_stage_with_the_result(seeded_twin):
    with pytest.raises(StageFailed) as failed:
        measure_performance(
            seeded_twin(DENSE),
            CPU,
            options=SWEEP | {"dtypes": ["float32"], "memory_limit_bytes": 1, "repeats": 1},
        )
    assert failed.value.reason.startswith("no point was measured: stopped at batch 1: out of")
    assert "over the memory_limit_bytes ceiling of 1" in failed.value.reason
    result = failed.value.result
    assert result["points"] == [] and len(result["stopped"]) == 2
    json.dumps(result, allow_nan=False)


def test_another_exception_fails_naming_the_dtype_and_batch(seeded_twin):
    def broken_at_batch_2(model):
        def hook(_module, args, kwargs):
            if kwargs["input_ids"].shape[0] == 2:
                raise RuntimeError("kernel exploded")

        return model.register_forward_pre_hook(hook, with_kwargs=True)

    with pytest.raises(StageFailed) as failed:
        measure_performance(
            seeded_twin(DENSE),
            CPU,
            options=SWEEP | {"dtypes": ["float32"], "repeats": 1},
            hooks=[broken_at_batch_2],
            device_figures=FIGURES,
        )
    assert failed.value.reason == (
        "float32 at prompt 16, batch 2: the twin raised RuntimeError: kernel exploded"
    )
    kept = failed.value.result["points"]
    assert [(p["prompt_len"], p["batch_size"]) for p in kept] == [(16, 1)]


def test_predictions_come_from_the_plan_and_stay_apart(seeded_twin):
    plan = plan_release(
        analyze_config(load(DENSE)).to_dict(), PoolLayout("h100", devices_per_node=8)
    ).to_dict()
    predicted, info = predicted_points(plan)
    curve = plan["predicted"]["decode_curve"]
    assert info["available"] is True and info["accelerator"] == "h100"
    assert "predictor.py" in info["source"]
    assert info["fit"] == plan["predicted"]["fit"] and info["fit"]["engine"] == "vllm"
    decode = [p for p in predicted if p["prompt_len"] is None]
    prefill = [p for p in predicted if p["prompt_len"] is not None]
    assert [p["batch_size"] for p in decode] == [c["concurrent_sequences"] for c in curve]
    assert [p["tpot_s"] for p in decode] == [c["tpot_s"] for c in curve]
    workload = plan["predicted"]["workload"]
    average = workload["input_tokens"] + workload["output_tokens"] / 2
    assert all(p["context_tokens"] == average for p in decode)
    assert [p["prompt_len"] for p in prefill] == [
        e["prompt_tokens"] for e in plan["predicted"]["prefill"]
    ]
    assert all(p["prefill_tokens_per_s"] == p["prompt_len"] / p["ttft_s"] for p in prefill)
    assert all(p["kind"] == "predicted" and p["model"] == "full-size" for p in predicted)

    result = measure_performance(
        seeded_twin(DENSE),
        CPU,
        options=SWEEP | {"dtypes": ["float32"], "max_batch_size": 2, "prompt_lens": [16]},
        plan=plan,
        device_figures=FIGURES,
    )
    json.dumps(result, allow_nan=False)
    measured = [p for p in result["points"] if p["kind"] == "measured"]
    assert len(measured) == 2 and all(p["model"] == "twin" for p in measured)
    assert [p for p in result["points"] if p["kind"] == "predicted"] == predicted
    assert result["predicted"] == info
    # the knee reads measured points only (the full-size model's reach batch 256)
    assert result["knee_batch_size"] in (1, 2)

    assert predicted_points(None)[1]["available"] is False
    failed_plan = {"fits": False, "predicted": plan["predicted"]}
    assert predicted_points(failed_plan) == (
        [],
        {"available": False, "source": info["source"], "reason": "no successful plan result"},
    )


def test_rows_carry_one_metric_each_with_its_unit():
    point = {
        "kind": "measured",
        "model": "twin",
        "dtype": "bfloat16",
        "batch_size": 4,
        "prompt_len": 32,
        "ttft_s": 0.02,
        "ttft_p95_s": 0.03,
        "tpot_s": 0.004,
        "tpot_p95_s": 0.005,
        "prefill_tokens_per_s": 6400.0,
        "decode_tokens_per_s": 1000.0,
        "peak_memory_bytes": 400 * 2**20,
        "memory_kind": "process_rss",
    }
    rows = performance_rows([point, point | {"kind": "predicted", "ttft_s": None}])
    assert len(rows) == 13
    by_metric = {r["metric"]: r for r in rows[:7]}
    assert by_metric["peak_process_rss_bytes"]["unit"] == "bytes"
    assert by_metric["decode_tokens_per_s"] == {
        "kind": "measured",
        "model": "twin",
        "dtype": "bfloat16",
        "batch_size": 4,
        "prompt_len": 32,
        "metric": "decode_tokens_per_s",
        "value": 1000.0,
        "unit": "tokens/s",
    }
    assert {r["unit"] for r in rows if r["metric"].startswith(("ttft", "tpot"))} == {"s"}
    assert "ttft_s" not in {r["metric"] for r in rows[7:]}


def test_options_are_checked_and_defaults_fill_the_rest():
    assert performance_options(None) == {}
    assert performance_options({"max_batch_size": 16, "prompt_lens": [8, 64]}) == {
        "max_batch_size": 16,
        "prompt_lens": [8, 64],
    }
    opts = PerformanceOptions.from_mapping({"max_batch_size": 20})
    assert opts.batch_sizes() == [1, 2, 4, 8, 16]
    assert opts.prompt_lens == (32, 128) and opts.repeats == 10 and opts.knee_growth == 0.1
    defaults = PerformanceOptions()
    assert defaults.for_device(torch.device("cpu")).batch_sizes()[-1] == 64
    assert defaults.for_device(torch.device("cuda", 0)).batch_sizes()[-1] == 512
    assert opts.for_device(torch.device("cuda", 0)).max_batch_size == 20
    for bad, words in (
        ({"max_batch": 4}, "unknown performance option max_batch;"),
        ({"max_batch": 4, "min_batch": 1}, "unknown performance options max_batch, min_batch;"),
        ({"max_batch_size": 0}, "max_batch_size must be a whole number"),
        ({"prompt_lens": [16, 16]}, "prompt_lens must be"),
        ({"dtypes": ["float64"]}, "dtypes must be"),
        ({"knee_growth": float("nan")}, "knee_growth must be"),
        ({"repeats": True}, "repeats must be"),
    ):
        with pytest.raises(ValueError, match=re.escape(words)):
            performance_options(bad)


def test_the_stage_runs_the_fetched_config_with_the_job_options():
    options = {"max_batch_size": 2, "prompt_lens": [16], "repeats": 2, "prefill_repeats": 1}
    lines = []
    ctx = dataclasses.replace(context(DENSE, options), log=lines.append)
    result = performance.run(ctx)
    json.dumps(result, allow_nan=False)
    # the pool's serving dtypes, as precision builds them
    assert {p["dtype"] for p in result["points"]} == {"bfloat16", "float16"}
    assert result["predicted"]["available"] is False
    assert any(line.startswith("recommended batch") for line in lines)
    with pytest.raises(StageFailed, match="performance options: unknown"):
        performance.run(context(DENSE, {"batch": 3}))


def test_remote_code_architectures_are_refused_with_the_reason():
    config = {
        "architectures": ["FancyForCausalLM"],
        "model_type": "fancy",
        "auto_map": {"AutoModelForCausalLM": "modeling_fancy.FancyForCausalLM"},
    }
    ctx = StageContext(
        release=ReleaseRef("mirror", "/nowhere", "org/fancy", "main"),
        pool=CPU,
        previous={"fetch": {"config": config}},
    )
    with pytest.raises(StageFailed, match="transformers' own classes only"):
        performance.run(ctx)
