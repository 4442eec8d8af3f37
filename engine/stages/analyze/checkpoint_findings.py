"""Findings from the checkpoint's own tensors (the analysis's `checkpoint` and
`checkpoint_check`): its count against the config's, and the tensors, layers and MTP
modules it holds against what the config implies. Notes for every pool, each naming the
tensors it is about; their words are `templates/limitations/analyze/checkpoint-*.md`.
Plain Python: neither Django nor torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.findings import MAJOR, MINOR, Finding


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _listed(listed: Mapping[str, Any]) -> dict[str, Any]:
    """A bounded name list as the words need it: the names kept and how many more there are
    (`more`: the count past them, 0 when none)."""
    names = [str(n) for n in listed.get("names") or []]
    return {"names": names, "more": max(int(listed.get("count") or 0) - len(names), 0)}


def _finding(kind: str, severity: str, **data: Any) -> Finding:
    return Finding(
        key=f"analyze:checkpoint-{kind}",
        template=f"analyze/checkpoint-{kind}",
        data=data,
        severity=severity,
        all_pools=True,
    )


def _count_finding(result: Mapping[str, Any]) -> Finding | None:
    """The config-derived total against the checkpoint's, when they disagree beyond
    rounding: the checkpoint's is used, and the groups where they differ say why."""
    comparison = _mapping(_mapping(result.get("checkpoint")).get("comparison"))
    total = _mapping(_mapping(comparison.get("figures")).get("total_params"))
    if not total or comparison.get("agree", True):
        return None
    groups = [
        {
            "group": str(group),
            "config": g.get("config"),
            "checkpoint": g.get("checkpoint"),
            "difference": g.get("difference", 0),
        }
        for group, g in _mapping(comparison.get("groups")).items()
        if isinstance(g, Mapping)
    ]
    return _finding(
        "count",
        MINOR,
        config=total.get("config"),
        checkpoint=total.get("checkpoint"),
        relative=total.get("relative"),
        estimated=bool(_mapping(result.get("config_figures")).get("estimated")),
        groups=groups,
    )


def _tensor_findings(check: Mapping[str, Any]) -> list[Finding]:
    found = []
    source = str(check.get("expected_from") or "?")
    missing = _mapping(check.get("missing"))
    if missing.get("count"):
        found.append(
            _finding("missing", MAJOR, count=missing["count"], source=source, **_listed(missing))
        )
    wrong = _mapping(check.get("wrong_shape"))
    if wrong.get("count"):
        tensors = [
            {"name": t.get("name"), "expected": t.get("expected"), "found": t.get("found")}
            for t in wrong.get("tensors") or []
            if isinstance(t, Mapping)
        ]
        found.append(
            _finding(
                "shape",
                MAJOR,
                count=wrong["count"],
                source=source,
                tensors=tensors,
                more=max(int(wrong["count"]) - len(tensors), 0),
            )
        )
    extra = _mapping(check.get("extra"))
    if extra.get("count"):
        found.append(
            _finding("extra", MINOR, count=extra["count"], source=source, **_listed(extra))
        )
    return found


def _layer_findings(check: Mapping[str, Any]) -> list[Finding]:
    found = []
    layers = _mapping(check.get("layers"))
    if layers.get("missing") or layers.get("extra"):
        found.append(
            _finding(
                "layers",
                MAJOR,
                config=layers.get("config"),
                checkpoint=layers.get("checkpoint"),
                missing=layers.get("missing") or "",
                extra=layers.get("extra") or "",
            )
        )
    mtp = _mapping(check.get("mtp"))
    if mtp:
        found.append(
            _finding("mtp", MINOR, config=mtp.get("config"), checkpoint=mtp.get("checkpoint"))
        )
    return found


def _header_findings(check: Mapping[str, Any]) -> list[Finding]:
    found = []
    duplicates = _mapping(check.get("duplicates"))
    if duplicates.get("count"):
        found.append(
            _finding("duplicates", MINOR, count=duplicates["count"], **_listed(duplicates))
        )
    mismatch = _mapping(check.get("index_mismatch"))
    index_only = _mapping(mismatch.get("index_only"))
    headers_only = _mapping(mismatch.get("headers_only"))
    if index_only.get("count") or headers_only.get("count"):
        found.append(
            _finding(
                "index",
                MINOR,
                index_only=_listed(index_only) if index_only.get("count") else None,
                headers_only=_listed(headers_only) if headers_only.get("count") else None,
            )
        )
    return found


def checkpoint_findings(result: Mapping[str, Any]) -> list[Finding]:
    """Notes from the analysis's checkpoint figures and check ([] when the analysis was
    counted from the config alone)."""
    check = _mapping(result.get("checkpoint_check"))
    if not check and not result.get("checkpoint"):
        return []
    found = []
    count = _count_finding(result)
    if count is not None:
        found.append(count)
    found += _tensor_findings(check)
    found += _layer_findings(check)
    found += _header_findings(check)
    return found
