"""A pool's full-size sweeps measured on its engine, for the planner's closed loop
(`engine/stages/plan/closed_loop.py`)."""

from __future__ import annotations

from typing import Any

from adaptation.models import AcceleratorPool, StageRun, StageStatus
from engine.stages.plan.closed_loop import MAX_SWEEPS
from engine.stages.plan.result import PlanResult, Split
from engine.stages.plan.run import pool_engine
from engine.stages.serve.full_size_result import (
    MEASURED,
    RESULT_KEY,
    Level,
    MeasuredWorkload,
    full_size_run,
    launch_split,
)


def _workload(workload: MeasuredWorkload, levels: list[Level]) -> dict[str, Any]:
    """A workload as the closed loop reads it: its lengths and its sweep's points."""
    return {
        "input_tokens": workload.input_tokens,
        "output_tokens": workload.output_tokens,
        "sweep": [level.to_dict() for level in levels],
    }


def _records(run: StageRun, analysis: dict[str, Any], plan: Split) -> list[dict]:
    """The closed loop's records of one serve run (`plan`: its job's split), read through
    the full-size run's own reader (`FullSizeRun`); none where it measured nothing."""
    full_size = full_size_run(run.result)
    if full_size is None or not full_size.measured or full_size.primary is None:
        return []
    base = {
        "stage_run": run.pk,
        "job": run.job_id,
        "analysis": analysis,
        "dtype": full_size.dtype or "checkpoint",
        "kv_dtype": "bfloat16",  # the launches leave --kv-cache-dtype at auto: 16-bit
        "engine": pool_engine(run.job.pool),
    }
    primary = full_size.primary
    records = [
        {
            **base,
            "split": launch_split(full_size.tp or 1, plan),
            "workloads": [_workload(w, w.levels) for w in full_size.workloads],
        }
    ]
    for launch in full_size.tp_launches:
        if launch.tp is not None and launch.tp > 0 and launch.levels:
            records.append(
                {
                    **base,
                    "split": launch_split(launch.tp, plan),
                    "workloads": [_workload(primary, launch.levels)],
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
            **{f"result__{RESULT_KEY}__status": MEASURED},
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
