"""Stage results for the release-notes tests: the real `analyze` and `plan` engines on
gpt-oss-20b's published config (one H200 node), and operators, precision, distributed,
performance and stability results in the shapes those stages return (`workers/stages/*.py`;
the keys the end-to-end tests and `tests/sample_results.py` read), with the performance
stage's own knee finder and full-size predictions from the plan. The distributed stage's
results are recorded runs (`tests/data/distributed/`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.architecture import analyze_config
from engine.stages.distributed.degree import validated_tp
from engine.stages.fetch.result import FetchResult
from engine.stages.operators.result import OperatorCounts, OperatorRow, OperatorsResult
from engine.stages.performance.run import KNEE_RULE, find_knee, predicted_points
from engine.stages.plan.errors import NoFittingPlan
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from engine.stages.plan.run import no_fit_result
from engine.stages.precision.result import DtypeComparison
from engine.stages.stability.result import StabilityResult, StabilityWorkload
from tests.conftest import load_realconfig
from tests.typed_results import precision_result

GPT_OSS = "openai__gpt-oss-20b"
REPO_ID = "openai/gpt-oss-20b"
TWIN = {
    "architecture": "GptOssForCausalLM",
    "model_type": "gpt_oss",
    "weights_source": "seeded",
    "weights": "seeded (torch.manual_seed(0)); the release's weights are not loaded",
    "parameters": 2_318_848,
    "sizes": {"hidden_size": 64, "num_hidden_layers": 4},
}
# The twin's measured decode sweep (bfloat16, prompt 32): tokens/s grows 90%, 74%, then 6%.
MEASURED_TOKENS_PER_S = {1: 100.0, 2: 190.0, 4: 330.0, 8: 350.0}
KNEE_BATCH = 4
DISTRIBUTED_RECORDS = Path(__file__).resolve().parent / "data" / "distributed"


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=False))


def analysis(name: str = GPT_OSS) -> dict[str, Any]:
    """The analyze stage's result: `analyze_config(...).to_dict()` plus "new_against_known"."""
    return _json(analyze_config(load_realconfig(name)).to_dict() | {"new_against_known": []})


def plan(name: str = GPT_OSS, *, accelerator: str = "h200", devices: int = 8) -> dict[str, Any]:
    """The plan stage's result on one node of `devices` x `accelerator` (the planner's defaults:
    context capped at 32,768 tokens, 4 sequences, the checkpoint's dtype)."""
    result = plan_release(
        analysis(name), PoolLayout(accelerator, devices), release=name.replace("__", "/")
    ).to_dict()
    result["predicted"]["calibrated"] = {"available": False, "reason": "no calibration yet"}
    return _json(result | {"catalog_version": "test"})


def failed_plan(name: str, *, accelerator: str = "h200", devices: int = 1) -> tuple[str, dict]:
    """(error, result) of a plan that fits nothing: what the plan stage keeps on its run."""
    from engine.catalog import load_catalog

    layout = PoolLayout(accelerator, devices)
    shape = analysis(name)
    try:
        plan_release(shape, layout, release=name)
    except NoFittingPlan as err:
        return str(err), _json(no_fit_result(err, shape, layout, load_catalog(), {}, release=name))
    raise AssertionError(f"{name} fits {devices} x {accelerator}")


def operators() -> dict[str, Any]:
    """The operators stage's result on the H200 pool: the twin's two operators covered."""
    rows = (
        OperatorRow("aten::mm.default", "covered", dtypes=("bfloat16",)),
        OperatorRow(
            "aten::_grouped_mm.default",
            "covered",
            dtypes=("bfloat16",),
            feature="MoE experts (32 routed, top-4)",
        ),
    )
    return OperatorsResult(
        operators=rows,
        device="cuda:0",
        backend="cuda",
        checked_against="torch dispatcher (CUDA)",
        dispatch_key="CUDA",
        dtype="bfloat16",
        decode_steps=2,
        twin=TWIN,
        counts=OperatorCounts.of(rows),
    ).to_dict()


def _compared(dtype: str, *, passed: bool, top1: float, max_abs: float) -> DtypeComparison:
    return DtypeComparison(
        dtype,
        passed=passed,
        reason=f"{dtype}: "
        + ("within thresholds" if passed else "top-1 agreement 0.8125 under 0.9")
        + ("; no divergent layer" if passed else "; first divergent layer 2 (mlp)"),
        max_abs_error=max_abs,
        mean_abs_error=max_abs / 10,
        cosine_similarity=0.99991 if passed else 0.97,
        top1_agreement=top1,
        kl_divergence=2.5e-05 if passed else 0.03,
        thresholds={"min_top1_agreement": 0.9, "max_local_relative_error": 0.05},
        unit_roundoff=2**-8 if dtype == "bfloat16" else 2**-11,
        first_divergent_layer=None if passed else 2,
        first_divergent_module="" if passed else "mlp",
        first_divergent_name="" if passed else "model.layers.2.mlp",
    )


def precision(*, float16_passes: bool = True) -> dict[str, Any]:
    """A precision result over bfloat16 and float16 (float16 fails unless `float16_passes`)."""
    return precision_result(
        _compared("bfloat16", passed=True, top1=1.0, max_abs=0.0312),
        _compared(
            "float16",
            passed=float16_passes,
            top1=1.0 if float16_passes else 0.8125,
            max_abs=0.0041 if float16_passes else 3.75,
        ),
        skipped_dtypes={"int8": "the pool's backend has no int8 weight-only matmul"},
        reference_device="cpu",
        reference_dtype="float32",
        target_device="cuda:0",
        decode_steps=4,
        prompt_batch=2,
        prompt_tokens=16,
        twin=TWIN,
        passed=float16_passes,
    )


