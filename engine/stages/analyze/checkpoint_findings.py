"""Findings from the checkpoint's own tensors (the analysis's `checkpoint` and
`checkpoint_check`): its count against the config's, and the tensors, layers and MTP
modules it holds against what the config implies. Notes for every pool, each naming the
tensors it is about. Plain Python: neither Django nor torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine import markdown as md
from engine.findings import MAJOR, MINOR, Finding, cut_title
from engine.stored import as_mapping


def _names(listed: Mapping[str, Any]) -> str:
    """A bounded name list as Markdown: the names as code, then how many more."""
    names = [md.code(n) for n in listed.get("names") or []]
    rest = int(listed.get("count") or 0) - len(names)
    text = ", ".join(names)
    return text + (f" and {fmt.count(rest)} more" if rest > 0 else "")


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def _are(count: Any) -> str:
    return "is" if count == 1 else "are"


def _have(count: Any) -> str:
    return "has" if count == 1 else "have"


def _finding(key: str, title: str, body: str, severity: str) -> Finding:
    return Finding(
        key=f"analyze:checkpoint-{key}",
        title=cut_title(title),
        body=body,
        severity=severity,
        all_pools=True,
    )


def _count_finding(result: Mapping[str, Any]) -> Finding | None:
    """The config-derived total against the checkpoint's, when they disagree beyond
    rounding: the checkpoint's is used, and the groups where they differ say why."""
    comparison = as_mapping(as_mapping(result.get("checkpoint")).get("comparison"))
    total = as_mapping(as_mapping(comparison.get("figures")).get("total_params"))
    if not total or comparison.get("agree", True):
        return None
    groups = as_mapping(comparison.get("groups"))
    rows = [
        [
            md.text(group.replace("_", " ")),
            fmt.count(g.get("config")),
            fmt.count(g.get("checkpoint")),
            f"{g.get('difference', 0):+,}",
        ]
        for group, g in groups.items()
        if isinstance(g, Mapping)
    ]
    estimated = as_mapping(result.get("config_figures")).get("estimated")
    why = (
        "The config-derived count was an estimate (a model type neither day0's family table "
        "nor transformers knows), "
        if estimated
        else "The config-derived count models the family's modules from the config's keys, "
    )
    body = (
        f"The config implies {fmt.count(total.get('config'))} parameters; the checkpoint's "
        f"safetensors headers hold {fmt.count(total.get('checkpoint'))} "
        f"({fmt.signed_percent(total.get('relative'), 2)}). {why}and the checkpoint's own "
        "tensors are the truth: the analysis, the plan and the release notes use the "
        "checkpoint's count (the config's stays under `config_figures`)."
    )
    if rows:
        body += "\n\nWhere they differ, by tensor group:\n\n" + md.table(
            ["group", "config", "checkpoint", "difference"], rows
        )
    title = (
        f"Parameters from the config are off by {fmt.signed_percent(total.get('relative'), 2)}: "
        "the checkpoint's count is used"
    )
    return _finding("count", title, body, MINOR)


def _tensor_findings(check: Mapping[str, Any]) -> list[Finding]:
    found = []
    source = md.code(check.get("expected_from") or "?")
    missing = as_mapping(check.get("missing"))
    if missing.get("count"):
        found.append(
            _finding(
                "missing",
                f"{fmt.counted(missing['count'], 'tensor')} the config implies "
                f"{_are(missing['count'])} not in the checkpoint",
                f"transformers' {source} built from the config has tensors no safetensors "
                f"header holds: {_names(missing)}. Loading leaves them at their initial "
                "values, so the model would compute wrong outputs; the config or the upload "
                "is wrong.",
                MAJOR,
            )
        )
    wrong = as_mapping(check.get("wrong_shape"))
    if wrong.get("count"):
        tensors = [t for t in wrong.get("tensors") or [] if isinstance(t, Mapping)]
        rows = [
            [md.code(t.get("name")), md.code(t.get("expected")), md.code(t.get("found"))]
            for t in tensors
        ]
        rest = int(wrong["count"]) - len(rows)
        body = (
            f"These checkpoint tensors do not have the shape transformers' {source} gives them "
            "from the config (a packed low-bit tensor is compared by its unpacked elements):"
            "\n\n" + md.table(["tensor", "config implies", "checkpoint holds"], rows)
        )
        if rest > 0:
            body += f"\n\nand {fmt.count(rest)} more."
        found.append(
            _finding(
                "shape",
                f"{fmt.counted(wrong['count'], 'checkpoint tensor')} "
                f"{_have(wrong['count'])} another shape than the config implies",
                body,
                MAJOR,
            )
        )
    extra = as_mapping(check.get("extra"))
    if extra.get("count"):
        found.append(
            _finding(
                "extra",
                f"{fmt.counted(extra['count'], 'checkpoint tensor')} the config does not imply",
                f"The checkpoint holds tensors transformers' {source} built from the config "
                f"does not have: {_names(extra)}. transformers does not load them; serving "
                "engines may refuse the checkpoint or skip them too.",
                MINOR,
            )
        )
    return found


