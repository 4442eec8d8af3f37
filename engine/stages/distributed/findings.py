"""The multi-device validation's known limitations: the plan's split not validated here,
its outputs off the single-device reference, a rank that crashed or hung, and expert
parallelism left out; and the keys a run could not judge (`unjudged_keys`). Registered as
the stage's `findings` and `unjudged_keys` in `engine.registry`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine import markdown as md
from engine.findings import BLOCKER, MINOR, Finding, cut_title, gist, sentence
from engine.stages.distributed.degree import EP_NOT_VALIDATED

DISTRIBUTED_NOT_VALIDATED = "distributed:not-validated"
DISTRIBUTED_MISMATCH = "distributed:mismatch"
DISTRIBUTED_RANK_FAILED = "distributed:rank-failed"
DISTRIBUTED_EP_NOT_VALIDATED = "distributed:ep-not-validated"
# Lines of a failed run's reason quoted in its note, and the longest line kept.
_REASON_LINES = 8
_REASON_LINE_CHARS = 300


def _planned_split(result: Mapping[str, Any]) -> str:
    """The plan's split the stage was asked to validate, as the plan notes write it."""
    plan = result.get("plan")
    if not isinstance(plan, Mapping) or not plan.get("tp"):
        return "?"
    return fmt.split(plan)


def _where(result: Mapping[str, Any], pool: str) -> str:
    """Where the ranks ran: "2 `gloo` processes on pool `cpu` (device `cpu`)"."""
    return (
        f"{fmt.count(result.get('world_size'))} {md.code(result.get('backend') or '?')} "
        f"processes on pool {md.code(pool)} (device {md.code(result.get('device_type') or '?')})"
    )


def _degree_line(result: Mapping[str, Any]) -> str:
    planned = _planned_split(result)
    line = f"- validated: {fmt.validated_split(result)}"
    if planned != "?":
        line = f"- the plan's split: {planned}; validated: {fmt.validated_split(result)}"
    if result.get("degree_reason"):
        line += f" ({md.text(result['degree_reason'])})"
    return line


def _distributed_not_validated(result: Mapping[str, Any], pool: str) -> Finding:
    reason = str(result.get("reason") or "no reason given")
    devices = result.get("pool_devices")
    host = [f"device {md.code(result.get('device_type') or '?')}"]
    if result.get("backend"):
        host.append(f"backend {md.code(result['backend'])}")
    if fmt.finite(devices) is not None:
        host.append(f"{fmt.counted(devices, 'device')} on the worker")
    lines = [
        f"The `distributed` stage validated no part of the plan's split "
        f"({_planned_split(result)}) across processes on pool {md.code(pool)} "
        f"({', '.join(host)}): {sentence(reason)}",
        "",
    ]
    degree = str(result.get("degree_reason") or "")
    if degree and degree != reason:
        lines += [f"The split it would have run: {sentence(degree)}", ""]
    lines += [
        "Not validated here: sharding the model by the split (transformers' tensor-parallel "
        "plan), its collectives, and its outputs against the single-device float32 reference. "
        "The plan's communication and scaling figures for this split are predicted only.",
    ]
    return Finding(
        key=DISTRIBUTED_NOT_VALIDATED,
        title=cut_title(f"Multi-device split not validated on pool {pool}: {gist(reason)}"),
        body="\n".join(lines),
        severity=MINOR,
    )


