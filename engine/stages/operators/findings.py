"""The operators stage's known limitations: an operator the pool's backend lacks (or lacks
in a dtype), and the operators that run through its fallback. Registered as the stage's
`findings` in `engine.registry`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine import markdown as md
from engine.findings import BLOCKER, MAJOR, MINOR, Finding, cut_key, cut_title


def _operator_name(name: str) -> str:
    """The dispatcher's spelling: "aten::mm" for the default overload, "aten::add.Tensor"."""
    return name.removesuffix(".default")


def _missing_operator(row: Mapping[str, Any], result: Mapping[str, Any], pool: str) -> Finding:
    name = _operator_name(str(row.get("name") or "?"))
    feature = str(row.get("feature") or "")
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
    severity = MAJOR if host_only else BLOCKER
    needed_by = f" ({feature})" if feature else ""
    if dtype_gap:
        title = f"{name} lacks {', '.join(lacking)} on pool {pool}{needed_by}"
    else:
        title = f"{name} is missing on pool {pool}{needed_by}"
    checked = str(result.get("checked_against") or "the pool's backend")
    lines = [
        f"The scaled twin's prefill and decode on pool {md.code(pool)} (device "
        f"{md.code(run_device or '?')}, {md.code(result.get('dtype') or '?')}) called "
        f"{md.code(name)}"
        + (f" for **{md.text(feature)}**" if feature else "")
        + f"; checked against {md.text(checked)}, "
        + (
            f"its kernel lacks {', '.join(md.code(d) for d in lacking)}."
            if dtype_gap
            else "the backend has no kernel for it."
        ),
        "",
        f"- how it was found: {md.text(via or 'missing')}",
        f"- dtypes it ran in: {', '.join(md.code(d) for d in dtypes) or '—'}",
    ]
    if lacking:
        lines.append(f"- dtypes missing: {', '.join(md.code(d) for d in lacking)}")
    lines.append(f"- calls: {fmt.count(row.get('calls'))}")
    lines += [
        "",
        (
            "It saw only CPU tensors, so it runs on the host: a cost, not a stop."
            if host_only
            else "The stage ran it on the CPU to go on checking; serving on this backend "
            "needs a kernel for it (or a model change that avoids it)."
        ),
    ]
    return Finding(
        key=cut_key(f"operators:missing:{name}"),
        title=cut_title(title),
        body="\n".join(lines),
        severity=severity,
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
    fallback = [row for row in rows if isinstance(row, Mapping) and row.get("status") == "fallback"]
    if fallback:
        one = len(fallback) == 1
        lines = [
            f"{fmt.counted(len(fallback), 'operator')} {'has' if one else 'have'} no kernel of "
            f"{'its' if one else 'their'} own on pool {md.code(pool)} and "
            f"{'runs' if one else 'run'} through the backend's fallback (usually a copy to the "
            f"CPU and back): correct, but slow on the paths that use {'it' if one else 'them'}.",
            "",
        ]
        lines += [
            f"- {md.code(_operator_name(str(row.get('name'))))}"
            + (f": {md.text(row['feature'])}" if row.get("feature") else "")
            for row in fallback
        ]
        found.append(
            Finding(
                key="operators:fallback",
                title=cut_title(
                    f"{fmt.counted(len(fallback), 'operator')} {'runs' if one else 'run'} "
                    f"through the fallback on {pool}"
                ),
                body="\n".join(lines),
                severity=MINOR,
            )
        )
    return found
