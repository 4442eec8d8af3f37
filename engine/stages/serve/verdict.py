"""What the serve stage concludes from what it measured: the result being built (kept when a
later step fails), the knee of the sweep, whether the run passed, and whom a failure blames.

A failure's `culprit` is "release" (what the engine's build cannot load or run: an unsupported
architecture, head size or model type; precision off the reference; greedy tokens that differ
across TP) or "infrastructure" (the worker, its engine environment, its memory, the pool's
flags, a start timeout, an engine that died or an endpoint that stopped answering).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.contract import StageFailed
from engine.stages.performance.knee import find_knee

from .result import Failure, Knee, ServeResult

# The knee: the performance stage's rule (`find_knee`), on the engine's output tokens/s per
# concurrency level instead of the twin's decode tokens/s per batch.
KNEE_GROWTH = 0.10

# Lines of the engine that say the release (not the machine) is at fault.
_RELEASE_WORDS = (
    "not supported",
    "unsupported",
    "is not a supported",
    "no model architecture",
    "cannot find model",
    "head size",
    "head_size",
    "model type",
    "architectures",
)
_INFRASTRUCTURE_WORDS = (
    "did not answer",
    "out of memory",
    "cannot allocate memory",
    "insufficient memory",
    "not enough memory",
    "numa",
    "address already in use",
    "unrecognized arguments",
    "no such file",
    "permission denied",
)


def refusal_culprit(reason: str, lines: Sequence[str], pool_flags: Sequence[str]) -> str:
    """Whom an engine's refusal to start blames: a flag the pool added, a machine limit, a
    timeout are the infrastructure's; an architecture the build cannot load is the release's;
    anything unrecognised the infrastructure's (day0 does not blame a release on a guess)."""
    text = " ".join([reason, *lines]).lower()
    if any(flag.split("=", 1)[0].lower() in text for flag in pool_flags):
        return "infrastructure"
    if any(word in text for word in _INFRASTRUCTURE_WORDS):
        return "infrastructure"
    if any(word in text for word in _RELEASE_WORDS):
        return "release"
    return "infrastructure"


def knee(sweep: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The sweep's knee by the performance stage's rule (`performance.knee.find_knee`: the
    smallest level from which output tokens/s grows less than 10% per doubling to every larger
    level), as the result stores it (`result.Knee.to_dict`): `{"concurrency",
    "output_tokens_per_s", "tpot_s_p50", "found", "growth_at_knee", "growth_threshold",
    "reason"}`, `reason` a code: "found", "beyond_sweep" (kept growing to the last level) or
    "one_level". None without a level that completed without errors."""
    points = [
        p
        for p in sweep
        if isinstance(p.get("concurrency"), int)
        and (p.get("output_tokens_per_s") or 0) > 0
        and not p.get("errors")
    ]
    if not points:
        return None
    curve = [
        {
            "batch_size": p["concurrency"],
            "decode_tokens_per_s": p["output_tokens_per_s"],
            "tpot_s": p.get("tpot_s_p50"),
        }
        for p in points
    ]
    found = find_knee(curve, KNEE_GROWTH)
    if found is None:
        return None
    rule = "found" if found["found"] else ("one_level" if len(points) == 1 else "beyond_sweep")
    return Knee(
        concurrency=found["batch_size"],
        output_tokens_per_s=found["decode_tokens_per_s"],
        tpot_s_p50=found["tpot_s"],
        rule=rule,
        found=found["found"],
        growth_threshold=KNEE_GROWTH,
        growth_at_knee=found["growth_at_knee"],
    ).to_dict()


def failed_checks(result: Mapping[str, Any]) -> list[str]:
    """The checks a measured run failed, in order: "precision", "tp", "sweep"
    (`result.ServeResult.failed_checks`)."""
    return ServeResult.from_stored(result).failed_checks


class Measured:
    """The result being built; what is measured stays in it when a later step fails."""

    def __init__(self, mode: str) -> None:
        self.result: dict[str, Any] = {
            "status": "failed",
            "mode": mode,
            "engine": None,
            "checkpoint": None,
            "load_s": None,
            "peak_memory_bytes": None,
            "peak_memory_kind": "host_rss",
            "startup_log": [],
            "precision": None,
            "sweep": [],
            "sweep_settings": None,
            "knee": None,
            "metrics": None,
            "tp": None,
            "full_size": None,
            "passed": False,
            "failure": None,
        }

    def fail(
        self, phase: str, reason: str, *, lines: Sequence[str] | None = None, culprit: str
    ) -> StageFailed:
        """The `StageFailed` to raise, with the result (status failed) attached."""
        self.result["failure"] = Failure(
            phase=phase, reason=reason, engine_lines=list(lines or []), culprit=culprit
        ).to_dict()
        self.result["status"] = "failed"
        self.result["passed"] = False
        first = f" ({lines[0]})" if lines else ""
        return StageFailed(f"{phase}: {reason}{first}", result=self.result)

    def conclude(self, status: str) -> dict[str, Any]:
        """The finished result; raises `StageFailed` (culprit the release) when a check
        failed, so the job stops here as it does for the precision and distributed stages."""
        self.result["status"] = status
        failed = failed_checks(self.result)
        self.result["passed"] = not failed
        if failed:
            raise self.fail(
                failed[0],
                f"the engine served, but failed its {', '.join(failed)} "
                + ("check" if len(failed) == 1 else "checks"),
                culprit="release",
            ) from None
        return self.result
