"""The stability stage's known limitations: each threshold the sustained run crossed
(memory leak, NaN/Inf outputs, exceptions, step-time drift). Registered as the stage's
`findings` in `engine.registry`; their words are `templates/limitations/stability/`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.findings import MAJOR, MINOR, Finding
from engine.stages.stability.result import DRIFT, LEAK, NONFINITE, StabilityResult


def findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """One note per crossed stability threshold, as the run's result judges it
    (`StabilityResult`): memory leak, NaN/Inf outputs, exceptions (major), step-time drift
    (minor). None for a result that is not a judged stability run."""
    run_result = StabilityResult.from_stored(result)
    if not run_result.has_verdict:
        return None
    limits = run_result.thresholds
    # What every note says of the run: the dtype, the pool, how long and how many steps.
    run = {
        "dtype": run_result.workload.dtype or "?",
        "pool": pool,
        "duration_s": run_result.duration_s,
        "steps": run_result.steps,
    }
    found = []
    if run_result.leaked():
        found.append(
            Finding(
                key="stability:memory-leak",
                template="stability/memory-leak",
                data=run
                | {
                    "slope_bytes_per_step": run_result.memory_slope_bytes_per_step,
                    "growth_bytes": run_result.memory_growth_bytes,
                    "limit_bytes_per_step": limits.leak_bytes_per_step,
                    "limit_growth_bytes": limits.leak_min_growth_bytes,
                    "said": run_result.said(LEAK) or "",
                },
                severity=MAJOR,
            )
        )
    if run_result.nonfinite_over():
        found.append(
            Finding(
                key="stability:nonfinite",
                template="stability/nonfinite",
                data=run
                | {
                    "nonfinite_outputs": run_result.nonfinite_outputs,
                    "limit": limits.max_nonfinite_outputs,
                    "said": run_result.said(NONFINITE) or "",
                },
                severity=MAJOR,
            )
        )
    if run_result.raised():
        found.append(
            Finding(
                key="stability:exceptions",
                template="stability/exceptions",
                data=run | {"errors": run_result.errors, "first_error": run_result.first_error},
                severity=MAJOR,
            )
        )
    if run_result.drifted():
        found.append(
            Finding(
                key="stability:step-time-drift",
                template="stability/step-time-drift",
                data=run
                | {
                    "drift": run_result.step_time_drift,
                    "limit": limits.max_step_time_drift,
                    "said": run_result.said(DRIFT) or "",
                },
                severity=MINOR,
            )
        )
    return found
