"""Findings from the checkpoint's own tensors (the analysis's `checkpoint` and
`checkpoint_check`, as its typed result `AnalysisResult` reads them): its count against the
config's, and the tensors, layers and MTP modules it holds against what the config implies.
Notes for every pool, each naming the tensors it is about; their words are
`templates/limitations/analyze/checkpoint-*.md`. Plain Python: neither Django nor torch."""

from __future__ import annotations

from typing import Any, TypeGuard

from engine.findings import MAJOR, MINOR, Finding
from engine.stages.analyze.result import AnalysisResult, CheckpointCheck
from engine.stages.fetch.result import NameList


def _listed(listed: NameList) -> dict[str, Any]:
    """A bounded name list as the words need it: the names kept and how many more there are
    (`more`: the count past them, 0 when none)."""
    return {"names": list(listed.names), "more": listed.more}


def _counted(listed: NameList | None) -> TypeGuard[NameList]:
    """Whether there is a name list and it counts any name."""
    return listed is not None and listed.count > 0


def _finding(kind: str, severity: str, **data: Any) -> Finding:
    return Finding(
        key=f"analyze:checkpoint-{kind}",
        template=f"analyze/checkpoint-{kind}",
        data=data,
        severity=severity,
        all_pools=True,
    )


def _count_finding(analysis: AnalysisResult) -> Finding | None:
    """The config-derived total against the checkpoint's, when they disagree beyond
    rounding: the checkpoint's is used, and the groups where they differ say why."""
    total = analysis.config_count("total_params")
    if total is None or not analysis.counts_disagree:
        return None
    groups = [
        {
            "group": group.group,
            "config": group.config,
            "checkpoint": group.checkpoint,
            "difference": group.difference,
        }
        for group in analysis.count_groups
    ]
    return _finding(
        "count",
        MINOR,
        config=total.config,
        checkpoint=total.checkpoint,
        relative=total.relative,
        estimated=analysis.config_count_estimated,
        groups=groups,
    )


def _tensor_findings(check: CheckpointCheck) -> list[Finding]:
    found = []
    source = check.expected_from or "?"
    if _counted(check.missing):
        found.append(
            _finding(
                "missing",
                MAJOR,
                count=check.missing.count,
                source=source,
                **_listed(check.missing),
            )
        )
    if check.wrong_shape_count:
        tensors = [
            {"name": t.name, "expected": t.expected, "found": t.found} for t in check.wrong_shape
        ]
        found.append(
            _finding(
                "shape",
                MAJOR,
                count=check.wrong_shape_count,
                source=source,
                tensors=tensors,
                more=max(check.wrong_shape_count - len(tensors), 0),
            )
        )
    if _counted(check.extra):
        found.append(
            _finding("extra", MINOR, count=check.extra.count, source=source, **_listed(check.extra))
        )
    return found


def _layer_findings(check: CheckpointCheck) -> list[Finding]:
    found = []
    if check.layers is not None and check.layers_differ:
        found.append(
            _finding(
                "layers",
                MAJOR,
                config=check.layers.config,
                checkpoint=check.layers.checkpoint,
                missing=check.layers.missing,
                extra=check.layers.extra,
            )
        )
    if check.mtp is not None:
        found.append(
            _finding("mtp", MINOR, config=check.mtp.config, checkpoint=check.mtp.checkpoint)
        )
    return found


def _header_findings(check: CheckpointCheck) -> list[Finding]:
    found = []
    if _counted(check.duplicates):
        found.append(
            _finding("duplicates", MINOR, count=check.duplicates.count, **_listed(check.duplicates))
        )
    index_only = check.index_only if _counted(check.index_only) else None
    headers_only = check.headers_only if _counted(check.headers_only) else None
    if index_only is not None or headers_only is not None:
        found.append(
            _finding(
                "index",
                MINOR,
                index_only=_listed(index_only) if index_only is not None else None,
                headers_only=_listed(headers_only) if headers_only is not None else None,
            )
        )
    return found


def checkpoint_findings(analysis: AnalysisResult) -> list[Finding]:
    """Notes from the analysis's checkpoint figures and check ([] when the analysis was
    counted from the config alone)."""
    check = analysis.check
    if not analysis.checkpoint_check and not analysis.checkpoint:
        return []
    found = []
    count = _count_finding(analysis)
    if count is not None:
        found.append(count)
    if check is not None:
        found += _tensor_findings(check)
        found += _layer_findings(check)
        found += _header_findings(check)
    return found
