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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine import markdown as md
from engine.findings import BLOCKER, MAJOR, Finding, cut_title, gist, sentence
from engine.stored import as_mapping

from .result import Failure, PrecisionCheck, ServeResult, TPCheck

SERVE_CANNOT_SERVE = "serve:cannot-serve"
SERVE_PRECISION = "serve:precision"
SERVE_MULTI_DEVICE = "serve:multi-device"
SERVE_SWEEP = "serve:sweep"
ALL_KEYS = frozenset({SERVE_CANNOT_SERVE, SERVE_PRECISION, SERVE_MULTI_DEVICE, SERVE_SWEEP})

_CULPRIT_WORDS = {
    "release": "the release (what the engine's build cannot load or run)",
    "infrastructure": "the infrastructure (the worker, its engine environment or its memory)",
}


def _architecture(analysis: Mapping[str, Any] | None, result: ServeResult) -> str:
    analysis = as_mapping(analysis)
    value = analysis.get("architecture") or analysis.get("model_type")
    if value:
        return str(value)
    if result.checkpoint is not None and result.checkpoint.architecture:
        return result.checkpoint.architecture
    return "this release"


def _cannot_serve(result: ServeResult, failure: Failure, pool: str, arch: str) -> Finding:
    reason = failure.reason or "no reason given"
    engine = result.engine_label
    prefix = f"{engine} cannot serve "
    title = reason if reason.startswith(prefix) else f"{prefix}{arch} on pool {pool}: {reason}"
    body = []
    if failure.engine_lines:
        body += ["The engine's own lines:", "", md.code_block("\n".join(failure.engine_lines)), ""]
    body += [f"{sentence(reason)}", ""]
    if failure.culprit in _CULPRIT_WORDS:
        body += [f"At fault: {_CULPRIT_WORDS[failure.culprit]}.", ""]
    launched = result.engine.launched_command if result.engine is not None else ""
    if launched:
        body += ["The command that was launched:", "", md.code_block(launched, "sh")]
    return Finding(
        key=SERVE_CANNOT_SERVE,
        title=cut_title(gist(title) if len(title) > 200 else title),
        body="\n".join(body).rstrip(),
        severity=BLOCKER,
    )


def _precision(result: ServeResult, precision: PrecisionCheck, pool: str) -> Finding:
    divergence = precision.first_divergence
    where = (
        f"first divergence at prompt {divergence.prompt}, token {divergence.position}"
        if divergence is not None
        else "no token diverged"
    )
    body = [
        f"Through {md.code(result.engine_label)} on pool {md.code(pool)}, "
        f"{md.code(precision.dtype or '?')} against transformers in float32 on the same "
        f"checkpoint ({fmt.count(precision.prompts)} prompts, "
        f"{fmt.count(precision.tokens_compared)} greedy tokens):",
        "",
        md.table(
            ("figure", "measured", "limit"),
            (
                ("token agreement", fmt.percent(precision.token_agreement), "—"),
                (
                    "max \\|Δ logprob\\| of the chosen tokens",
                    fmt.sig(precision.max_abs_logprob_diff),
                    fmt.sig(precision.limit_max_abs_logprob_diff),
                ),
                (
                    "KL over the top-k",
                    fmt.sig(precision.kl_top_k),
                    fmt.sig(precision.limit_kl_top_k),
                ),
            ),
        ),
        "",
        f"{sentence(where)} Limits: {sentence(precision.limits_source or 'no source recorded')}",
    ]
    return Finding(
        key=SERVE_PRECISION,
        title=cut_title(
            f"{result.engine_label} on pool {pool}: {precision.dtype or '?'} outputs off "
            f"the float32 reference (max |Δ logprob| "
            f"{fmt.sig(precision.max_abs_logprob_diff)})"
        ),
        body="\n".join(body),
        severity=MAJOR,
    )


def _multi_device(result: ServeResult, tp: TPCheck, pool: str) -> Finding:
    divergence = tp.first_divergence
    where = (
        f"The first divergence is at prompt {divergence.prompt}, token {divergence.position}."
        if divergence is not None
        else ""
    )
    return Finding(
        key=SERVE_MULTI_DEVICE,
        title=cut_title(
            f"{result.engine_label} on pool {pool}: TP={tp.launched} greedy tokens differ from TP=1"
        ),
        body=(
            f"The engine launched at TP={tp.launched} (the plan's TP={tp.planned}) "
            f"and at TP=1 on the same checkpoint gave different greedy tokens over "
            f"{fmt.count(tp.tokens_compared)} tokens. {where}"
        ).strip(),
        severity=MAJOR,
    )


def _sweep(result: ServeResult, pool: str) -> Finding:
    failure = result.failure
    stopped = failure.reason if failure is not None and failure.phase == "sweep" else ""
    rows = [
        (fmt.count(level.concurrency), fmt.count(level.completed), fmt.count(level.errors))
        for level in result.sweep
    ]
    body = [
        f"The load sweep through {md.code(result.engine_label)} on pool {md.code(pool)}:",
        "",
        md.table(("concurrency", "completed", "errors"), rows) if rows else "No level finished.",
    ]
    if stopped:
        body += ["", f"It stopped: {sentence(stopped)}"]
    what = (
        f"sweep stopped: {gist(stopped)}"
        if stopped
        else f"{fmt.counted(result.requests_failed, 'request')} failed"
    )
    return Finding(
        key=SERVE_SWEEP,
        title=cut_title(f"{result.engine_label} on pool {pool} under load: {what}"),
        body="\n".join(body),
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
