"""Calibration of the roofline against the scaled twin (no Django): the device probe, the
twin's predicted points against the roofline's formulas by hand, efficiencies, the pool's
running calibration, and the plan's calibrated predictions beside the raw ones."""

from __future__ import annotations

import json
import math

import pytest
import torch

from engine.architecture import analyze_config
from engine.catalog import load_catalog
from engine.contract import PoolSpec, ReleaseRef, StageContext
from engine.device_probe import probe_device
from engine.stages.performance.predictions import predicted_points
from engine.stages.performance.rows import calibration_rows
from engine.stages.plan import run as plan_stage
from engine.stages.plan.calibration import (
    SUPERSEDED,
    calibrated_predictions,
    decode_cache_tokens,
    device_accelerator,
    predict_twin_point,
    running_calibration,
    twin_calibration,
)
from engine.stages.plan.fits import CPU_PRIOR
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.model import ModelShape
from engine.stages.plan.planner import plan_release
from engine.stages.plan.roofline import MFU_PREFILL
from tests.conftest import load_realconfig

# Builds and runs scaled twins with torch: left out of `make test-fast`.
pytestmark = pytest.mark.slow

# A small Llama-shaped config whose parameters the test counts by hand.
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 256, 2, 4, 2, 64, 512, 1024
SMALL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "intermediate_size": FFN,
    "vocab_size": VOCAB,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
EMBEDDING = VOCAB * HIDDEN
PER_LAYER = (
    HIDDEN * HEADS * HEAD_DIM  # q
    + 2 * HIDDEN * KV_HEADS * HEAD_DIM  # k, v
    + HEADS * HEAD_DIM * HIDDEN  # o
    + 3 * HIDDEN * FFN  # gate, up, down
    + 2 * HIDDEN  # two RMSNorms
)
TOTAL = EMBEDDING + LAYERS * PER_LAYER + HIDDEN + VOCAB * HIDDEN  # + final norm + LM head
KV_BYTES_PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2  # K and V, bf16


def small_shape() -> ModelShape:
    return ModelShape.from_analysis(analyze_config(SMALL).to_dict())


def test_the_probe_measures_bandwidth_and_flops_with_units():
    probe = probe_device(
        torch.device("cpu"), ["bfloat16", "float32"], repeats=1, array_bytes=8 * 2**20
    )
    json.dumps(probe, allow_nan=False)
    assert probe["kind"] == "measured" and probe["device"] == "cpu"
    assert probe["threads"] == torch.get_num_threads()
    # bytes/s between a slow laptop core's 100 MB/s and 10 TB/s; FLOP/s between 1e8 and 1e15
    assert 1e8 < probe["memory_bandwidth_bytes_per_s"] < 1e13
    assert probe["memory_bandwidth_bytes_per_s"] == probe["triad_bytes_per_s"]
    assert 1e8 < probe["copy_bytes_per_s"] < 1e13
    assert probe["array_bytes"] == 8 * 2**20
    assert set(probe["flops"]) == {"bfloat16", "float32"}
    assert all(1e8 < f < 1e15 for f in probe["flops"].values())
    assert probe["units"]["memory_bandwidth_bytes_per_s"] == "bytes/s"
    assert probe["units"]["flops"] == "FLOP/s"
    assert "STREAM triad" in probe["method"]["memory_bandwidth"]
    assert "2 n^3" in probe["method"]["flops"]


