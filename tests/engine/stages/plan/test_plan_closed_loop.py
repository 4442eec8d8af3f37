"""The closed loop (engine/stages/plan/closed_loop.py): a pool's measured full-size sweeps
refit its constants, and the next plan on the pool predicts with them (plain pytest).

The "measured" sweeps here are made by the model itself under known constants, on a cpu
whose probe read 20 GB/s and 400 GFLOP/s, so the fit has a right answer to find.
"""

from __future__ import annotations

import pytest

from engine.architecture import analyze_config
from engine.catalog import cpu_accelerator, load_catalog
from engine.contract import PoolSpec, ReleaseRef, StageContext
from engine.stages.plan import run as plan_stage
from engine.stages.plan.closed_loop import (
    MeasuredSweep,
    fit_from_dict,
    observations,
    pool_fit_from,
    predicted_sweep,
)
from engine.stages.plan.fits import CPU_PRIOR, Fit
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.step_time import Efficiency
from tests.engine.stages.realconfigs import load

SMOL = "HuggingFaceTB__SmolLM2-135M"
PROBE = {"memory_bandwidth_bytes_per_s": 2e10, "flops": {"bfloat16": 4e11}, "source": "test"}
TRUE = Fit("cpu", "vllm", Efficiency(0.6, 0.3, 0.02, 4e-4, 0.5), 0, None, "prior", "made up")
CPU = PoolLayout("cpu", 1)


def catalog():
    return load_catalog().with_cpu(cpu_accelerator(cores=2, memory_bytes=24 * 2**30,
                                                   measured_figures=PROBE))  # fmt: skip


def analysis() -> dict:
    return analyze_config(load(SMOL)).to_dict()


def measured(isl: int, osl: int, levels=(1, 2, 4, 8)) -> dict:
    """A sweep as the serve stage keeps it, its figures what TRUE predicts."""
    points = predicted_sweep(
        analysis(), CPU, split="TP1", dtype="bfloat16", kv_dtype="bfloat16", engine="vllm",
        fit=TRUE, input_tokens=isl, output_tokens=osl, concurrencies=levels, catalog=catalog(),
    )  # fmt: skip
    sweep = [
        {
            "concurrency": p["concurrency"],
            "requests": 4 * p["concurrency"],
            "completed": 4 * p["concurrency"],
            "output_tokens_per_s": p["output_tokens_per_s"],
            "tpot_s_p50": p["tpot_s"],
        }
        for p in points
    ]
    return {"input_tokens": isl, "output_tokens": osl, "sweep": sweep}


def record(*workloads) -> dict:
    return {
        "stage_run": 7,
        "analysis": analysis(),
        "split": "TP1 PP1 EP1 DP1",
        "dtype": "bfloat16",
        "kv_dtype": "bfloat16",
        "engine": "vllm",
        "workloads": list(workloads),
    }


def test_each_finished_level_is_two_observations():
    found = observations(MeasuredSweep.from_dict(record(measured(128, 64))), CPU, catalog())
    assert len(found) == 8  # 4 levels x (tokens/s, TPOT)
    assert [o.latency for o in found[:2]] == [False, True]
    for o in found:
        assert o.predict(TRUE.efficiency) == pytest.approx(o.measured)


def test_a_level_cut_short_is_left_out():
    workload = measured(128, 64)
    workload["sweep"][-1]["completed"] = 3
    found = observations(MeasuredSweep.from_dict(record(workload)), CPU, catalog())
    assert len(found) == 6


def test_the_pool_fit_predicts_a_workload_it_did_not_measure():
    fit, left_out = pool_fit_from(
        [record(measured(128, 64), measured(256, 16))],
        pool="cpu",
        layout=CPU,
        catalog=catalog(),
        engine="vllm",
    )
    assert left_out == [] and fit.scope == "pool" and fit.points == 16
    assert fit.residual == pytest.approx(1.0, abs=0.03)
    unseen = measured(16, 256, levels=(3, 6))["sweep"]
    check = predicted_sweep(
        analysis(), CPU, split="TP1", dtype="bfloat16", kv_dtype="bfloat16", engine="vllm",
        fit=fit, input_tokens=16, output_tokens=256, concurrencies=(3, 6), catalog=catalog(),
    )  # fmt: skip
    for want, got in zip(unseen, check, strict=True):
        assert got["output_tokens_per_s"] == pytest.approx(want["output_tokens_per_s"], rel=0.1)


def test_sweeps_of_other_engines_or_splits_too_big_are_left_out():
    big = record(measured(128, 64))
    big["split"] = "TP2"
    other = record(measured(128, 64))
    other["engine"] = "sglang"
    fit, left_out = pool_fit_from([big, other], pool="cpu", layout=CPU, catalog=catalog(),
                                  engine="vllm")  # fmt: skip
    assert fit is None
    assert len(left_out) == 1 and "more devices" in left_out[0]


def test_a_fit_reads_back_from_its_dict():
    fit = Fit("cpu", "vllm", Efficiency(0.5, 0.4, 0.01, 1e-4, 0.7), 12, 1.1, "pool", "pool cpu")
    back = fit_from_dict(fit.to_dict())
    assert back.efficiency.as_tuple() == pytest.approx(fit.efficiency.as_tuple(), rel=1e-3)
    assert (back.scope, back.points, back.source) == ("pool", 12, "pool cpu")


def test_the_next_plan_on_the_pool_predicts_with_its_own_fit():
    pool = PoolSpec(name="cpu", backend="cpu", queue="pool.cpu", engine={"kind": "vllm"})
    calibration = {
        "available": False,
        "reason": "no calibration yet",
        "device": PROBE,
        "full_size": [record(measured(128, 64), measured(256, 16))],
    }
    ctx = StageContext(
        release=ReleaseRef("mirror", "demo", "HuggingFaceTB/SmolLM2-135M", "r1"),
        pool=pool,
        previous={"analyze": analysis()},
        calibration=calibration,
    )
    fit = plan_stage.run(ctx)["predicted"]["fit"]
    assert fit["scope"] == "pool" and fit["points"] == 16
    assert fit["constants"]["step_overhead_s"] != CPU_PRIOR.step_s
    assert "pool cpu" in fit["source"]
    without = plan_stage.run(
        StageContext(**{**ctx.__dict__, "calibration": {**calibration, "full_size": []}})
    )
    assert without["predicted"]["fit"]["scope"] == "prior"