def _distributed_mismatch(result: Mapping[str, Any], pool: str) -> Finding:
    split = fmt.validated_split(result)
    ranks = [row for row in result.get("ranks") or [] if isinstance(row, Mapping)]
    failing = [row for row in ranks if row.get("passed") is False]
    first: Mapping[str, Any] = failing[0] if failing else {}
    tolerance = result.get("tolerance") if isinstance(result.get("tolerance"), Mapping) else {}
    error = first.get("max_abs_error", result.get("max_abs_error"))
    limit = first.get("tolerance", tolerance.get("max_abs_error"))
    divergent = first.get("first_divergent") or result.get("first_divergent") or {}
    title = [f"{split} on pool {pool} does not match the single-device reference"]
    title.append(f"rank {first['rank']}" if "rank" in first else "")
    if first.get("error"):
        title.append(gist(first["error"]))
    if fmt.finite(error) is not None:
        title.append(f"max |logit error| {fmt.sig(error)} > {fmt.scientific(limit)}")
    if divergent.get("module"):
        title.append(f"first divergent module {divergent['module']}")
    lines = [
        f"The `distributed` stage ran the scaled twin split {split} across "
        f"{_where(result, pool)} through transformers' tensor-parallel plan, and compared every "
        "rank's logits and hidden states with the single-process float32 reference (the same "
        f"twin): {len(failing)} of {fmt.counted(len(ranks), 'rank')} "
        f"{'is' if len(failing) == 1 else 'are'} off.",
        "",
        "| rank | max \\|logit error\\| | tolerance | top-1 agreement | first divergent module "
        "| verdict |",
        "|---|---|---|---|---|---|",
    ]
    for row in ranks:
        div = row.get("first_divergent") or {}
        lines.append(
            f"| {row.get('rank')} | {fmt.sig(row.get('max_abs_error'))} | "
            f"{fmt.scientific(row.get('tolerance'))} | {fmt.percent(row.get('top1_agreement'))} | "
            + (f"{md.code(div['module'])} (layer {div.get('layer')})" if div.get("module") else "—")
            + f" | {'ok' if row.get('passed') else '**failed**'} |"
        )
    lines.append("")
    if first.get("error"):
        lines += [f"Rank {first.get('rank')}: {sentence(first['error'])}", ""]
    if divergent.get("module"):
        size = (
            f"max abs error {fmt.sig(divergent['max_abs_error'])} over its tolerance "
            f"{fmt.scientific(divergent.get('tolerance'))}"
            if fmt.finite(divergent.get("max_abs_error")) is not None
            else f"shape {md.code(divergent.get('shape'))}"
        )
        kind = f", {md.text(divergent['kind'])}" if divergent.get("kind") else ""
        lines += [
            f"First divergent module: {md.code(divergent['module'])} (layer "
            f"{divergent.get('layer')}{kind}): {size}.",
            "",
        ]
    if tolerance.get("rule"):
        lines += [f"Tolerance: {sentence(tolerance['rule'])}", ""]
    lines += [_degree_line(result), ""]
    lines.append(
        "Split this way the model's outputs differ from the unsplit model's: served as planned "
        "it would produce wrong tokens. Check how the first divergent module is sharded (its "
        "entry in the class's tensor-parallel plan) before serving with tensor parallelism."
    )
    return Finding(
        key=DISTRIBUTED_MISMATCH,
        title=cut_title(": ".join([title[0], ", ".join(t for t in title[1:] if t)])),
        body="\n".join(lines),
        severity=BLOCKER,
    )


def _distributed_rank_failed(result: Mapping[str, Any], pool: str) -> Finding:
    split = fmt.validated_split(result)
    reason = str(result.get("reason") or "")
    logs = [entry for entry in result.get("rank_logs") or [] if isinstance(entry, Mapping)]
    failed_rank = result.get("failed_rank")
    failed = next((entry for entry in logs if entry.get("rank") == failed_rank), None)
    hung = re.search(r"did not finish within ([0-9.,]+ s)", reason)
    # The reason's first line is "<headline>: <the culprit rank and how it ended>".
    culprit = next(iter(reason.splitlines()), "").partition(": ")[2]
    stopped = "stopped after" in culprit  # a rank that fell behind: its peers timed out
    if culprit:
        what = culprit
    elif hung:
        what = f"the ranks did not finish within {hung.group(1)} and were killed"
    elif failed_rank is not None:
        what = f"rank {failed_rank} {fmt.exit_status((failed or {}).get('exit_code'))}"
    else:
        what = gist(reason) or "it failed"
    title = f"{split} run {'hung' if hung or stopped else 'failed'} on pool {pool}: {what}"
    quoted = [
        line if len(line) <= _REASON_LINE_CHARS else line[: _REASON_LINE_CHARS - 1] + "…"
        for line in (ln.rstrip() for ln in reason.splitlines())
        if line.strip()
    ]
    more = len(quoted) - _REASON_LINES
    lines = [
        f"The `distributed` stage ran the scaled twin split {split} across "
        f"{_where(result, pool)}: {what} after {fmt.sig(result.get('elapsed_s'))} s, before "
        "every rank reported, so no rank's outputs were compared with the reference.",
        "",
        "The stage says" + (f" (first {_REASON_LINES} lines):" if more > 0 else ":"),
        "",
        md.code_block("\n".join(quoted[:_REASON_LINES] or ["(no reason)"]), "text"),
        "",
    ]
    lines += [
        f"- rank {entry.get('rank')} {fmt.exit_status(entry.get('exit_code'))}" for entry in logs
    ]
    if any(entry.get("exit_code") == -15 for entry in logs):
        lines.append("- (torchrun stops the other ranks with SIGTERM once one fails)")
    lines += [_degree_line(result), ""]
    lines.append(
        "A rank that crashes or hangs at this split takes the whole serving group down: find "
        "the failing rank's cause (its log above) before serving with tensor parallelism."
    )
    return Finding(
        key=DISTRIBUTED_RANK_FAILED,
        title=cut_title(title),
        body="\n".join(lines),
        severity=BLOCKER,
    )