def test_the_twins_predicted_decode_and_prefill_are_the_roofline_by_hand():
    shape = small_shape()
    assert shape.total_params == TOTAL and shape.active_params == TOTAL - EMBEDDING
    assert shape.kv_cache_bytes_per_token == KV_BYTES_PER_TOKEN
    bandwidth = 20e9
    # memory bound decode: a huge FLOP/s figure
    fast = device_accelerator(
        name="x", bandwidth_bytes_per_s=bandwidth, flops=1e18, memory_bytes=2**40
    )
    batch, prompt, cache = 4, 16, 24
    point = predict_twin_point(
        shape, fast, dtype="bfloat16", batch_size=batch, prompt_len=prompt, cache_tokens=cache
    )
    # every bf16 weight but the looked-up embedding, and each sequence's KV cache, per step
    streamed = (TOTAL - EMBEDDING) * 2 + batch * cache * KV_BYTES_PER_TOKEN
    assert point["tpot_s"] == pytest.approx(streamed / bandwidth, rel=1e-12)
    assert point["decode_tokens_per_s"] == pytest.approx(batch * bandwidth / streamed, rel=1e-12)
    # prefill reads every weight once at least
    assert point["ttft_s"] == pytest.approx(TOTAL * 2 / bandwidth, rel=1e-12)
    # compute bound prefill: a tiny FLOP/s figure; causal attention 2 x heads x hd x P^2
    flops = 1e9
    slow = device_accelerator(
        name="x", bandwidth_bytes_per_s=bandwidth, flops=flops, memory_bytes=2**40
    )
    point = predict_twin_point(
        shape, slow, dtype="bfloat16", batch_size=batch, prompt_len=prompt, cache_tokens=cache
    )
    work = batch * (2 * (TOTAL - EMBEDDING) * prompt + 2 * HEADS * HEAD_DIM * LAYERS * prompt**2)
    assert point["ttft_s"] == pytest.approx(work / (flops * MFU_PREFILL), rel=1e-12)
    assert point["prefill_tokens_per_s"] == pytest.approx(batch * prompt / point["ttft_s"])
    # decode is compute bound too at this FLOP/s: 2 x active params x batch
    assert point["tpot_s"] == pytest.approx(2 * (TOTAL - EMBEDDING) * batch / flops, rel=1e-12)
    assert decode_cache_tokens(16, warmup=2, repeats=5) == 16 + 2 + 3


def test_efficiency_is_measured_over_predicted_per_point():
    figures = {
        "kind": "measured",
        "name": "cpu (pool cpu)",
        "memory_bandwidth_bytes_per_s": 20e9,
        "flops": {"bfloat16": 1e18, "float16": 1e18},
        "source": "a test",
    }
    measured = [
        {"dtype": "bfloat16", "batch_size": 1, "prompt_len": 16,
         "decode_tokens_per_s": 500.0, "prefill_tokens_per_s": 4000.0},
        {"dtype": "bfloat16", "batch_size": 2, "prompt_len": 16,
         "decode_tokens_per_s": 900.0, "prefill_tokens_per_s": 7000.0},
        {"dtype": "float32", "batch_size": 1, "prompt_len": 16,
         "decode_tokens_per_s": 300.0, "prefill_tokens_per_s": 2000.0},
    ]  # fmt: skip
    calibration = twin_calibration(
        analyze_config(SMALL).to_dict(), measured, figures, warmup=2, repeats=5
    )
    json.dumps(calibration, allow_nan=False)
    assert calibration["available"] is True
    points = calibration["points"]
    assert [(p["dtype"], p["batch_size"]) for p in points] == [("bfloat16", 1), ("bfloat16", 2)]
    assert "float32" in calibration["skipped_dtypes"]
    for p, m in zip(points, measured, strict=False):
        assert p["kind"] == "predicted" and p["model"] == "twin"
        assert p["cache_tokens"] == 16 + 2 + 3
        streamed = (TOTAL - EMBEDDING) * 2 + m["batch_size"] * 21 * KV_BYTES_PER_TOKEN
        assert p["decode_tokens_per_s"] == pytest.approx(m["batch_size"] * 20e9 / streamed)
        assert p["decode_efficiency"] == pytest.approx(
            m["decode_tokens_per_s"] / p["decode_tokens_per_s"]
        )
        assert p["prefill_efficiency"] == pytest.approx(
            m["prefill_tokens_per_s"] / p["prefill_tokens_per_s"]
        )
    assert calibration["decode_efficiency_median"] == pytest.approx(
        (points[0]["decode_efficiency"] + points[1]["decode_efficiency"]) / 2
    )
    assert "scaled twin" in calibration["basis"] and "measured" in calibration["basis"]
    rows = calibration_rows(calibration)
    efficiency = [r for r in rows if r["metric"] == "decode_efficiency"]
    assert [r["value"] for r in efficiency] == [p["decode_efficiency"] for p in points]
    assert {(r["kind"], r["model"], r["unit"]) for r in efficiency} == {
        ("measured", "twin", "ratio")
    }
    predicted = [r for r in rows if r["metric"] == "decode_tokens_per_s"]
    assert {(r["kind"], r["model"], r["unit"]) for r in predicted} == {
        ("predicted", "twin", "tokens/s")
    }


def run(stage_run: int, decode: list[float], prefill: list[float], **extra) -> dict:
    return {
        "stage_run": stage_run,
        "job": stage_run,
        "release": "org/m",
        "finished_at": "2025-01-01T00:00:00+00:00",
        "worker_host": "cpu@box",
        "decode_efficiency": decode,
        "prefill_efficiency": prefill,
        "dtypes": ["bfloat16"],
        "twin_params": 1000,
        "device": None,
    } | extra


