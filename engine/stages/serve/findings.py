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

SERVE_CANNOT_SERVE = "serve:cannot-serve"
SERVE_PRECISION = "serve:precision"
SERVE_MULTI_DEVICE = "serve:multi-device"
SERVE_SWEEP = "serve:sweep"
ALL_KEYS = frozenset({SERVE_CANNOT_SERVE, SERVE_PRECISION, SERVE_MULTI_DEVICE, SERVE_SWEEP})

_CULPRIT_WORDS = {
    "release": "the release (what the engine's build cannot load or run)",
    "infrastructure": "the infrastructure (the worker, its engine environment or its memory)",
}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _engine_name(result: Mapping[str, Any]) -> str:
    engine = _mapping(result.get("engine"))
    name = str(engine.get("name") or "the engine")
    version = str(engine.get("version") or "")
    return f"{name} {version}".strip()


def _architecture(analysis: Mapping[str, Any] | None, result: Mapping[str, Any]) -> str:
    for source in (_mapping(analysis), _mapping(result.get("checkpoint"))):
        value = source.get("architecture") or source.get("model_type")
        if value:
            return str(value)
    return "this release"


def _cannot_serve(
    result: Mapping[str, Any], failure: Mapping[str, Any], pool: str, arch: str
) -> Finding:
    reason = str(failure.get("reason") or "no reason given")
    lines = [str(line) for line in failure.get("engine_lines") or []]
    engine = _engine_name(result)
    prefix = f"{engine} cannot serve "
    title = reason if reason.startswith(prefix) else f"{prefix}{arch} on pool {pool}: {reason}"
    body = []
    if lines:
        body += ["The engine's own lines:", "", md.code_block("\n".join(lines)), ""]
    body += [f"{sentence(reason)}", ""]
    culprit = str(failure.get("culprit") or "")
    if culprit in _CULPRIT_WORDS:
        body += [f"At fault: {_CULPRIT_WORDS[culprit]}.", ""]
    launched = _mapping(result.get("engine")).get("launched_command")
    if launched:
        body += ["The command that was launched:", "", md.code_block(str(launched), "sh")]
    return Finding(
        key=SERVE_CANNOT_SERVE,
        title=cut_title(gist(title) if len(title) > 200 else title),
        body="\n".join(body).rstrip(),
        severity=BLOCKER,
    )


def _precision(result: Mapping[str, Any], pool: str) -> Finding:
    precision = _mapping(result.get("precision"))
    limits = _mapping(precision.get("limits"))
    divergence = _mapping(precision.get("first_divergence"))
    where = (
        f"first divergence at prompt {divergence.get('prompt')}, token {divergence.get('position')}"
        if divergence
        else "no token diverged"
    )
    body = [
        f"Through {md.code(_engine_name(result))} on pool {md.code(pool)}, "
        f"{md.code(precision.get('dtype') or '?')} against transformers in float32 on the same "
        f"checkpoint ({fmt.count(precision.get('prompts'))} prompts, "
        f"{fmt.count(precision.get('tokens_compared'))} greedy tokens):",
        "",
        md.table(
            ("figure", "measured", "limit"),
            (
                ("token agreement", fmt.percent(precision.get("token_agreement")), "—"),
                (
                    "max \\|Δ logprob\\| of the chosen tokens",
                    fmt.sig(precision.get("max_abs_logprob_diff")),
                    fmt.sig(limits.get("max_abs_logprob_diff")),
                ),
                (
                    "KL over the top-k",
                    fmt.sig(precision.get("kl_top_k")),
                    fmt.sig(limits.get("kl_top_k")),
                ),
            ),
        ),
        "",
        f"{sentence(where)} Limits: {sentence(limits.get('source') or 'no source recorded')}",
    ]
    return Finding(
        key=SERVE_PRECISION,
        title=cut_title(
            f"{_engine_name(result)} on pool {pool}: {precision.get('dtype') or '?'} outputs off "
            f"the float32 reference (max |Δ logprob| "
            f"{fmt.sig(precision.get('max_abs_logprob_diff'))})"
        ),
        body="\n".join(body),
        severity=MAJOR,
    )


