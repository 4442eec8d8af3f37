"""The plan stage's typed result (`engine/stages/plan/result.py`): a plan the stage made (and
the result a plan that fits nothing keeps) reads back as stored, rows of older versions and
rubbish read as empty without raising, and the judgements (fits, where the speeds come from,
the sequences held, the KV room, the launch commands) are made once."""

from __future__ import annotations

from typing import Any

import pytest

from engine.contract import StageFailed
from engine.stages.plan.result import (
    CATALOG,
    CPU_MEASURED,
    CPU_UNMEASURED,
    DecodePoint,
    PlanResult,
    Split,
    Suggestions,
)
from engine.stages.plan.run import run
from tests.engine.stages.plan.test_plan_stage import context, pool


@pytest.fixture(scope="module")
def h200_plan() -> dict[str, Any]:
    """DeepSeek-V3 planned by the stage on one node of 8 H200s."""
    return run(context(pool(accelerator="h200"), "deepseek-ai__DeepSeek-V3"))


def test_a_plan_reads_back_as_the_stage_stored_it(h200_plan):
    result = PlanResult.from_stored(h200_plan)
    stored_predicted = h200_plan["predicted"]

    assert result.planned and not result.does_not_fit
    assert result.split == Split(**{key: h200_plan[key] for key in ("tp", "pp", "ep", "dp")})
    assert (result.devices, result.nodes) == (h200_plan["devices"], h200_plan["nodes"])
    assert result.pool is not None and result.pool.to_dict() == h200_plan["pool"]
    assert result.memory_per_device_bytes == h200_plan["memory_per_device_bytes"]
    assert result.memory_weights_by_dtype_bytes == h200_plan["memory_weights_by_dtype_bytes"]
    assert result.dtype_shown == h200_plan["dtype_label"]
    assert result.catalog_version == h200_plan["catalog_version"]
    assert result.inputs is not None
    assert result.context_tokens == h200_plan["inputs"]["context_tokens"]
    assert result.concurrency == h200_plan["inputs"]["concurrency"]
    # The speed prediction, its curves and the served workload with the fit it names.
    predicted = result.predicted
    assert predicted is not None and result.predicted_reason == ""
    assert predicted.batch_1.tokens_per_s == stored_predicted["batch_1"]["decode_tokens_per_s"]
    assert [p.sequences for p in predicted.decode_curve] == [
        p["concurrent_sequences"] for p in stored_predicted["decode_curve"]
    ]
    assert [p.prompt_tokens for p in predicted.prefill] == [
        p["prompt_tokens"] for p in stored_predicted["prefill"]
    ]
    assert result.max_concurrency == stored_predicted["largest_batch_sequences"]
    workload = result.workload
    stored_workload = stored_predicted["workload"]
    assert workload is not None
    assert (workload.input_tokens, workload.output_tokens, workload.engine) == (
        stored_workload["input_tokens"],
        stored_workload["output_tokens"],
        stored_workload["engine"],
    )
    assert workload.max_load is not None
    assert (
        workload.max_load.output_tokens_per_s
        == stored_predicted["workload"]["max_load"]["output_tokens_per_s"]
    )
    assert (
        result.fit is not None and result.fit.to_dict()["scope"] == stored_predicted["fit"]["scope"]
    )
    # No calibration yet: the plan says why.
    assert result.calibration is not None and result.calibration.prediction is None
    assert result.calibration.reason == stored_predicted["calibrated"]["reason"]
    assert result.speeds_from == CATALOG and result.measured_device is None
    # The tables.
    assert [p.devices for p in result.scaling] == [p["devices"] for p in h200_plan["scaling"]]
    assert result.scaling_predicted
    assert [r.why_lost for r in result.runners_up] == [
        r["why_lost"] for r in h200_plan["runners_up"]
    ]
    assert result.communication is not None
    assert [(row.kind, row.bytes_per_token) for row in result.communication.rows] == [
        ("tp", h200_plan["communication"]["tp_allreduce_bytes_per_token"]),
        ("ep", h200_plan["communication"]["ep_alltoall_bytes_per_token"]),
        ("pp", h200_plan["communication"]["pp_p2p_bytes_per_token"]),
    ]
    assert result.artifacts.launch() == {
        "vllm": h200_plan["artifacts"]["vllm"],
        "sglang": h200_plan["artifacts"]["sglang"],
    }
    assert result.notes == h200_plan["notes"]
    assert result.assumptions == h200_plan["assumptions"]


def test_the_kv_room_is_the_budget_less_what_else_the_device_holds(h200_plan):
    memory = h200_plan["memory_per_device_bytes"]
    room = (
        memory["budget"]
        - memory["weights"]
        - memory["activations_workspace"]
        - memory["runtime_overhead"]
    )
    assert PlanResult.from_stored(h200_plan).kv_room_bytes() == room
    # Without the runtime overhead it counts none; without the weights there is no room.
    without = {k: v for k, v in memory.items() if k != "runtime_overhead"}
    assert (
        PlanResult.from_stored({"memory_per_device_bytes": without}).kv_room_bytes()
        == room + memory["runtime_overhead"]
    )
    assert (
        PlanResult.from_stored({"memory_per_device_bytes": {"budget": 1.0}}).kv_room_bytes() is None
    )


