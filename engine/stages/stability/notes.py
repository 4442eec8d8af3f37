"""The stability run's section of the release notes: the verdict with its reason, and the
run's steps, duration, memory slope, step-time drift, NaN/Inf outputs and exceptions,
measured on the twin (`templates/release_notes/sections/stability.md`).

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from typing import Any

from engine.markdown import first_line
from engine.notes import NotesContext, StageState
from engine.stages.stability.result import StabilityResult

PLACE = 60


def ran_twin(state: StageState) -> bool:
    """Whether the stage served the twin: it kept a result (a failed run keeps one)."""
    return state.result is not None


def section(state: StageState, notes: NotesContext) -> dict[str, Any]:
    """{"available", "passed", "verdict", "reason", "duration_s", "steps",
    "memory_slope_bytes_per_step", "step_time_drift" (a fraction), "nonfinite_outputs",
    "errors", "dtype", "device"}; "available" False (with status and reason) when the stage
    kept no verdict."""
    result = StabilityResult.from_stored(state.result)
    if state.status not in ("succeeded", "failed") or result.passed is None:
        return {"available": False, "status": state.status, "reason": state.reason}
    return {
        "available": True,
        "passed": result.passed,
        "verdict": result.verdict,
        "reason": first_line(result.reason or state.reason, 400),
        "duration_s": result.duration_s,
        "steps": result.steps,
        "memory_slope_bytes_per_step": result.memory_slope_bytes_per_step,
        "step_time_drift": result.step_time_drift,
        "nonfinite_outputs": result.nonfinite_outputs,
        "errors": result.errors,
        "dtype": result.workload.dtype,
        "device": result.workload.device,
    }
