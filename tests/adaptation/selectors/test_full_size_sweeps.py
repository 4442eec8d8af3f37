"""A pool's measured full-size sweeps as the planner's closed loop reads them
(adaptation/selectors/full_size.py), through the pool's running calibration."""

from __future__ import annotations

import pytest

from adaptation.selectors.calibration import pool_calibration
from adaptation.selectors.full_size import pool_full_size_sweeps
from engine.architecture import analyze_config
from engine.stages.serve.full_size_result import Level
from tests.engine.stages.realconfigs import load
from tests.factories import cpu_pool, make_job

pytestmark = pytest.mark.django_db

# Two levels as the serve stage stores them (`Level.to_dict`).
SWEEP = [
    Level(concurrency=1, requests=4, completed=4, output_tokens_per_s=9.5).to_dict(),
    Level(concurrency=2, requests=8, completed=8, output_tokens_per_s=17.0).to_dict(),
]


def served_job(pool, *, full_size: dict, serve_status: str = "succeeded"):
    analysis = analyze_config(load("HuggingFaceTB__SmolLM2-135M")).to_dict()
    return make_job(
        stages=("analyze", "plan", "serve"),
        pool=pool,
        statuses={"analyze": "succeeded", "plan": "succeeded", "serve": serve_status},
        results={
            "analyze": analysis,
            "plan": {"tp": 1, "pp": 1, "dp": 1, "ep": 1},
            "serve": {"full_size": full_size},
        },
    )


def measured(**extra) -> dict:
    return {
        "status": "measured",
        "tp": 1,
        "dtype": "bfloat16",
        "sweep_settings": {"input_tokens": 128, "output_tokens": 64},
        "sweep": SWEEP,
        "workloads": [
            {"label": "decode-heavy", "input_tokens": 16, "output_tokens": 256, "sweep": SWEEP[:1]}
        ],
        **extra,
    }


def test_each_measured_launch_is_a_record_with_its_release_and_split():
    pool = cpu_pool()
    pool.engine = {"kind": "vllm"}
    pool.save(update_fields=["engine"])
    job = served_job(
        pool,
        full_size=measured(tp_scaling=[{"tp": 2, "sweep": SWEEP}]),
    )
    served_job(pool, full_size={"status": "skipped", "reason": "no_tokenizer"})
    records = pool_full_size_sweeps(pool=pool)
    assert [r["split"] for r in records] == ["TP1 PP1 EP1 DP1", "TP2 PP1 EP1 DP1"]
    first = records[0]
    assert first["job"] == job.pk and first["engine"] == "vllm"
    assert first["analysis"]["num_layers"] == 30
    assert [(w["input_tokens"], w["output_tokens"]) for w in first["workloads"]] == [
        (128, 64),
        (16, 256),
    ]
    assert first["workloads"][0]["sweep"] == SWEEP
    assert records[1]["workloads"] == [{"input_tokens": 128, "output_tokens": 64, "sweep": SWEEP}]
    assert pool_calibration(pool=pool)["full_size"] == records


def test_a_pool_without_measured_sweeps_has_none():
    pool = cpu_pool()
    served_job(
        pool, full_size={"status": "failed", "reason": "engine_refused"}, serve_status="failed"
    )
    assert pool_full_size_sweeps(pool=pool) == []


def test_manage_py_plan_on_the_pool_predicts_with_its_own_fit():
    """The command predicts as the plan stage would on the pool: with the fit its measured
    full-size sweeps made, not the cpu prior."""
    import io
    import json

    from django.core.management import call_command

    from tests.adaptation.selectors.test_pool_measured_figures import probed_run
    from tests.engine.stages.realconfigs import REALCONFIGS_DIR

    pool = cpu_pool()
    pool.engine = {"kind": "vllm"}
    pool.save(update_fields=["engine"])
    probed_run(pool, 20.0, 0.4, busy=False, minutes_ago=5)
    config = str(REALCONFIGS_DIR / "HuggingFaceTB__SmolLM2-135M.json")
    args = (config, "--pool", "cpu", "--input-len", "128", "--output-len", "64", "--format", "json")

    def plan() -> dict:
        out = io.StringIO()
        call_command("plan", *args, stdout=out)
        return json.loads(out.getvalue())

    assert plan()["workload"]["fit"]["scope"] == "prior"
    served_job(pool, full_size=measured())
    fitted = plan()
    assert fitted["workload"]["fit"]["scope"] == "pool"
    assert fitted["predicted"]["fit"] == fitted["workload"]["fit"]
    assert fitted["workload"]["fit"]["points"] == 3  # two primary levels and one decode-heavy


def test_a_stored_run_of_another_shape_gives_what_it_holds():
    """The records are read through the full-size run's reader: parts of the wrong shape read
    as empty (a workload that is no mapping, a TP launch with no degree), counts stored as
    2.0 read as whole numbers, and nothing raises."""
    pool = cpu_pool()
    served_job(
        pool,
        full_size=measured(
            tp=2.0,
            workloads="decode-heavy",
            tp_scaling=[{"tp": "one", "sweep": SWEEP}, 7],
        ),
    )
    [record] = pool_full_size_sweeps(pool=pool)
    assert record["split"] == "TP2 PP1 EP1 DP1"
    assert record["workloads"] == [{"input_tokens": 128, "output_tokens": 64, "sweep": SWEEP}]
