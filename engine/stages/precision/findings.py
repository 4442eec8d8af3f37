"""The precision stage's known limitations: a serving dtype that fails its thresholds
against the float32 reference (which check, which layer and module), and one the pool's
device cannot run. Registered as the stage's `findings` in `engine.registry`; their words are
`templates/limitations/precision/`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.findings import MAJOR, Finding, cut_key
from engine.stages.precision.result import DtypeComparison, PrecisionStageResult


def _precision_failure(entry: DtypeComparison, pool: str) -> Finding:
    layer = entry.first_divergent_layer
    local, unit = entry.first_divergent_local_error, entry.unit_roundoff
    limit = entry.limit("max_local_relative_error")
    return Finding(
        key=cut_key(f"precision:{entry.dtype}"),
        template="precision/failed",
        data={
            "dtype": entry.dtype,
            "pool": pool,
            # What failed, first that applies: NaN/Inf logits, the checks crossed, a module's
            # local error; the stage's own reason (without its "<dtype>: ") when it gave one.
            "non_finite_values": entry.non_finite_values or None,
            "crossed": [row.label for row in entry.crossed],
            "reason": entry.reason.removeprefix(f"{entry.dtype}: "),
            "checks": [
                {
                    "label": row.label,
                    "value": row.value,
                    "side": row.side,
                    "limit": row.limit,
                    "crossed": row.crossed,
                }
                for row in entry.checks
            ],
            "layer": layer,
            "module": entry.first_divergent_module,
            "name": entry.first_divergent_name,
            "local_error": local,
            "local_error_u": local / unit if local is not None and unit else None,
            "local_limit": limit,
            "local_limit_u": limit / unit if limit is not None and unit else None,
        },
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
                template="precision/unsupported",
                data={"dtype": dtype, "pool": pool, "why": why},
                severity=MAJOR,
            )
        )
    return found
