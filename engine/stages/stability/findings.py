"""The stability stage's known limitations: each threshold the sustained run crossed
(memory leak, NaN/Inf outputs, exceptions, step-time drift). Registered as the stage's
`findings` in `engine.registry`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine import markdown as md
from engine.findings import MAJOR, MINOR, Finding, cut_title
from engine.stages.stability.result import DRIFT, LEAK, NONFINITE, StabilityResult


def findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """One note per crossed stability threshold, as the run's result judges it
    (`StabilityResult`): memory leak, NaN/Inf outputs, exceptions (major), step-time drift
    (minor). None for a result that is not a judged stability run."""
    run_result = StabilityResult.from_stored(result)
    if not run_result.has_verdict:
        return None
    limits = run_result.thresholds
    dtype = run_result.workload.dtype or "?"
    run = (
        f"The scaled twin served back to back in {md.code(dtype)} on pool {md.code(pool)} for "
        f"{fmt.sig(run_result.duration_s, 5)} s ({fmt.count(run_result.steps)} steps)"
    )

    def said(head: str) -> str:
        found = run_result.said(head)
        return f"\n\nThe stage says: {md.text(found)}" if found else ""

    found = []
    if run_result.leaked():
        slope, growth = run_result.memory_slope_bytes_per_step, run_result.memory_growth_bytes
        found.append(
            Finding(
                key="stability:memory-leak",
                title=cut_title(f"Memory leak on pool {pool}: {slope:,.0f} bytes per step"),
                body=(
                    f"{run}: memory grew {fmt.bytes_per_step(slope)} ({growth:,.0f} bytes fitted "
                    f"after the warm-up), over the limits of "
                    f"{fmt.bytes_per_step(limits.leak_bytes_per_step)} and "
                    f"{limits.leak_min_growth_bytes:,.0f} bytes of growth." + said(LEAK)
                ),
                severity=MAJOR,
            )
        )
    if run_result.nonfinite_over():
        found.append(
            Finding(
                key="stability:nonfinite",
                title=cut_title(f"NaN/Inf outputs in {dtype} on pool {pool} under sustained load"),
                body=(
                    f"{run}: {run_result.nonfinite_outputs:,} next-token logit rows held NaN or "
                    f"Inf (threshold {limits.max_nonfinite_outputs})." + said(NONFINITE)
                ),
                severity=MAJOR,
            )
        )
    if run_result.raised():
        errors = fmt.counted(run_result.errors, "step")
        found.append(
            Finding(
                key="stability:exceptions",
                title=cut_title(f"{errors} raised under sustained load on pool {pool}"),
                body=f"{run}: {errors} raised; the first: {md.text(run_result.first_error)}",
                severity=MAJOR,
            )
        )
    if run_result.drifted():
        drift, max_drift = run_result.step_time_drift, limits.max_step_time_drift
        found.append(
            Finding(
                key="stability:step-time-drift",
                title=cut_title(f"Step time drifts {drift:+.0%} under sustained load on {pool}"),
                body=(
                    f"{run}: the median step of the last quarter is {drift:+.0%} on the first "
                    f"quarter's, over the threshold of {max_drift:+.0%}." + said(DRIFT)
                ),
                severity=MINOR,
            )
        )
    return found
