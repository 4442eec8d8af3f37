"""Performance results as rows, `adapt --format json`'s view of the performance and stability
results, the pool's running calibration and the plan stage that reads it through the runner."""

from __future__ import annotations

import json

import pytest
import torch

from adaptation.models import AcceleratorPool, PerformancePoint, StageStatus
from adaptation.selectors.calibration import pool_calibration
from adaptation.selectors.jobs import job_summary
from engine.architecture import analyze_config
from engine.contract import PoolSpec, StageDefinition, StageFailed
from engine.stages.performance.rows import calibration_rows, performance_rows
from engine.stages.performance.run import measure_performance
from engine.stages.plan.calibration import SUPERSEDED, calibrated_predictions, running_calibration
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from engine.stages.stability.result import StabilityResult, StabilitySample
from engine.twin import build_twin
from tests.conftest import load_realconfig
from tests.factories import make_job
from workers import runner

# Measures a scaled twin's performance (tests/performance_rows.py): left out of test-fast.
pytestmark = [pytest.mark.django_db, pytest.mark.slow]

CPU = PoolSpec(name="cpu", backend="cpu", queue="pool.cpu")
LLAMA = "meta-llama__Llama-3.1-8B"
SMALL_SWEEP = {
    "max_batch_size": 2,
    "prompt_lens": [16],
    "warmup": 1,
    "repeats": 2,
    "prefill_repeats": 1,
    "dtypes": ["bfloat16", "float32"],
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
STABILITY_KEYS = {
    "duration_s",
    "steps",
    "memory_slope_bytes_per_step",
    "nonfinite_outputs",
    "errors",
    "step_time_drift",
    "passed",
}


@pytest.fixture(scope="module")
def twin():
    return build_twin(load_realconfig(LLAMA))


@pytest.fixture(scope="module")
def engine_result(twin):
    """A real performance result: the Llama twin measured on this CPU (with the probe), and
    the full-size plan on 8 x H100 with a calibrated prediction beside the raw one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plan = plan_release(
            analyze_config(load_realconfig(LLAMA)).to_dict(), PoolLayout("h100", 8)
        ).to_dict()
        calibration = running_calibration(
            "h100x8", [{"stage_run": 1, "decode_efficiency": [0.5], "prefill_efficiency": [0.5]}]
        )
        plan["predicted"]["calibrated"] = calibrated_predictions(plan["predicted"], calibration)
        return measure_performance(twin, CPU, options=SMALL_SWEEP, plan=plan)
    finally:
        torch.set_num_threads(threads)


def run_stage(monkeypatch, stage: str, body, **job_fields):
    """Run `body` as the stage `stage` of a job through the runner (rows via the handlers)."""
    definition = StageDefinition(name=stage, title=stage, run=body)
    monkeypatch.setattr(runner, "get_stage", lambda name: definition)
    job = make_job(stages=(stage,), statuses={stage: StageStatus.QUEUED}, **job_fields)
    run = job.stage_runs.get()
    runner.execute_stage_run(run.pk)
    run.refresh_from_db()
    return run


def test_every_point_of_a_real_result_is_stored_as_rows(monkeypatch, engine_result):
    result = engine_result
    json.dumps(result, allow_nan=False)
    run = run_stage(monkeypatch, "performance", lambda ctx: result)
    assert run.status == StageStatus.SUCCEEDED
    rows = PerformancePoint.objects.filter(stage_run=run)
    expected = performance_rows(result["points"]) + calibration_rows(result["calibration"])
    assert rows.count() == len(expected) > 0
    assert {r.job_id for r in rows} == {run.job_id} and {r.pool.name for r in rows} == {"cpu"}
    kinds = set(rows.values_list("kind", "model"))
    assert kinds == {("measured", "twin"), ("predicted", "full-size"), ("predicted", "twin")}
    # a measured point: each metric with its unit
    measured = next(p for p in result["points"] if p["kind"] == "measured")
    row = rows.get(
        kind="measured",
        model="twin",
        dtype=measured["dtype"],
        batch_size=measured["batch_size"],
        prompt_len=16,
        metric="tpot_s",
    )
    assert (row.value, row.unit) == (measured["tpot_s"], "s")
    assert rows.filter(kind="measured", metric="peak_process_rss_bytes", unit="bytes").count() == 4
    increase = rows.filter(kind="measured", metric="peak_process_rss_increase_bytes")
    assert increase.count() == 4 and {r.unit for r in increase} == {"bytes"}
    for r in increase:
        peak = rows.get(
            kind="measured", dtype=r.dtype, batch_size=r.batch_size, metric="peak_process_rss_bytes"
        )
        assert 0 <= r.value <= peak.value
    # the full-size predictions with no prompt length for decode, none scaled by the twin's
    # calibration (it would count the efficiency twice)
    decode = rows.filter(kind="predicted", model="full-size", metric="decode_tokens_per_s")
    assert decode.count() > 1 and {r.prompt_len for r in decode} == {None}
    assert not rows.filter(model="full-size", metric="calibrated_decode_tokens_per_s").exists()
    # the twin's predicted figures and its efficiencies, bfloat16 only (float32 is skipped)
    efficiency = rows.filter(metric="decode_efficiency")
    assert efficiency.count() == 2 and {r.dtype for r in efficiency} == {"bfloat16"}
    assert {(r.kind, r.model, r.unit) for r in efficiency} == {("measured", "twin", "ratio")}
    for point in result["calibration"]["points"]:
        predicted = rows.get(
            kind="predicted", model="twin", batch_size=point["batch_size"], metric="tpot_s"
        )
        assert predicted.value == point["tpot_s"]
        measured_tps = next(
            p["decode_tokens_per_s"]
            for p in result["points"]
            if p["kind"] == "measured"
            and (p["dtype"], p["batch_size"]) == ("bfloat16", point["batch_size"])
        )
        assert efficiency.get(batch_size=point["batch_size"]).value == pytest.approx(
            measured_tps / point["decode_tokens_per_s"]
        )
    assert result["calibration"]["device"]["kind"] == "measured"
    assert result["calibration"]["figures"]["kind"] == "measured"


@pytest.mark.parametrize(
    ("field", "value"), [("model", "x" * 17), ("dtype", "d" * 33), ("metric", "m" * 65)]
)
def test_a_row_field_too_long_for_its_column_is_refused_not_cut(field, value):
    from adaptation.services import stage_results

    run = make_job(stages=["performance"]).stage_runs.get()
    point = {"kind": "measured", "model": "twin", "dtype": "bfloat16", "batch_size": 1,
             "prompt_len": 16, "tpot_s": 0.01}  # fmt: skip
    if field == "metric":
        point = point | {"memory_kind": value, "peak_memory_bytes": 1}
    else:
        point[field] = value
    with pytest.raises(ValueError, match=f"performance row {field} "):
        stage_results.apply(run=run, result={"points": [point]})
    assert not PerformancePoint.objects.filter(stage_run=run).exists()


def test_storing_rows_does_not_load_torch():
    import subprocess
    import sys

    code = (
        "import django, os, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE', "
        "'day0web.settings'); django.setup(); import adaptation.services.stage_results; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_a_failed_performance_run_stores_the_points_it_measured(monkeypatch, twin):
    def broken_at_batch_2(model):
        def hook(_module, args, kwargs):
            if kwargs["input_ids"].shape[0] == 2:
                raise RuntimeError("kernel exploded")

        return model.register_forward_pre_hook(hook, with_kwargs=True)

    figures = {"kind": "measured", "device": "cpu", "threads": 1,
               "memory_bandwidth_bytes_per_s": 1e10, "flops": {"bfloat16": 1e11}}  # fmt: skip

    def stage(ctx):
        measure_performance(
            twin,
            CPU,
            options=SMALL_SWEEP | {"dtypes": ["bfloat16"]},
            hooks=[broken_at_batch_2],
            device_figures=figures,
        )

    run = run_stage(monkeypatch, "performance", stage)
    assert run.status == StageStatus.FAILED
    assert "batch 2: the twin raised RuntimeError: kernel exploded" in run.error
    rows = PerformancePoint.objects.filter(stage_run=run)
    assert set(rows.filter(kind="measured", model="twin").values_list("batch_size", flat=True)) == {
        1
    }
    assert rows.filter(metric="decode_efficiency").count() == 1
    assert run.result["calibration"]["device"] == figures

    def out_of_memory(ctx):
        raise StageFailed("no point was measured", result={"points": [], "calibration": {}})

    empty = run_stage(monkeypatch, "performance", out_of_memory)
    assert empty.status == StageStatus.FAILED and empty.result["points"] == []
    assert not PerformancePoint.objects.filter(stage_run=empty).exists()


def test_adapt_json_carries_the_points_the_knee_and_the_stability_figures(engine_result):
    stability = StabilityResult(
        duration_s=3.1,
        steps=40,
        memory_slope_bytes_per_step=12.5,
        nonfinite_outputs=0,
        errors=0,
        step_time_drift=-0.02,
        passed=True,
        samples=(StabilitySample(step=1, memory_bytes=1, step_time_s=0.1, cpu_time_s=0.1),),
    ).to_dict()
    job = make_job(
        stages=("performance", "stability"),
        statuses={"performance": "succeeded", "stability": "succeeded"},
        results={"performance": engine_result, "stability": stability},
    )
    summary = json.loads(json.dumps(job_summary(job)))
    stages = {s["name"]: s for s in summary["stages"]}
    performance = stages["performance"]["result"]
    assert performance["knee_batch_size"] in (1, 2)
    assert {p["kind"] for p in performance["points"]} == {"measured", "predicted"}
    assert all(p.keys() >= POINT_KEYS for p in performance["points"])
    assert performance["calibration"]["points"][0]["decode_efficiency"] > 0
    assert stages["stability"]["result"].keys() >= STABILITY_KEYS
    assert stages["stability"]["result"]["passed"] is True


def performance_run(pool, decode: list[float], prefill: list[float], *, status="succeeded"):
    """A finished performance run of `pool` with efficiency rows, as the handler stores them."""
    job = make_job(
        stages=("performance",),
        pool=pool,
        statuses={"performance": status},
        results={
            "performance": {
                "calibration": {
                    "device": {
                        "kind": "measured",
                        "device": "cpu",
                        "threads": 1,
                        "memory_bandwidth_bytes_per_s": 1.2e10 + len(decode),
                        "flops": {"bfloat16": 3e11},
                    },
                    "twin_shape": {"total_params": 984_192},
                }
            }
        },
    )
    run = job.stage_runs.get()
    for metric, values in (("decode_efficiency", decode), ("prefill_efficiency", prefill)):
        for batch, value in enumerate(values, start=1):
            PerformancePoint.objects.create(
                stage_run=run, job=job, pool=pool, kind="measured", model="twin",
                dtype="bfloat16", batch_size=batch, prompt_len=16, metric=metric,
                value=value, unit="ratio",
            )  # fmt: skip
    return run


def test_the_pools_running_calibration_reads_its_last_successful_runs():
    cpu = AcceleratorPool.objects.get(name="cpu")
    other = AcceleratorPool.objects.create(name="h100x8", backend="manifest", accelerator="h100")
    assert pool_calibration(pool=cpu)["reason"].startswith("no calibration yet: pool cpu")
    performance_run(cpu, [0.1, 0.3], [0.5])  # run median 0.2
    performance_run(cpu, [0.04], [0.1, 0.3])  # 0.04
    performance_run(cpu, [0.9], [0.9], status="failed")  # not a basis
    performance_run(other, [0.7], [0.7])  # another pool
    newest = performance_run(cpu, [0.5, 0.7, 0.9], [])  # 0.7
    calibration = pool_calibration(pool=cpu)
    json.dumps(calibration, allow_nan=False)
    assert calibration["available"] is True and calibration["runs"] == 3
    assert calibration["decode_factor"] == pytest.approx(0.2)  # median of 0.7, 0.04, 0.2
    assert calibration["prefill_factor"] == pytest.approx(0.35)  # median of 0.2, 0.5
    assert calibration["per_run"][0]["stage_run"] == newest.pk
    # the device figures: the median of the three runs' probes (1.2e10 + 2, + 1, + 3)
    assert calibration["device"]["memory_bandwidth_bytes_per_s"] == 1.2e10 + 2
    assert calibration["device"]["runs"][0] == newest.pk
    assert (
        f"median of 3 performance runs (stage runs {newest.pk}, " in calibration["device"]["source"]
    )
    assert "a twin of 984,192 params, bfloat16" in calibration["basis"]
    assert pool_calibration(pool=cpu, runs=1)["decode_factor"] == pytest.approx(0.7)
    assert pool_calibration(pool=other)["decode_factor"] == pytest.approx(0.7)


def test_the_runner_gives_the_plan_the_pools_calibration():
    pool = AcceleratorPool.objects.create(name="h100x8", backend="manifest", accelerator="h100")
    analysis = analyze_config(load_realconfig(LLAMA)).to_dict()

    def plan_once():
        job = make_job(
            stages=("analyze", "plan"),
            pool=pool,
            statuses={"analyze": "succeeded", "plan": StageStatus.QUEUED},
            results={"analyze": analysis},
        )
        run = job.stage_runs.get(stage="plan")
        runner.execute_stage_run(run.pk, final_try=True)
        run.refresh_from_db()
        assert run.status == StageStatus.SUCCEEDED, run.error
        return run

    first = plan_once().result["predicted"]
    assert first["calibrated"]["available"] is False
    assert first["calibrated"]["reason"].startswith("no calibration yet: pool h100x8")
    performance_run(pool, [0.25], [0.5])
    second = plan_once()
    calibrated = second.result["predicted"]["calibrated"]
    assert calibrated["decode_factor"] == 0.25 and calibrated["runs"] == 1
    assert calibrated["available"] is False and calibrated["reason"] == SUPERSEDED
    assert second.result["predicted"]["batch_1"] == first["batch_1"]
    assert SUPERSEDED in second.log
