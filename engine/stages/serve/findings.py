"""The serving engine's known limitations (registered as the `serve` stage's `findings` and
`unjudged_keys` in `engine.registry`):

- `serve:cannot-serve` (blocker): the engine refused the release (unsupported architecture,
  a flag it rejects, out of memory, no answer before the start timeout) or died; titled
  "vllm 0.32.0 cannot serve <architecture> on pool <p>: <reason>", the engine's own lines
  first in the body, and whether the release or the infrastructure is at fault;
- `serve:precision` (major): greedy tokens or logprobs through the engine off transformers'
  float32 reference on the same checkpoint, beyond the dtype's limits;
- `serve:multi-device` (major): the plan's TP gives other greedy tokens than TP=1;
- `serve:sweep` (major): requests failed under load, or the sweep stopped.

Their words are `templates/limitations/serve/`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.findings import BLOCKER, MAJOR, Finding
from engine.stored import as_mapping

from .result import Failure, PrecisionCheck, ServeResult, TPCheck

SERVE_CANNOT_SERVE = "serve:cannot-serve"
SERVE_PRECISION = "serve:precision"
SERVE_MULTI_DEVICE = "serve:multi-device"
SERVE_SWEEP = "serve:sweep"
ALL_KEYS = frozenset({SERVE_CANNOT_SERVE, SERVE_PRECISION, SERVE_MULTI_DEVICE, SERVE_SWEEP})


def _architecture(analysis: Mapping[str, Any] | None, result: ServeResult) -> str:
    analysis = as_mapping(analysis)
    value = analysis.get("architecture") or analysis.get("model_type")
    if value:
        return str(value)
    if result.checkpoint is not None and result.checkpoint.architecture:
        return result.checkpoint.architecture
    return "this release"


def _divergence(divergence: Any) -> dict[str, Any] | None:
    """Where greedy tokens first diverged ({"prompt", "position"}), None when none did."""
    if divergence is None:
        return None
    return {"prompt": divergence.prompt, "position": divergence.position}


def _cannot_serve(result: ServeResult, failure: Failure, pool: str, arch: str) -> Finding:
    reason = failure.reason or "no reason given"
    return Finding(
        key=SERVE_CANNOT_SERVE,
        template="serve/cannot-serve",
        data={
            "engine_label": result.engine_label,
            "architecture": arch,
            "pool": pool,
            "reason": reason,
            # An engine's reason that already says who cannot serve what is the title itself.
            "reason_is_title": reason.startswith(f"{result.engine_label} cannot serve "),
            "engine_lines": "\n".join(failure.engine_lines),
            "culprit": failure.culprit,
            "launched_command": (
                result.engine.launched_command if result.engine is not None else ""
            ),
        },
        severity=BLOCKER,
    )


def _precision(result: ServeResult, precision: PrecisionCheck, pool: str) -> Finding:
    return Finding(
        key=SERVE_PRECISION,
        template="serve/precision",
        data={
            "engine_label": result.engine_label,
            "pool": pool,
            "dtype": precision.dtype or "",
            "prompts": precision.prompts,
            "tokens_compared": precision.tokens_compared,
            "token_agreement": precision.token_agreement,
            "max_abs_logprob_diff": precision.max_abs_logprob_diff,
            "limit_max_abs_logprob_diff": precision.limit_max_abs_logprob_diff,
            "kl_top_k": precision.kl_top_k,
            "limit_kl_top_k": precision.limit_kl_top_k,
            "divergence": _divergence(precision.first_divergence),
            "limits_source": precision.limits_source or "",
        },
        severity=MAJOR,
    )


def _multi_device(result: ServeResult, tp: TPCheck, pool: str) -> Finding:
    return Finding(
        key=SERVE_MULTI_DEVICE,
        template="serve/multi-device",
        data={
            "engine_label": result.engine_label,
            "pool": pool,
            "launched": tp.launched,
            "planned": tp.planned,
            "tokens_compared": tp.tokens_compared,
            "divergence": _divergence(tp.first_divergence),
        },
        severity=MAJOR,
    )


def _sweep(result: ServeResult, pool: str) -> Finding:
    failure = result.failure
    return Finding(
        key=SERVE_SWEEP,
        template="serve/sweep",
        data={
            "engine_label": result.engine_label,
            "pool": pool,
            "levels": [
                {
                    "concurrency": level.concurrency,
                    "completed": level.completed,
                    "errors": level.errors,
                }
                for level in result.sweep
            ],
            # Why the sweep stopped ("" when it ran to its end with failed requests).
            "stopped": failure.reason if failure is not None and failure.phase == "sweep" else "",
            "requests_failed": result.requests_failed,
        },
        severity=MAJOR,
    )


def findings(
    result: Mapping[str, Any], *, pool: str, analysis: Mapping[str, Any] | None = None
) -> list[Finding] | None:
    """The serve stage's notes from its result (see the module docstring). None for a result
    that is not a serve run, or a pool without an engine (nothing was judged). A failure the
    infrastructure caused after the engine started (it died, an endpoint stopped answering)
    raises no note about the release."""
    served = ServeResult.from_stored(result)
    if not served.judging:
        return None
    if served.failure is not None and served.failure.before_serving:
        return [_cannot_serve(served, served.failure, pool, _architecture(analysis, served))]
    found: list[Finding] = []
    if served.precision is not None and served.precision_passed is False:
        found.append(_precision(served, served.precision, pool))
    if served.tp is not None and served.tp_matched is False:
        found.append(_multi_device(served, served.tp, pool))
    if served.sweep_failure_blames_release:
        found.append(_sweep(served, pool))
    return found


def unjudged_keys(result: Mapping[str, Any]) -> frozenset[str]:
    """Notes a run could not judge: a pool without an engine judges nothing; a run that never
    served says nothing of precision, TP or load; a check the run did not reach (the
    infrastructure stopped it first) says nothing of that check."""
    served = ServeResult.from_stored(result)
    if not served.judging:
        return ALL_KEYS
    if served.failed_before_serving:
        return frozenset({SERVE_PRECISION, SERVE_MULTI_DEVICE, SERVE_SWEEP})
    unjudged = set()
    if served.precision_passed is None:
        unjudged.add(SERVE_PRECISION)
    if served.tp_matched is None:
        unjudged.add(SERVE_MULTI_DEVICE)
    if not served.sweep_judged:
        unjudged.add(SERVE_SWEEP)
    return frozenset(unjudged)
