"""Stage results stored as rows: operator checks, precision per dtype and per-layer drift,
for a succeeded run and for a failed one that measured before failing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from adaptation.models import LayerDrift, OperatorCheck, PrecisionResult, StageStatus
from engine.contract import StageDefinition, StageFailed
from engine.stages.precision.result import DtypeComparison, LayerDriftRow
from tests.factories import make_job
from workers import runner

pytestmark = pytest.mark.django_db

BF16_COMPARED = DtypeComparison(
    "bfloat16",
    passed=True,
    max_abs_error=0.25,
    mean_abs_error=0.01,
    cosine_similarity=0.9991,
    top1_agreement=0.97,
    kl_divergence=0.0004,
    layers=[
        LayerDriftRow(0, "attention", "", max_abs_error=0.01, relative_error=0.002),
        LayerDriftRow(0, "mlp", "", max_abs_error=0.02, relative_error=0.003),
    ],
)
BF16 = BF16_COMPARED.to_dict()
FP16_FAILED = replace(
    BF16_COMPARED,
    dtype="float16",
    top1_agreement=0.61,
    passed=False,
    first_divergent_layer=1,
    first_divergent_module="norm",
    reason="float16: top-1 agreement 0.61 < 0.95; first divergent layer 1 (norm)",
).to_dict()


def run_stage_returning(monkeypatch, stage: str, body) -> object:
    definition = StageDefinition(name=stage, title=stage, run=body)
    monkeypatch.setattr(runner, "get_stage", lambda name: definition)
    job = make_job(statuses={"fetch": "succeeded", "analyze": "succeeded"})
    run = job.stage_runs.get(stage="analyze")  # stands in for the stage under test
    run.stage = stage
    run.status = StageStatus.QUEUED
    run.save()
    runner.execute_stage_run(run.pk)
    run.refresh_from_db()
    return run


def test_operator_checks_are_stored_as_rows(monkeypatch):
    result = {
        "operators": [
            {
                "name": "aten::mm.default",
                "dtypes": ["float32"],
                "feature": None,
                "status": "covered",
            },
            {
                "name": "aten::_foreach_rope.default",
                "dtypes": ["bfloat16"],
                "feature": "yarn RoPE",
                "status": "missing",
            },
        ],
        "missing": ["aten::_foreach_rope.default"],
    }
    run = run_stage_returning(monkeypatch, "operators", lambda ctx: result)
    assert run.status == StageStatus.SUCCEEDED
    rows = {r.name: r for r in OperatorCheck.objects.filter(stage_run=run)}
    assert rows["aten::_foreach_rope.default"].status == "missing"
    assert rows["aten::_foreach_rope.default"].feature == "yarn RoPE"
    assert rows["aten::mm.default"].pool.name == "cpu"


def test_a_failed_precision_run_keeps_its_measurements(monkeypatch):
    result = {"reference": {"device": "cpu", "dtype": "float32"}, "dtypes": {
        "bfloat16": BF16, "float16": FP16_FAILED}}  # fmt: skip

    def fail_with_measurements(ctx):
        exc = StageFailed(FP16_FAILED["reason"])
        exc.result = result
        raise exc

    run = run_stage_returning(monkeypatch, "precision", fail_with_measurements)
    assert run.status == StageStatus.FAILED
    assert run.error == FP16_FAILED["reason"]
    assert run.result["dtypes"]["float16"]["top1_agreement"] == 0.61
    by_dtype = {r.dtype: r for r in PrecisionResult.objects.filter(stage_run=run)}
    assert by_dtype["bfloat16"].passed and not by_dtype["float16"].passed
    assert (
        by_dtype["float16"].first_divergent_layer,
        by_dtype["float16"].first_divergent_module,
    ) == (1, "norm")
    assert LayerDrift.objects.filter(precision=by_dtype["bfloat16"]).count() == 2


def test_a_precision_failure_with_nan_outputs_is_stored_with_its_reason(monkeypatch):
    reason = "float16: the target's logits hold NaN/Inf; first non-finite hidden state at layer 2"
    nan_metrics = DtypeComparison(
        "float16",
        passed=False,
        first_divergent_layer=2,
        first_divergent_module="moe",
        first_divergent_name="model.layers.2.mlp",
        layers=[LayerDriftRow(2, "moe", "model.layers.2.mlp")],
        non_finite_values=12,
        reason=reason,
    ).to_dict()

    def nan_failure(ctx):
        exc = StageFailed(reason)
        exc.result = {"dtypes": {"bfloat16": BF16, "float16": nan_metrics}}
        raise exc

    run = run_stage_returning(monkeypatch, "precision", nan_failure)
    assert (run.status, run.error) == (StageStatus.FAILED, reason)
    fp16 = PrecisionResult.objects.get(stage_run=run, dtype="float16")
    assert fp16.max_abs_error is None and fp16.first_divergent_name == "model.layers.2.mlp"
    assert fp16.layers.get().relative_error is None