def _layer_findings(check: Mapping[str, Any]) -> list[Finding]:
    found = []
    layers = as_mapping(check.get("layers"))
    if layers.get("missing") or layers.get("extra"):
        parts = []
        if layers.get("missing"):
            parts.append(f"layers {md.text(layers['missing'])} are missing")
        if layers.get("extra"):
            parts.append(f"layers {md.text(layers['extra'])} are past the config's last layer")
        found.append(
            _finding(
                "layers",
                f"The checkpoint holds {fmt.count(layers.get('checkpoint'))} decoder layers, "
                f"the config says {fmt.count(layers.get('config'))}",
                f"`num_hidden_layers` is {fmt.count(layers.get('config'))} but the "
                f"checkpoint's tensor names hold {fmt.count(layers.get('checkpoint'))} decoder "
                f"layers: {'; '.join(parts)}. The model transformers or a serving engine builds "
                "from the config would not match the weights.",
                MAJOR,
            )
        )
    mtp = as_mapping(check.get("mtp"))
    if mtp:
        found.append(
            _finding(
                "mtp",
                f"The checkpoint holds {fmt.counted(mtp.get('checkpoint'), 'MTP module')}, the "
                f"config says {fmt.count(mtp.get('config'))}",
                f"The config declares "
                f"{fmt.counted(mtp.get('config'), 'multi-token-prediction module')} "
                "(`num_nextn_predict_layers` or the like) and the checkpoint holds "
                f"{fmt.count(mtp.get('checkpoint'))} (decoder layers past `num_hidden_layers`, "
                "or `mtp.*` tensors). Speculative decoding with MTP would not find the modules "
                "it expects.",
                MINOR,
            )
        )
    return found


def _header_findings(check: Mapping[str, Any]) -> list[Finding]:
    found = []
    duplicates = as_mapping(check.get("duplicates"))
    if duplicates.get("count"):
        found.append(
            _finding(
                "duplicates",
                f"{fmt.counted(duplicates['count'], 'tensor name')} "
                f"{_are(duplicates['count'])} in two safetensors files",
                f"More than one file's header holds {_names(duplicates)}; which copy a loader "
                "takes depends on the loader.",
                MINOR,
            )
        )
    mismatch = as_mapping(check.get("index_mismatch"))
    index_only = as_mapping(mismatch.get("index_only"))
    headers_only = as_mapping(mismatch.get("headers_only"))
    if index_only.get("count") or headers_only.get("count"):
        parts = []
        if index_only.get("count"):
            parts.append(f"the index names {_names(index_only)}, which no header holds")
        if headers_only.get("count"):
            parts.append(f"the headers hold {_names(headers_only)}, which the index omits")
        found.append(
            _finding(
                "index",
                "model.safetensors.index.json and the shards' headers disagree",
                _sentence("; ".join(parts)),
                MINOR,
            )
        )
    return found


def checkpoint_findings(result: Mapping[str, Any]) -> list[Finding]:
    """Notes from the analysis's checkpoint figures and check ([] when the analysis was
    counted from the config alone)."""
    check = as_mapping(result.get("checkpoint_check"))
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
