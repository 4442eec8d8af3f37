"""The operators stage's known limitations: an operator the pool's backend lacks (or lacks
in a dtype), and the operators that run through its fallback. Registered as the stage's
`findings` in `engine.registry`; their words are `templates/limitations/operators/`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.findings import BLOCKER, MAJOR, MINOR, Finding, cut_key


def _operator_name(name: str) -> str:
    """The dispatcher's spelling: "aten::mm" for the default overload, "aten::add.Tensor"."""
    return name.removesuffix(".default")


def _missing_operator(row: Mapping[str, Any], result: Mapping[str, Any], pool: str) -> Finding:
    name = _operator_name(str(row.get("name") or "?"))
    via = str(row.get("via") or "")
    dtypes = [str(d) for d in row.get("dtypes") or []]
    lacking = [str(d) for d in row.get("missing_dtypes") or []]
    run_device = str(result.get("device") or "")
    devices = [str(d) for d in row.get("devices") or []]
    # Only "kernel lacks <dtype>" (or a manifest listing the operator for other dtypes) is a
    # dtype gap; anything else is an operator the backend does not have at all.
    dtype_gap = bool(lacking) and (
        via.startswith("kernel lacks")
        or (via == "manifest" and bool(dtypes) and not set(dtypes) <= set(lacking))
    )
    host_only = devices == ["cpu"] and run_device not in ("", "cpu")
    return Finding(
        key=cut_key(f"operators:missing:{name}"),
        template="operators/missing",
        data={
            "name": name,
            "pool": pool,
            "feature": str(row.get("feature") or ""),
            "via": via,
            "dtypes": dtypes,
            "lacking": lacking,
            "dtype_gap": dtype_gap,
            "host_only": host_only,
            "device": run_device,
            "dtype": str(result.get("dtype") or ""),
            "checked_against": str(result.get("checked_against") or ""),
            "calls": row.get("calls"),
        },
        severity=MAJOR if host_only else BLOCKER,
    )


def findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """One blocker per operator missing on the pool's backend (major when it only ever saw
    CPU tensors on a device pool), and one minor note for the operators that run through the
    backend's fallback. None when the result has no operator list."""
    rows = result.get("operators")
    if not isinstance(rows, list):
        return None
    found = [
        _missing_operator(row, result, pool)
        for row in rows
        if isinstance(row, Mapping) and row.get("status") == "missing"
    ]
    fallback = [
        {"name": _operator_name(str(row.get("name"))), "feature": str(row.get("feature") or "")}
        for row in rows
        if isinstance(row, Mapping) and row.get("status") == "fallback"
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
