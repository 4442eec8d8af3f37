"""The serving engine's section of the release notes ("Serving engine"): the exact command
that served, the load time, precision through the engine, the load sweep's knee, the plan's
TP against TP=1 and what failed, every figure measured on the engine serving the scaled twin
(or the release's real weights) (`templates/release_notes/sections/serve.md`).

The section is a `ServeSection`; `section` returns its fields as a plain dict
(`dataclasses.asdict`), because the `release_notes` stage stores every section as JSON and the
template reads the stored dict.

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from engine.markdown import first_line
from engine.notes import NotesContext, StageState
from engine.stored import whole_number

from .result import ServeResult

PLACE = 25  # after the multi-device validation (20), before performance (30)


@dataclass(frozen=True)
class ServeSection:
    """The serve stage's section as values.

    `status`: the result's "served", "attached", "not_configured" or "failed", else the
    stage's status when it kept no result ("not run", "skipped", "pending", ...; "failed").
    `engine_name`, `engine_version`, `launched_command` ("" when none was launched),
    `command_diff` ([{"flag", "planned", "launched", "why"}]), `load_s`, `peak_memory_bytes`,
    `checkpoint_kind` ("twin" or "real"); precision through the engine: `precision_passed`
    (None: not judged), `token_agreement` (a fraction), `max_abs_logprob_diff`, `kl_top_k`,
    `dtype`, `first_divergence` ({"prompt", "position"} or None); the sweep's knee:
    `knee_concurrency`, `knee_output_tokens_per_s`, `knee_tpot_s`; the TP check: `tp_planned`,
    `tp_greedy_match` (None: not compared); and what failed: `failure_phase` ("launch",
    "precision", "sweep", "metrics"), `failure_reason`, `engine_lines` (the engine's own error
    lines), `culprit` ("release", "infrastructure")."""

    status: str
    engine_name: str = ""
    engine_version: str = ""
    launched_command: str = ""
    command_diff: list[dict[str, str]] = field(default_factory=list)
    load_s: float | None = None
    peak_memory_bytes: int | None = None
    checkpoint_kind: str = "twin"
    precision_passed: bool | None = None
    token_agreement: float | None = None
    max_abs_logprob_diff: float | None = None
    kl_top_k: float | None = None
    dtype: str = ""
    first_divergence: dict[str, Any] | None = None
    knee_concurrency: int | None = None
    knee_output_tokens_per_s: float | None = None
    knee_tpot_s: float | None = None
    tp_planned: int | None = None
    tp_greedy_match: bool | None = None
    failure_phase: str | None = None
    failure_reason: str | None = None
    engine_lines: list[str] = field(default_factory=list)
    culprit: str | None = None


def ran_twin(state: StageState) -> bool:
    """Whether the engine served the scaled twin (not the release's real weights)."""
    checkpoint = ServeResult.from_stored(state.result).checkpoint
    return checkpoint is not None and not checkpoint.real


def serve_section(state: StageState) -> ServeSection:
    """The section of the serve stage's `state` (its stored result, or why it has none)."""
    result = ServeResult.from_stored(state.result)
    if not result.status:
        failed = state.status == "failed"
        return ServeSection(
            status=state.status,
            failure_reason=(first_line(state.reason, 400) or None) if failed else None,
        )
    if result.status == "not_configured":
        return ServeSection(status=result.status)
    engine, precision, knee, tp = result.engine, result.precision, result.knee, result.tp
    failed = result.status == "failed" or state.status == "failed"
    failure = result.failure if failed else None
    divergence = precision.first_divergence if precision is not None else None
    return ServeSection(
        status="failed" if failed else result.status,
        engine_name=engine.name if engine else "",
        engine_version=engine.version if engine else "",
        launched_command=engine.launched_command if engine else "",
        command_diff=[asdict(change) for change in engine.changes] if engine else [],
        load_s=result.load_s,
        peak_memory_bytes=whole_number(result.peak_memory_bytes),
        checkpoint_kind=result.checkpoint_kind,
        precision_passed=result.precision_passed,
        token_agreement=precision.token_agreement if precision else None,
        max_abs_logprob_diff=precision.max_abs_logprob_diff if precision else None,
        kl_top_k=precision.kl_top_k if precision else None,
        dtype=result.dtype,
        first_divergence=(
            {"prompt": divergence.prompt, "position": divergence.position} if divergence else None
        ),
        knee_concurrency=knee.concurrency if knee else None,
        knee_output_tokens_per_s=knee.output_tokens_per_s if knee else None,
        knee_tpot_s=knee.tpot_s_p50 if knee else None,
        tp_planned=tp.planned if tp else None,
        tp_greedy_match=result.tp_matched,
        failure_phase=(failure.phase or None) if failure else None,
        failure_reason=(
            (first_line((failure.reason if failure else "") or state.reason, 400) or None)
            if failed
            else None
        ),
        engine_lines=list(failure.engine_lines) if failure else [],
        culprit=(failure.culprit or None) if failure else None,
    )


def section(state: StageState, notes: NotesContext) -> dict[str, Any]:
    """The serve stage's section: `ServeSection`'s fields as a plain dict (stored as JSON)."""
    return asdict(serve_section(state))
