"""Which rank broke a distributed run, and the reason's first line that says so.

When one rank crashes or hangs, its peers fail too: they time out, or lose the connection,
inside the collective the broken rank never joins (gloo: "Timed out waiting ... for recv",
"Connection closed by peer"; NCCL: the watchdog). Those peers are victims; the culprit is the
rank that died of something else, or, when every failing rank is a victim, the one that fell
behind (the earliest step in `rank.PHASES`). Torch-free.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from engine.formatting import exit_status
from engine.stages.distributed.rank import PHASES

# Log text of a rank that failed waiting for a peer, not of its own fault.
VICTIM_MARKS = (
    "Timed out waiting",
    "Connection closed by peer",
    "Connection reset by peer",
    "DistBackendError",
    "Watchdog caught collective operation timeout",
)
_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Exit)\b.*)$")


def is_victim(entry: Mapping[str, Any]) -> bool:
    """Whether a rank failed, or was found when the time limit hit, waiting for a peer inside
    a collective (its log's timeout error, or its stack inside torch.distributed)."""
    excerpt = entry.get("excerpt") or ""
    return bool(entry.get("in_collective")) or any(mark in excerpt for mark in VICTIM_MARKS)


def error_line(excerpt: str, limit: int = 200) -> str:
    """The last exception line of a log excerpt ("ValueError: ..."), without torchrun's
    "[rankN]:" prefix, cut at `limit` characters; "" when there is none."""
    for line in reversed(excerpt.splitlines()):
        match = _ERROR_LINE.match(line.strip())
        if match:
            text = match[1]
            return text if len(text) <= limit else text[: limit - 1] + "…"
    return ""


def _last_line(entry: Mapping[str, Any]) -> str:
    lines = (entry.get("excerpt") or "").splitlines()
    return lines[-1].strip() if lines else "(nothing logged)"


def _phase_index(entry: Mapping[str, Any]) -> int:
    phase = entry.get("phase")
    return PHASES.index(phase) if phase in PHASES else -1


def culprit(rank_logs: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any] | None, bool]:
    """(the rank that broke the run, whether it crashed) from `launch.LaunchOutcome.rank_logs`.

    A rank that exited non-zero (other than torchrun's SIGTERM to the survivors) and is not a
    victim crashed; else the rank at the earliest phase hung, a non-victim before a victim (a
    rank found inside a collective when the time limit hit waits for it); None when no rank
    left a log or nothing tells the rank behind from another."""
    for entry in rank_logs:
        if entry.get("exit_code") not in (None, 0, -signal.SIGTERM) and not is_victim(entry):
            return entry, True
    if not rank_logs:
        return None, False
    order = sorted(rank_logs, key=lambda e: (_phase_index(e), is_victim(e), e["rank"]))
    behind = order[0]
    if len(order) > 1 and (_phase_index(order[1]), is_victim(order[1])) == (
        _phase_index(behind),
        is_victim(behind),
    ):
        return None, False  # nothing tells them apart: no rank is blamed
    return behind, False


def failure_reason(
    headline: str, rank_logs: Sequence[Mapping[str, Any]], launcher_excerpt: str = ""
) -> tuple[str, int | None]:
    """(the stage's failure reason, the culprit rank or None).

    The first line names the culprit and how it ended (with its exception when it raised one);
    its log excerpt and the other ranks' last lines follow."""
    entry, crashed = culprit(rank_logs)
    if entry is None:
        reason = headline
        if rank_logs:
            phases = sorted({str(e.get("phase") or "starting") for e in rank_logs})
            reason += (
                ": could not tell which rank hung (every rank stopped after "
                f"'{', '.join(phases)}')\nlast line of each rank: "
                + "; ".join(f"rank {e['rank']}: {_last_line(e)}" for e in rank_logs)
            )
        elif launcher_excerpt:
            reason += f"\ntorchrun logged:\n{launcher_excerpt}"
        return reason, None
    rank = entry["rank"]
    if crashed:
        how = f"rank {rank} {exit_status(entry.get('exit_code'))}"
        error = error_line(entry.get("excerpt") or "")
        if error:
            how += f" ({error})"
    else:
        how = f"rank {rank} stopped after '{entry.get('phase') or 'starting'}'"
        if entry.get("excerpt"):
            how += f" (its last line: {_last_line(entry)[:160]})"
        if any(is_victim(e) for e in rank_logs if e is not entry):
            how += "; the other ranks were waiting for it in a collective"
    reason = f"{headline}: {how}\nits log:\n{entry.get('excerpt') or '(nothing)'}"
    others = [f"rank {e['rank']}: {_last_line(e)}" for e in rank_logs if e is not entry]
    if others:
        reason += "\nlast line of the other ranks: " + "; ".join(others)
    return reason, rank