def test_the_running_calibration_is_the_median_of_the_runs_medians():
    probe = {"memory_bandwidth_bytes_per_s": 1.5e10, "flops": {"bfloat16": 1e12}, "threads": 1}
    runs = [
        run(3, [0.1, 0.2, 0.3], [0.4], device=probe),  # newest first
        run(2, [0.05], [0.2, 0.3]),
        run(1, [0.4, 0.6], []),
    ]
    calibration = running_calibration("cpu", runs)
    json.dumps(calibration, allow_nan=False)
    assert calibration["available"] is True and calibration["runs"] == 3
    assert calibration["decode_factor"] == pytest.approx(0.2)  # median of 0.2, 0.05, 0.5
    assert calibration["prefill_factor"] == pytest.approx(0.325)  # median of 0.4, 0.25
    assert [r["decode_efficiency_median"] for r in calibration["per_run"]] == pytest.approx(
        [0.2, 0.05, 0.5]
    )
    assert "3 performance runs on pool cpu" in calibration["basis"]
    assert calibration["device"]["memory_bandwidth_bytes_per_s"] == 1.5e10
    assert "performance run 3" in calibration["device"]["source"]
    two = running_calibration("cpu", runs, window=2)
    assert two["runs"] == 2 and two["decode_factor"] == pytest.approx(0.125)
    assert "warning" not in calibration
    # a twin at 1% of its roofline is mostly per-step overhead: the calibration says so
    overhead = running_calibration("cpu", [run(1, [0.01], [0.02])])
    assert "1.000% of their decode roofline" in overhead["warning"]
    assert (
        "floor"
        in calibrated_predictions(
            {"available": True, "batch_1": {"tpot_s": 1.0, "decode_tokens_per_s": 1.0}}, overhead
        )["warning"]
    )
    none = running_calibration("cpu", [])
    assert none["available"] is False and none["reason"].startswith("no calibration yet")
    assert running_calibration("cpu", [run(1, [], [])])["available"] is False


def test_the_twins_factors_are_reported_beside_the_prediction_not_applied():
    """The full-size prediction is already at fitted achievable figures: the twin's factor,
    measured against the datasheet roofline, would count the efficiency twice."""
    plan = plan_release(
        analyze_config(load_realconfig("meta-llama__Llama-3.1-8B")).to_dict(),
        PoolLayout("h100", devices_per_node=8),
    ).to_dict()
    raw = plan["predicted"]
    before = json.dumps(raw, sort_keys=True)
    calibration = running_calibration("h100x8", [run(1, [0.5], [0.25])])
    calibrated = calibrated_predictions(raw, calibration)
    assert json.dumps(raw, sort_keys=True) == before
    assert calibrated["available"] is False and calibrated["label"] == "calibrated prediction"
    assert calibrated["reason"] == SUPERSEDED and "twice" in SUPERSEDED
    assert calibrated["decode_factor"] == 0.5 and calibrated["prefill_factor"] == 0.25
    assert "batch_1" not in calibrated and "prefill" not in calibrated
    assert "pool h100x8" in calibrated["basis"]
    none = calibrated_predictions(raw, None)
    assert none["available"] is False and none["reason"].startswith("no calibration yet")
    nothing = calibrated_predictions({"available": False, "reason": "no bandwidth"}, calibration)
    assert nothing["reason"] == "no raw prediction to calibrate: no bandwidth"

    # the performance stage's full-size points carry the prediction alone
    plan["predicted"]["calibrated"] = calibrated
    points, info = predicted_points(plan)
    assert points and not any("calibrated_decode_tokens_per_s" in p for p in points)
    assert info["calibrated"] == {"available": False, "reason": SUPERSEDED}


def plan_context(pool: PoolSpec, config: dict, calibration: dict | None) -> StageContext:
    return StageContext(
        release=ReleaseRef("mirror", "/nowhere", "org/small", "main"),
        pool=pool,
        previous={"analyze": analyze_config(config).to_dict()},
        calibration=calibration,
    )


