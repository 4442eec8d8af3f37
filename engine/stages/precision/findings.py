"""The precision stage's known limitations: a serving dtype that fails its thresholds
against the float32 reference (which check, which layer and module), and one the pool's
device cannot run. Registered as the stage's `findings` in `engine.registry`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine import markdown as md
from engine.findings import MAJOR, Finding, cut_key, cut_title
from engine.stages.precision.result import DtypeComparison, PrecisionStageResult


def _precision_failure(entry: DtypeComparison, pool: str) -> Finding:
    dtype, crossed = entry.dtype, entry.crossed
    layer, module, name = (
        entry.first_divergent_layer,
        entry.first_divergent_module,
        entry.first_divergent_name,
    )
    if entry.non_finite_values:
        what = f"NaN/Inf logits ({fmt.count(entry.non_finite_values)} values)"
    elif crossed:
        what = ", ".join(row.label for row in crossed)
    elif layer is not None:
        what = "a module's local error over its limit"
    else:
        what = "its thresholds"
    where = f"; first divergent layer {layer} ({module})" if layer is not None else ""
    reason = (entry.reason or what).removeprefix(f"{dtype}: ")
    lines = [
        f"The scaled twin in {md.code(dtype)} on pool {md.code(pool)} against the float32 "
        f"reference on the CPU fails: {md.text(reason)}",
        "",
    ]
    rows = entry.checks
    if rows:
        lines += ["| check | measured | limit | verdict |", "|---|---|---|---|"]
        for row in rows:
            lines.append(
                f"| {row.label} | {fmt.sig(row.value, 5)} | {row.bound} {fmt.sig(row.limit, 5)} | "
                f"{'**failed**' if row.crossed else 'ok'} |"
            )
        lines.append("")
    if layer is not None:
        local = entry.first_divergent_local_error
        unit = entry.unit_roundoff
        limit = entry.limit("max_local_relative_error")
        size = ""
        if local is not None:
            size = f": local relative error {local:.4g}"
            if unit:
                size += f" ({local / unit:.3g}u)"
            if limit is not None:
                size += f" over the limit {limit:.4g}" + (f" ({limit / unit:.3g}u)" if unit else "")
        lines.append(
            f"First divergent module: layer {layer}, {md.code(module or '?')}"
            + (f" ({md.code(name)})" if name else "")
            + size
            + "."
        )
    lines += [
        "",
        f"Serve in another dtype, or find the module's problem before serving {md.code(dtype)}.",
    ]
    return Finding(
        key=cut_key(f"precision:{dtype}"),
        title=cut_title(f"{dtype} fails precision on pool {pool}: {what}{where}"),
        body="\n".join(lines),
        severity=MAJOR,
    )


def findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """One major note per dtype that failed its thresholds (which metric, which layer), and
    one per dtype the pool declares that its device cannot run. None without per-dtype
    results."""
    read = PrecisionStageResult.from_stored(result)
    if read.dtypes is None:
        return None
    found = [_precision_failure(entry, pool) for entry in read.failed]
    for dtype, why in read.skipped_dtypes.items():
        found.append(
            Finding(
                key=cut_key(f"precision:unsupported:{dtype}"),
                title=cut_title(f"{dtype} does not run on pool {pool}'s device"),
                body=(
                    f"Pool {md.code(pool)} declares {md.code(dtype)} as a serving dtype, but its "
                    f"device cannot run it, so it was not validated: {md.text(why)}"
                ),
                severity=MAJOR,
            )
        )
    return found
