"""The stability stage's known limitations: each threshold the sustained run crossed
(memory leak, NaN/Inf outputs, exceptions, step-time drift). Registered as the stage's
`findings` in `engine.registry`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine import markdown as md
from engine.findings import MAJOR, MINOR, Finding, cut_title


def findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """One note per crossed stability threshold, read from the run's figures against its
    thresholds: memory leak, NaN/Inf outputs, exceptions (major), step-time drift (minor).
    None for a result that is not a stability run."""
    if "passed" not in result or "thresholds" not in result:
        return None
    thresholds = result.get("thresholds") or {}
    workload = result.get("workload") or {}
    dtype = workload.get("dtype") or "?"
    run = (
        f"The scaled twin served back to back in {md.code(dtype)} on pool {md.code(pool)} for "
        f"{fmt.sig(result.get('duration_s'), 5)} s ({fmt.count(result.get('steps'))} steps)"
    )
    reasons = [str(r) for r in result.get("reasons") or []]

    def said(prefix: str) -> str:
        found = next((r for r in reasons if r.startswith(prefix)), "")
        return f"\n\nThe stage says: {md.text(found)}" if found else ""

    found = []
    slope = fmt.finite(result.get("memory_slope_bytes_per_step"))
    growth = fmt.finite(result.get("memory_growth_bytes"))
    leak_slope = fmt.finite(thresholds.get("leak_bytes_per_step"))
    leak_growth = fmt.finite(thresholds.get("leak_min_growth_bytes"))
    if (
        slope is not None
        and growth is not None
        and leak_slope is not None
        and leak_growth is not None
        and slope > leak_slope
        and growth > leak_growth
    ):
        found.append(
            Finding(
                key="stability:memory-leak",
                title=cut_title(f"Memory leak on pool {pool}: {slope:,.0f} bytes per step"),
                body=(
                    f"{run}: memory grew {fmt.bytes_per_step(slope)} ({growth:,.0f} bytes fitted "
                    f"after the warm-up), over the limits of {fmt.bytes_per_step(leak_slope)} and "
                    f"{leak_growth:,.0f} bytes of growth." + said("memory leak")
                ),
                severity=MAJOR,
            )
        )
    nonfinite = int(fmt.finite(result.get("nonfinite_outputs")) or 0)
    if nonfinite > (fmt.finite(thresholds.get("max_nonfinite_outputs")) or 0):
        found.append(
            Finding(
                key="stability:nonfinite",
                title=cut_title(f"NaN/Inf outputs in {dtype} on pool {pool} under sustained load"),
                body=(
                    f"{run}: {nonfinite:,} next-token logit rows held NaN or Inf (threshold "
                    f"{thresholds.get('max_nonfinite_outputs') or 0})." + said("NaN/Inf")
                ),
                severity=MAJOR,
            )
        )
    errors = int(fmt.finite(result.get("errors")) or 0)
    if errors:
        first = (result.get("error_messages") or [""])[0]
        found.append(
            Finding(
                key="stability:exceptions",
                title=cut_title(
                    f"{fmt.counted(errors, 'step')} raised under sustained load on pool {pool}"
                ),
                body=f"{run}: {fmt.counted(errors, 'step')} raised; the first: {md.text(first)}",
                severity=MAJOR,
            )
        )
    drift = fmt.finite(result.get("step_time_drift"))
    max_drift = fmt.finite(thresholds.get("max_step_time_drift"))
    if drift is not None and max_drift is not None and drift > max_drift:
        found.append(
            Finding(
                key="stability:step-time-drift",
                title=cut_title(f"Step time drifts {drift:+.0%} under sustained load on {pool}"),
                body=(
                    f"{run}: the median step of the last quarter is {drift:+.0%} on the first "
                    f"quarter's, over the threshold of {max_drift:+.0%}." + said("step-time drift")
                ),
                severity=MINOR,
            )
        )
    return found