def test_the_plan_stage_adds_calibrated_figures_or_says_there_are_none():
    pool = PoolSpec(name="h100x8", backend="manifest", queue="pool.h100x8", accelerator="h100")
    config = load_realconfig("meta-llama__Llama-3.1-8B")
    raw = plan_stage.run(plan_context(pool, config, None))["predicted"]
    assert raw["available"] is True
    assert raw["calibrated"] == {
        "kind": "calibrated",
        "label": "calibrated prediction",
        "available": False,
        "reason": "no calibration yet: the pool has no performance runs",
    }
    calibration = running_calibration("h100x8", [run(1, [0.25], [0.5])])
    lines = []
    ctx = plan_context(pool, config, calibration)
    ctx = StageContext(**{**ctx.__dict__, "log": lines.append})
    predicted = plan_stage.run(ctx)["predicted"]
    assert predicted["batch_1"] == raw["batch_1"]  # the prediction stays as it was
    calibrated = predicted["calibrated"]
    assert calibrated["available"] is False and calibrated["runs"] == 1
    assert calibrated["decode_factor"] == 0.25 and calibrated["reason"] == SUPERSEDED


def test_a_cpu_plan_predicts_on_the_figures_a_performance_run_measured():
    pool = PoolSpec(name="cpu", backend="cpu", queue="pool.cpu")
    without = plan_stage.run(plan_context(pool, SMALL, None))
    assert without["predicted"]["available"] is False  # no datasheet for a CPU
    assert without["predicted"]["calibrated"]["reason"].startswith("no calibration yet")
    probe = {"memory_bandwidth_bytes_per_s": 1.5e10, "flops": {"bfloat16": 2e11}, "threads": 1}
    calibration = running_calibration("cpu", [run(7, [0.05], [0.1], device=probe)])
    result = plan_stage.run(plan_context(pool, SMALL, calibration))
    predicted = result["predicted"]
    assert predicted["available"] is True
    assert predicted["memory_bandwidth_bytes_per_s"] == 1.5e10
    assert predicted["compute_dtype_flops"] == 2e11
    shape = small_shape()
    # One sequence's step on the measured figures (the cpu prior's efficiencies are 1): the
    # weights but the embedding, and the KV cache at the workload's average context, over
    # the probe's bandwidth, plus the engine's fixed costs per step and per layer.
    workload = predicted["workload"]
    context = workload["input_tokens"] + workload["output_tokens"] / 2
    streamed = (TOTAL - EMBEDDING) * 2 + context * KV_BYTES_PER_TOKEN
    fixed = CPU_PRIOR.step_s + LAYERS * CPU_PRIOR.layer_s
    assert predicted["batch_1"]["tpot_s"] == pytest.approx(fixed + streamed / 1.5e10, rel=1e-6)
    assert predicted["fit"]["scope"] == "prior" and predicted["fit"]["accelerator"] == "cpu"
    assert shape.total_params == TOTAL
    assert predicted["calibrated"]["reason"] == SUPERSEDED
    assert any("are measured, not a datasheet's" in note for note in result["notes"])
    assert any("performance run 7" in note for note in result["notes"])


def test_catalog_figures_stay_the_datasheets_on_an_accelerator_pool():
    from engine.stages.performance.run import roofline_figures

    pool = PoolSpec(name="h100x8", backend="manifest", queue="q", accelerator="h100")
    probe = {"device": "cuda:0", "memory_bandwidth_bytes_per_s": 3e12, "flops": {}}
    figures = roofline_figures(pool, probe)
    h100 = load_catalog().accelerator("h100")
    assert figures["kind"] == "datasheet"
    assert figures["memory_bandwidth_bytes_per_s"] == h100.memory_bandwidth_bytes_per_s
    assert figures["flops"] == {"bfloat16": h100.dense_bf16_flops, "float16": h100.dense_bf16_flops}
    cpu = roofline_figures(PoolSpec(name="cpu", backend="cpu", queue="q"), probe)
    assert cpu["kind"] == "measured" and cpu["memory_bandwidth_bytes_per_s"] == 3e12
    assert roofline_figures(PoolSpec(name="cpu", backend="cpu", queue="q"), None) is None
    assert math.isfinite(figures["memory_bytes"])


def test_a_failed_probe_leaves_the_measured_points_and_says_why(seeded_twin, monkeypatch):
    from engine import device_probe
    from engine.stages.performance.run import measure_performance

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 768.00 MiB")

    monkeypatch.setattr(device_probe, "probe_device", out_of_memory)
    options = {"max_batch_size": 1, "prompt_lens": [8], "repeats": 1, "dtypes": ["bfloat16"]}
    cpu = PoolSpec(name="cpu", backend="cpu", queue="pool.cpu")
    result = measure_performance(seeded_twin("meta-llama__Llama-3.1-8B"), cpu, options=options)
    assert len(result["points"]) == 1
    assert result["calibration"] == {
        "device": None,
        "available": False,
        "reason": "the device probe failed: OutOfMemoryError: CUDA out of memory. Tried to "
        "allocate 768.00 MiB",
    }