def _multi_device(result: Mapping[str, Any], pool: str) -> Finding:
    tp = _mapping(result.get("tp"))
    divergence = _mapping(tp.get("first_divergence"))
    where = (
        f"The first divergence is at prompt {divergence.get('prompt')}, token "
        f"{divergence.get('position')}."
        if divergence
        else ""
    )
    return Finding(
        key=SERVE_MULTI_DEVICE,
        title=cut_title(
            f"{_engine_name(result)} on pool {pool}: TP={tp.get('launched')} greedy tokens differ "
            "from TP=1"
        ),
        body=(
            f"The engine launched at TP={tp.get('launched')} (the plan's TP={tp.get('planned')}) "
            f"and at TP=1 on the same checkpoint gave different greedy tokens over "
            f"{fmt.count(tp.get('tokens_compared'))} tokens. {where}"
        ).strip(),
        severity=MAJOR,
    )


def _sweep(result: Mapping[str, Any], pool: str) -> Finding:
    sweep = [p for p in result.get("sweep") or [] if isinstance(p, Mapping)]
    errors = sum(int(p.get("errors") or 0) for p in sweep)
    failure = _mapping(result.get("failure"))
    stopped = failure.get("reason") if failure.get("phase") == "sweep" else ""
    rows = [
        (
            fmt.count(p.get("concurrency")),
            fmt.count(p.get("completed")),
            fmt.count(p.get("errors")),
        )
        for p in sweep
    ]
    body = [
        f"The load sweep through {md.code(_engine_name(result))} on pool {md.code(pool)}:",
        "",
        md.table(("concurrency", "completed", "errors"), rows) if rows else "No level finished.",
    ]
    if stopped:
        body += ["", f"It stopped: {sentence(stopped)}"]
    what = (
        f"sweep stopped: {gist(stopped)}" if stopped else f"{fmt.counted(errors, 'request')} failed"
    )
    return Finding(
        key=SERVE_SWEEP,
        title=cut_title(f"{_engine_name(result)} on pool {pool} under load: {what}"),
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
    status = result.get("status")
    if status not in ("served", "attached", "failed"):
        return None
    failure = _mapping(result.get("failure"))
    if failure.get("phase") in ("checkpoint", "launch"):
        return [_cannot_serve(result, failure, pool, _architecture(analysis, result))]
    found: list[Finding] = []
    if _mapping(result.get("precision")).get("passed") is False:
        found.append(_precision(result, pool))
    if _mapping(result.get("tp")).get("greedy_match") is False:
        found.append(_multi_device(result, pool))
    sweep = [p for p in result.get("sweep") or [] if isinstance(p, Mapping)]
    blamed = failure.get("culprit") == "release"
    if any(p.get("errors") for p in sweep) and (blamed or not failure):
        found.append(_sweep(result, pool))
    return found


def unjudged_keys(result: Mapping[str, Any]) -> frozenset[str]:
    """Notes a run could not judge: a pool without an engine judges nothing; a run that never
    served says nothing of precision, TP or load; a check the run did not reach (the
    infrastructure stopped it first) says nothing of that check."""
    status = result.get("status")
    if status not in ("served", "attached", "failed"):
        return ALL_KEYS
    failure = _mapping(result.get("failure"))
    if failure.get("phase") in ("checkpoint", "launch"):
        return frozenset({SERVE_PRECISION, SERVE_MULTI_DEVICE, SERVE_SWEEP})
    unjudged = set()
    if _mapping(result.get("precision")).get("passed") is None:
        unjudged.add(SERVE_PRECISION)
    if _mapping(result.get("tp")).get("greedy_match") is None:
        unjudged.add(SERVE_MULTI_DEVICE)
    if failure.get("culprit") == "infrastructure" or not result.get("sweep"):
        unjudged.add(SERVE_SWEEP)
    return frozenset(unjudged)
