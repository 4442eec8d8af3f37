"""The operators stage's known limitations: an operator the pool's backend lacks (or lacks
in a dtype), and the operators that run through its fallback. Registered as the stage's
`findings` in `engine.registry`; their words are `templates/limitations/operators/`. What
they say of the run they ask its typed result (`OperatorsResult`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.findings import BLOCKER, MAJOR, MINOR, Finding, cut_key
from engine.stages.operators.result import OperatorRow, OperatorsResult


def _missing_operator(row: OperatorRow, run: OperatorsResult, pool: str) -> Finding:
    name = row.dispatcher_name
    # Only "kernel lacks <dtype>" (or a manifest listing the operator for other dtypes) is a
    # dtype gap (`OperatorRow.dtype_gap`); anything else is an operator the backend does
    # not have at all. One that saw only CPU tensors on a device pool runs on the host.
    host_only = run.host_only_on_device(row)
    return Finding(
        key=cut_key(f"operators:missing:{name}"),
        template="operators/missing",
        data={
            "name": name,
            "pool": pool,
            "feature": row.feature,
            "via": row.via,
            "dtypes": list(row.dtypes),
            "lacking": list(row.missing_dtypes),
            "dtype_gap": row.dtype_gap,
            "host_only": host_only,
            "device": run.device,
            "dtype": run.dtype,
            "checked_against": run.checked_against,
            "calls": row.calls,
        },
        severity=MAJOR if host_only else BLOCKER,
    )


def findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """One blocker per operator missing on the pool's backend (major when it only ever saw
    CPU tensors on a device pool), and one minor note for the operators that run through the
    backend's fallback. None when the result has no operator list."""
    run = OperatorsResult.from_stored(result)
    if run.operators is None:
        return None
    found = [_missing_operator(row, run, pool) for row in run.missing_operators]
    fallback = [
        {"name": row.dispatcher_name, "feature": row.feature} for row in run.fallback_operators
    ]
    if fallback:
        found.append(
            Finding(
                key="operators:fallback",
                template="operators/fallback",
                data={"pool": pool, "operators": fallback},
                severity=MINOR,
            )
        )
    return found
