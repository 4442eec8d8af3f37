"""The precision stage's known limitations: a serving dtype that fails its thresholds
against the float32 reference (which check, which layer and module), and one the pool's
device cannot run. Registered as the stage's `findings` in `engine.registry`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine import markdown as md
from engine.findings import MAJOR, Finding, cut_key, cut_title
from engine.stages.precision.checks import CHECKS as PRECISION_CHECKS


def _crossed(entry: Mapping[str, Any]) -> list[tuple[str, float, str, float]]:
    """(label, value, "<" | ">", limit) of each enforced check the entry failed."""
    thresholds = entry.get("thresholds") or {}
    crossed = []
    for metric, key, side, label in PRECISION_CHECKS:
        value, limit = fmt.finite(entry.get(metric)), fmt.finite(thresholds.get(key))
        if value is None or limit is None:
            continue
        if side == "max" and value > limit:
            crossed.append((label, value, ">", limit))
        elif side == "min" and value < limit:
            crossed.append((label, value, "<", limit))
    return crossed


def _precision_failure(dtype: str, entry: Mapping[str, Any], pool: str) -> Finding:
    crossed = _crossed(entry)
    layer = entry.get("first_divergent_layer")
    module = entry.get("first_divergent_module")
    name = entry.get("first_divergent_name")
    nonfinite = entry.get("non_finite_values")
    if nonfinite:
        what = f"NaN/Inf logits ({fmt.count(nonfinite)} values)"
    elif crossed:
        what = ", ".join(label for label, *_ in crossed)
    elif layer is not None:
        what = "a module's local error over its limit"
    else:
        what = "its thresholds"
    where = f"; first divergent layer {layer} ({module})" if layer is not None else ""
    reason = str(entry.get("reason") or what).removeprefix(f"{dtype}: ")
    lines = [
        f"The scaled twin in {md.code(dtype)} on pool {md.code(pool)} against the float32 "
        f"reference on the CPU fails: {md.text(reason)}",
        "",
    ]
    thresholds = entry.get("thresholds") or {}
    rows = [
        (label, entry.get(metric), side, thresholds.get(key))
        for metric, key, side, label in PRECISION_CHECKS
        if fmt.finite(thresholds.get(key)) is not None
    ]
    if rows:
        lines += ["| check | measured | limit | verdict |", "|---|---|---|---|"]
        for label, value, side, limit in rows:
            failed = any(label == c[0] for c in crossed)
            bound = "≤" if side == "max" else "≥"
            lines.append(
                f"| {label} | {fmt.sig(value, 5)} | {bound} {fmt.sig(limit, 5)} | "
                f"{'**failed**' if failed else 'ok'} |"
            )
        lines.append("")
    if layer is not None:
        local = fmt.finite(entry.get("first_divergent_local_error"))
        unit = fmt.finite(entry.get("unit_roundoff"))
        limit = fmt.finite(thresholds.get("max_local_relative_error"))
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
    dtypes = result.get("dtypes")
    if not isinstance(dtypes, Mapping):
        return None
    found = [
        _precision_failure(str(dtype), entry, pool)
        for dtype, entry in dtypes.items()
        if isinstance(entry, Mapping) and entry.get("passed") is False
    ]
    for dtype, why in (result.get("skipped_dtypes") or {}).items():
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
