"""A pool's full-size sweeps measured on its engine, for the planner's closed loop
(`engine/stages/plan/closed_loop.py`)."""

from __future__ import annotations

from typing import Any

from adaptation.models import AcceleratorPool, StageRun, StageStatus
from engine.stages.plan.closed_loop import MAX_SWEEPS
from engine.stages.plan.result import PlanResult, Split
from engine.stages.plan.run import pool_engine
from engine.stages.serve.full_size_result import launch_split


def _records(run: StageRun, analysis: dict[str, Any], plan: Split) -> list[dict]:
    """The closed loop's records of one serve run (`plan`: its job's split)."""
    full_size = (run.result or {}).get("full_size") or {}
    settings = full_size.get("sweep_settings") or {}
    engine = pool_engine(run.job.pool)
    base = {
        "stage_run": run.pk,
        "job": run.job_id,
        "analysis": analysis,
        "dtype": full_size.get("dtype") or "checkpoint",
        "kv_dtype": "bfloat16",  # the launches leave --kv-cache-dtype at auto: 16-bit
        "engine": engine,
    }
    primary = {
        "input_tokens": settings.get("input_tokens"),
        "output_tokens": settings.get("output_tokens"),
        "sweep": full_size.get("sweep") or [],
    }
    records = [
        {
            **base,
            "split": launch_split(int(full_size.get("tp") or 1), plan),
            "workloads": [primary, *(full_size.get("workloads") or [])],
        }
    ]
    for entry in full_size.get("tp_scaling") or []:
        tp = entry.get("tp")
        if isinstance(tp, int) and tp > 0 and entry.get("sweep"):
            records.append(
                {
                    **base,
                    "split": launch_split(tp, plan),
                    "workloads": [{**primary, "sweep": entry["sweep"]}],
                }
            )
    return records


def pool_full_size_sweeps(*, pool: AcceleratorPool, runs: int = MAX_SWEEPS) -> list[dict]:
    """The pool's newest serve runs that measured the full-size model (`full_size.status`
    "measured"), newest first, each as the closed loop reads it: {"stage_run", "job",
    "analysis" (the job's analyze result), "split", "dtype", "kv_dtype", "engine",
    "workloads": [{"input_tokens", "output_tokens", "sweep"}]}; a TP the launch was also
    measured at (`tp_scaling`) is a record of its own."""
    serve_runs = list(
        StageRun.objects.filter(
            job__pool=pool,
            stage="serve",
            status__in=(StageStatus.SUCCEEDED, StageStatus.FAILED),
            result__full_size__status="measured",
        )
        .select_related("job__pool")
        .order_by("-finished_at", "-id")[:runs]
    )
    if not serve_runs:
        return []
    earlier = {
        (run.job_id, run.stage): run.result or {}
        for run in StageRun.objects.filter(
            job_id__in={run.job_id for run in serve_runs},
            stage__in=("analyze", "plan"),
            status=StageStatus.SUCCEEDED,
        ).order_by("attempt")
    }
    records: list[dict] = []
    for run in serve_runs:
        analysis = earlier.get((run.job_id, "analyze"))
        if analysis:
            plan = PlanResult.from_stored(earlier.get((run.job_id, "plan"))).split
            records.extend(_records(run, analysis, plan))
    return records