def _distributed_ep_not_validated(result: Mapping[str, Any], pool: str) -> Finding:
    note = str(result["ep_note"])
    why = note[len(EP_NOT_VALIDATED) :] if note.lower().startswith(EP_NOT_VALIDATED) else note
    plan = result.get("plan") if isinstance(result.get("plan"), Mapping) else {}
    verdict = {
        True: "it matched the single-device reference",
        False: "it did not pass (see its own note)",
    }.get(result.get("passed"), "")
    planned_ep = fmt.finite(plan.get("ep"))
    asked = (
        f"The plan serves the routed experts with EP{plan.get('ep')} ({_planned_split(result)})"
        if planned_ep is not None and planned_ep > 1
        else "The job's options asked for expert parallelism"
    )
    lines = [
        f"{asked}; the `distributed` stage ran {fmt.validated_split(result)} "
        f"across {_where(result, pool)}"
        + (f", and {verdict}" if verdict else "")
        + f", without expert parallelism (EP=1): {sentence(why)}",
        "",
        "Not validated here: sharding the experts by expert parallelism (transformers' "
        "expert-parallel plan), the routing of tokens to other ranks' experts, and its "
        "collectives.",
    ]
    return Finding(
        key=DISTRIBUTED_EP_NOT_VALIDATED,
        title=cut_title(f"Expert parallelism not validated on pool {pool}: {gist(why)}"),
        body="\n".join(lines),
        severity=MINOR,
    )


def findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """The multi-device validation's notes: a minor note when the split could not be
    validated here (why: no tensor-parallel plan in transformers, the release's own modeling
    code, one device, a backend without torch.distributed); a blocker when a rank's outputs
    are off the single-device reference (the split, the rank, its logit error against the
    tolerance, the first divergent module) or when a rank crashed or the ranks hung (the
    rank, its exit status, the first lines of the reason); a minor note when expert
    parallelism was not validated beside the TP split (`ep_note`). None for a result that is
    not a distributed run. A run the job broke on purpose (its `inject` option) raises
    nothing: it proves the check, not a fault of the release."""
    if result.get("inject"):
        return []
    validated = result.get("validated")
    if validated is False:
        return [_distributed_not_validated(result, pool)]
    if validated is not True or result.get("passed") not in (True, False):
        return None
    found = []
    if result["passed"] is False:
        ranks = [row for row in result.get("ranks") or [] if isinstance(row, Mapping)]
        if ranks:
            found.append(_distributed_mismatch(result, pool))
        else:
            found.append(_distributed_rank_failed(result, pool))
    if result.get("ep_note"):
        found.append(_distributed_ep_not_validated(result, pool))
    return found


def unjudged_keys(result: Mapping[str, Any]) -> frozenset[str]:
    """The distributed notes a run could not judge: a run that validated nothing says nothing
    about a mismatch, a crash or expert parallelism found before; a run whose ranks crashed
    compared no outputs, so it says nothing about a mismatch; a run broken on purpose (its
    `inject` option) says nothing at all."""
    if result.get("inject"):
        return frozenset(
            {
                DISTRIBUTED_NOT_VALIDATED,
                DISTRIBUTED_MISMATCH,
                DISTRIBUTED_RANK_FAILED,
                DISTRIBUTED_EP_NOT_VALIDATED,
            }
        )
    if result.get("validated") is False:
        return frozenset(
            {DISTRIBUTED_MISMATCH, DISTRIBUTED_RANK_FAILED, DISTRIBUTED_EP_NOT_VALIDATED}
        )
    ranks = [row for row in result.get("ranks") or [] if isinstance(row, Mapping)]
    if result.get("validated") is True and result.get("passed") is False and not ranks:
        return frozenset({DISTRIBUTED_MISMATCH})
    return frozenset()