def performance(plan_result: dict[str, Any] | None) -> dict[str, Any]:
    """A performance result: the twin's measured sweep (bfloat16, prompt 32, batches 1-8),
    its knee by the stage's own `find_knee`, and the plan's full-size predictions
    (`predicted_points`)."""
    measured = [
        {
            "kind": "measured",
            "model": "twin",
            "dtype": "bfloat16",
            "batch_size": batch,
            "prompt_len": 32,
            "ttft_s": 0.004 * batch,
            "ttft_p95_s": 0.005 * batch,
            "tpot_s": batch / tokens,
            "tpot_p95_s": 1.1 * batch / tokens,
            "prefill_tokens_per_s": 32 * batch / (0.004 * batch),
            "decode_tokens_per_s": tokens,
            "peak_memory_bytes": 50_000_000 + batch * 1_000_000,
            "peak_memory_increase_bytes": batch * 1_000_000,
            "memory_before_bytes": 50_000_000,
            "memory_kind": "allocated",
            "prefill_samples": 3,
            "decode_samples": 3,
        }
        for batch, tokens in MEASURED_TOKENS_PER_S.items()
    ]
    knee = {"dtype": "bfloat16", "prompt_len": 32} | find_knee(measured, 0.1)
    predicted, info = predicted_points(plan_result)
    return _json(
        {
            "points": measured + predicted,
            "knee_batch_size": knee["batch_size"],
            "knee_tpot_s": knee["tpot_s"],
            "knee": knee,
            "knees": [knee],
            "knee_by_dtype": {"bfloat16": knee},
            "knee_rule": KNEE_RULE.format(growth=0.1, prompt_len=32),
            "stopped": [],
            "errors": [],
            "skipped_dtypes": {},
            "skipped_prompt_lens": [],
            "predicted": info,
            "calibration": {"available": False, "reason": "no device figures"},
            "device": "cuda:0",
            "backend": "cuda",
            "memory_kind": "allocated",
            "options": {"max_batch_size": 8, "prompt_lens": [32, 128]},
            "twin": TWIN,
            "notes": ["measured on the twin"],
            "duration_s": 12.5,
        }
    )


def recorded_distributed(name: str) -> tuple[str, dict[str, Any]]:
    """(the stage's error, its stored result) of a distributed run recorded on 2 gloo
    processes: "pass" (a Qwen3-MoE twin, TP=2 EP=2 against a TP8 EP8 plan), "not_validated"
    (no tensor-parallel plan), "mismatch" (a wrong shard injected) and "crash" (a rank
    killed): the failed runs' error is their reason; theirs were recorded from
    `validate_split` on Llama-3.1-8B's twin, so the stage's plan fields are added."""
    data = json.loads((DISTRIBUTED_RECORDS / f"{name}.json").read_text())
    if "result" not in data:
        return "", data
    plan = {"tp": 2, "pp": 1, "ep": 1, "dp": 1}
    known = {"plan": plan, "pool_devices": 2, "degree_reason": validated_tp(2, 2)[1]}
    return data["reason"], data["result"] | known | {"ep_note": None}


def distributed(plan_result: dict[str, Any]) -> dict[str, Any]:
    """The distributed stage's result for `plan_result` on the H200 node: the recorded
    passing run's figures at the degree `validated_tp` picks for the plan (TP=2 for a plan on
    one device), on CUDA with NCCL, the experts unsplit as the plan's EP is 1."""
    _, recorded = recorded_distributed("pass")
    split = {key: plan_result[key] for key in ("tp", "pp", "ep", "dp")}
    tp, why = validated_tp(split["tp"], 8)
    return _json(
        recorded
        | {
            "tp": tp,
            "ep": 1,
            "world_size": tp,
            "backend": "nccl",
            "device_type": "cuda",
            "plan": split,
            "pool_devices": 8,
            "degree_reason": why,
            "twin": {
                "class": TWIN["architecture"],
                "parameters": TWIN["parameters"],
                "weights_source": "seeded",
            },
            "reason": (
                f"TP={tp} on {tp} nccl processes matches the float32 reference: max |logit "
                "error| 7.45e-07 (tolerance 1.28e-04), top-1 agreement 1.000 on every rank"
            ),
        }
    )


def stability(*, passed: bool = True) -> dict[str, Any]:
    """A stability result as the stage stores it (`StabilityResult.to_dict`), without the
    thresholds it was judged by: the notes read its verdict, no finding is judged of it."""
    reason = (
        "within every threshold"
        if passed
        else "memory leak: slope 9,000 bytes/step over the threshold of 1,024 bytes/step"
    )
    return StabilityResult(
        duration_s=20.02,
        steps=412,
        memory_slope_bytes_per_step=3.0 if passed else 9000.0,
        nonfinite_outputs=0,
        errors=0,
        step_time_drift=0.012,
        passed=passed,
        reason=reason,
        reasons=() if passed else (reason,),
        workload=StabilityWorkload(dtype="bfloat16", device="cuda:0", batch_size=4),
        twin=TWIN,
    ).to_dict()


def full_results(plan_result: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Every earlier stage's result for gpt-oss-20b on one H200 node, all passing."""
    plan_result = plan_result or plan()
    return {
        "fetch": FetchResult(files=("config.json",), config=load_realconfig(GPT_OSS)).to_dict(),
        "analyze": analysis(),
        "operators": operators(),
        "precision": precision(),
        "plan": plan_result,
        "distributed": distributed(plan_result),
        # the H200 pool of these notes names no serving engine: the stage did not serve
        "serve": {"status": "not_configured", "mode": None, "passed": None},
        "performance": performance(plan_result),
        "stability": stability(),
    }
