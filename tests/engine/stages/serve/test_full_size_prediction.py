"""What the plan predicted for a full-size sweep before it was measured
(engine/stages/serve/full_size_prediction.py): the plan stage's own fit and split, the
sweep's lengths and levels (plain pytest, no engine)."""

from __future__ import annotations

import pytest

from engine.architecture import analyze_config
from engine.catalog import cpu_accelerator, load_catalog
from engine.contract import PoolSpec, ReleaseRef, StageContext
from engine.stages.plan import run as plan_stage
from engine.stages.plan.closed_loop import fit_from_dict
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.validity import Split
from engine.stages.plan.workload import Workload, predict_workload
from engine.stages.serve.full_size_prediction import predicted_before
from tests.engine.stages.realconfigs import load

PROBE = {"memory_bandwidth_bytes_per_s": 2e10, "flops": {"bfloat16": 4e11}, "source": "test"}
POOL = PoolSpec(name="cpu", backend="cpu", queue="pool.cpu", engine={"kind": "vllm"})
RELEASE = ReleaseRef("mirror", "demo", "HuggingFaceTB/SmolLM2-135M", "r1")
MEASURED = {
    "status": "measured",
    "tp": 1,
    "dtype": "bfloat16",
    "sweep_settings": {"input_tokens": 128, "output_tokens": 64, "concurrency": [1, 2, 4]},
    "workloads": [{"label": "decode-heavy", "input_tokens": 16, "output_tokens": 256}],
}


def context() -> StageContext:
    analysis = analyze_config(load("HuggingFaceTB__SmolLM2-135M")).to_dict()
    calibration = {"available": False, "reason": "no calibration yet", "device": PROBE}
    plan = plan_stage.run(
        StageContext(RELEASE, POOL, previous={"analyze": analysis}, calibration=calibration)
    )
    return StageContext(RELEASE, POOL, previous={"analyze": analysis, "plan": plan})


def test_each_level_is_what_the_plans_fit_predicts_for_it():
    ctx = context()
    before = predicted_before(ctx, MEASURED)
    plan = ctx.previous["plan"]
    assert before["available"] is True
    assert before["fit"] == plan["predicted"]["fit"] and before["split"] == "TP1 PP1 EP1 DP1"
    assert [p["concurrency"] for p in before["sweep"]] == [1, 2, 4]
    assert [w["label"] for w in before["workloads"]] == ["primary", "decode-heavy"]
    catalog = load_catalog().with_cpu(cpu_accelerator(measured_figures=PROBE))
    for workload in before["workloads"]:
        for point in workload["sweep"]:
            expected = predict_workload(
                ctx.previous["analyze"],
                PoolLayout("cpu", 1),
                Workload(workload["input_tokens"], workload["output_tokens"], point["concurrency"]),
                split=Split(1, 1, 1, 1),
                dtype="bfloat16",
                catalog=catalog,
                fit=fit_from_dict(plan["predicted"]["fit"]),
            )
            assert point["output_tokens_per_s"] == pytest.approx(expected.output_tokens_per_s)
            assert point["tpot_s"] == pytest.approx(expected.tpot_s)


def test_no_prediction_without_the_plans_or_past_the_pools_devices():
    ctx = context()
    two = predicted_before(ctx, {**MEASURED, "tp": 2})
    assert two["available"] is False and "more devices" in two["reason"]
    bare = StageContext(RELEASE, POOL, previous={**ctx.previous, "plan": {"tp": 1, "fits": True}})
    assert predicted_before(bare, MEASURED) == {
        "available": False,
        "reason": "the plan made no full-size prediction",
    }