def test_a_plan_that_fits_nothing_keeps_what_would_fit():
    with pytest.raises(StageFailed) as caught:
        run(context(pool(accelerator="h100", devices_per_node=8), "deepseek-ai__DeepSeek-V3"))
    stored = caught.value.result
    result = PlanResult.from_stored(stored)

    assert result.does_not_fit and not result.planned
    assert result.reason == stored["reason"]
    assert result.suggestions.to_dict() == stored["suggestions"]
    assert result.accelerator == "h100" and result.pool is not None
    assert result.predicted is None and result.split == Split()


def test_where_a_cpu_plans_speeds_come_from():
    measured = {
        "accelerator": "cpu",
        "predicted": {"available": True, "batch_1": {"decode_tokens_per_s": 5.0}},
        "measured_device": {
            "memory_bandwidth_bytes_per_s": 2.8e9,
            "dense_bf16_flops": 1e10,
            "source": "performance runs",
            "host_busy": True,
        },
    }
    result = PlanResult.from_stored(measured)
    assert result.speeds_from == CPU_MEASURED
    assert result.measured_device is not None and result.measured_device.host_busy is True
    unmeasured = {"accelerator": "cpu", "predicted": {"available": False, "reason": "no figures"}}
    assert PlanResult.from_stored(unmeasured).speeds_from == CPU_UNMEASURED
    assert PlanResult.from_stored(unmeasured).predicted_reason == "no figures"


def test_the_checkpoint_format_is_the_first_word_of_its_label():
    label = "checkpoint (fp8 e4m3 (128x128 blocks))"
    assert (
        PlanResult.from_stored({"dtype": "checkpoint", "dtype_label": label}).checkpoint_format
        == "fp8"
    )
    assert (
        PlanResult.from_stored({"dtype": "bfloat16", "dtype_label": label}).checkpoint_format == ""
    )
    assert PlanResult.from_stored({"dtype": "checkpoint"}).checkpoint_format == ""


@pytest.mark.parametrize("stored", [None, "a plan", [1, 2], {}])
def test_a_row_that_is_no_plan_reads_as_an_empty_one(stored):
    result = PlanResult.from_stored(stored)
    assert result.fits is None and not result.planned and not result.does_not_fit
    assert result.predicted is None and result.workload is None and result.scaling == []
    assert result.artifacts.launch() == {} and result.suggestions == Suggestions()


def test_rubbish_inside_a_plan_is_ignored_without_raising():
    result = PlanResult.from_stored(
        {
            "fits": "yes",
            "tp": "2",
            "pp": 1.0,
            "devices": True,
            "memory_per_device_bytes": {"weights": "big", "budget": 10, "free": float("inf")},
            "predicted": {
                "available": True,
                "batch_1": 3,
                "largest_batch": "many",
                "decode_curve": [1, {"concurrent_sequences": 2}],
                "prefill": "none",
                "workload": {"max_load": [], "curve": [{"concurrency": None}, {"concurrency": 4}]},
                "calibrated": {"available": True, "runs": "3", "decode_factor": 0.5},
            },
            "scaling": [{"devices": 0}, "x", {"devices": 2, "within_pool": False}],
            "runners_up": ["x", {"fits": 1, "why_lost": None}],
            "communication": {"tp_allreduce_bytes_per_token": "1 KB", "crosses_nodes": 1},
            "artifacts": {"vllm": 3, "sglang": "sglang serve", "notes": "one"},
            "suggestions": {"devices": 16.0, "context_tokens": "4k"},
            "inputs": ["context"],
            "notes": "a note",
        }
    )
    assert result.fits is None and result.split == Split(pp=1) and result.devices is None
    assert result.memory_per_device_bytes == {"budget": 10.0}
    predicted = result.predicted
    assert (
        predicted is not None and predicted.batch_1 == DecodePoint() and predicted.largest is None
    )
    assert predicted.decode_curve == [DecodePoint(sequences=2)] and predicted.prefill == []
    assert result.workload is not None and result.workload.max_load is None
    assert [p.concurrency for p in result.workload.curve] == [4]
    assert result.calibration is not None and result.calibration.runs is None
    assert result.calibration.decode_factor == 0.5
    assert [(p.devices, p.within_pool, p.above_one) for p in result.scaling] == [(2, False, False)]
    assert not result.scaling_predicted
    assert [(r.fits, r.why_lost) for r in result.runners_up] == [(False, "")]
    assert result.communication is not None and not result.communication.crosses_nodes
    assert not any(row.used for row in result.communication.rows)
    assert result.artifacts.launch() == {"sglang": "sglang serve"} and result.artifacts.notes == []
    assert result.suggestions.to_dict() == {"devices": 16}
    assert result.inputs is None and result.notes == []
