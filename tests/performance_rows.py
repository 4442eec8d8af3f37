"""Performance and stability results made by the engine itself, and the rows a job keeps of
them, for page and browser tests.

The results come from real twins of published configs (Llama-3.1-8B dense, DeepSeek-V3 MoE)
measured on this machine's CPU with small sweeps; each is made once per test session. The
full-size predictions come from the planner on one node of eight H200s, as the plan stage of
a job on such a pool would give them; the dense plan also carries what the pool's running
calibration (from the MoE run's measured efficiencies) says beside it (reported, not
applied). Rows are stored by the `performance` stage's own result handler
(`adaptation.services.stage_results`).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from adaptation.models import AcceleratorPool, AdaptationJob, ModelRelease, PerformancePoint
from tests.conftest import load_realconfig
from tests.factories import make_job, make_release

DENSE = "meta-llama__Llama-3.1-8B"
MOE = "deepseek-ai__DeepSeek-V3"
STAGES = ("fetch", "analyze", "plan", "performance", "stability")
# Small sweeps: batches 1, 2, 4; the dense one at two prompt lengths (for the prompt-length
# axis); the MoE one runs out of memory at batch 4 (a hook raises as CUDA would).
DENSE_SWEEP = {
    "max_batch_size": 4,
    "prompt_lens": [16, 32],
    "warmup": 1,
    "repeats": 3,
    "prefill_warmup": 1,
    "prefill_repeats": 3,
    "dtypes": ["float32", "bfloat16"],
}
MOE_SWEEP = DENSE_SWEEP | {"prompt_lens": [16], "dtypes": ["bfloat16"]}
# The pages read a clean run: on a busy machine a 2 s run's step times drift past the stage's
# +50 % default (tests/engine/stages/stability/test_stability.py tests the drift check itself).
STABILITY = {"duration_s": 2.0, "min_steps": 20, "max_step_time_drift": 10.0}
OOM_BATCH = 4


def _json(value: Any) -> Any:
    """As the database keeps a stage's result (JSON, no NaN)."""
    return json.loads(json.dumps(value, allow_nan=False))


def _out_of_memory_from_batch(batch: int):
    import torch

    def install(model):
        def hook(_module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None and ids.shape[0] >= batch:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        return model.register_forward_pre_hook(hook, with_kwargs=True)

    return install


def _keep_layer_outputs(model):
    """A deliberate leak: every decoder layer's output is kept forever."""
    kept: list = []

    def hook(_module, _args, output):
        kept.append(output[0] if isinstance(output, tuple) else output)

    return [layer.register_forward_hook(hook) for layer in model.model.layers]


@functools.cache
def engine_results() -> dict[str, dict[str, Any]]:
    """{config name: {"analysis", "plan", "performance", "stability"[, "stability_leak"]}}:
    the engine's results for the dense and the MoE twin (made once per session)."""
    import torch

    from engine.architecture import analyze_config
    from engine.contract import PoolSpec, StageFailed
    from engine.stages.performance.run import measure_performance
    from engine.stages.plan.calibration import calibrated_predictions, running_calibration
    from engine.stages.plan.layout import PoolLayout
    from engine.stages.plan.planner import plan_release
    from engine.stages.stability.run import measure_stability
    from engine.twin import build_twin

    cpu = PoolSpec(name="cpu", backend="cpu", queue="pool.cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a worker runs; two threads on a shared host only add noise
    try:
        results: dict[str, dict[str, Any]] = {}
        for name, sweep, hooks in (
            (MOE, MOE_SWEEP, (_out_of_memory_from_batch(OOM_BATCH),)),
            (DENSE, DENSE_SWEEP, ()),
        ):
            config = load_realconfig(name)
            analysis = analyze_config(config).to_dict()
            plan = plan_release(analysis, PoolLayout("h200", 8), release=name).to_dict()
            if name == DENSE:  # the pool's running calibration, from the MoE run before it
                points = results[MOE]["performance"]["calibration"]["points"]
                running = running_calibration(
                    "h200x8",
                    [
                        {
                            "stage_run": 1,
                            "decode_efficiency": [p["decode_efficiency"] for p in points],
                            "prefill_efficiency": [p["prefill_efficiency"] for p in points],
                        }
                    ],
                )
                plan["predicted"]["calibrated"] = calibrated_predictions(plan["predicted"], running)
            twin = build_twin(config)
            performance = measure_performance(twin, cpu, options=sweep, plan=plan, hooks=hooks)
            results[name] = {
                "analysis": _json(analysis),
                "plan": _json(plan),
                "performance": _json(performance),
            }
            if name == DENSE:
                results[name]["stability"] = _json(measure_stability(twin, cpu, options=STABILITY))
                try:
                    measure_stability(
                        twin,
                        cpu,
                        options=STABILITY | {"leak_min_growth_bytes": 0},
                        hooks=[_keep_layer_outputs],
                    )
                except StageFailed as exc:
                    results[name]["stability_leak"] = _json(exc.result)
                    results[name]["stability_leak_error"] = str(exc)
        return results
    finally:
        torch.set_num_threads(threads)


def h200_pool(name: str = "h200x8") -> AcceleratorPool:
    pool, _ = AcceleratorPool.objects.get_or_create(
        name=name,
        defaults={
            "backend": "cuda",
            "device": "cuda:0",
            "queue": f"pool.{name}",
            "accelerator": "h200",
            "devices_per_node": 8,
            "dtypes": ["float32", "bfloat16"],
        },
    )
    return pool


def store_performance_rows(job: AdaptationJob) -> list[PerformancePoint]:
    """The rows of the job's performance run, stored by the stage's result handler."""
    from adaptation.services import stage_results

    run = job.stage_runs.get(stage="performance")
    stage_results.apply(run=run, result=run.result)
    return list(PerformancePoint.objects.filter(stage_run=run))


def measured_job(
    name: str,
    *,
    pool: AcceleratorPool | None = None,
    release: ModelRelease | None = None,
    stability: str = "stability",
) -> AdaptationJob:
    """A finished job of `name` on `pool` (default h200x8) whose performance and stability
    runs hold the engine's results and whose performance rows are stored. `stability`:
    "stability" (a clean run), "stability_leak" (failed on a deliberate leak) or "" (none)."""
    results = engine_results()[name]
    statuses = dict.fromkeys(STAGES[:4], "succeeded")
    stage_results = {
        "analyze": results["analysis"],
        "plan": results["plan"],
        "performance": results["performance"],
    }
    errors = {}
    stages = STAGES if stability else STAGES[:4]
    if stability:
        stage_results["stability"] = results[stability]
        statuses["stability"] = "succeeded" if stability == "stability" else "failed"
        if stability == "stability_leak":
            errors["stability"] = results["stability_leak_error"]
    job = make_job(
        release=release or make_release(repo_id=name.replace("__", "/")),
        pool=pool or h200_pool(),
        stages=stages,
        statuses=statuses,
        results=stage_results,
        errors=errors,
    )
    store_performance_rows(job)
    return job
