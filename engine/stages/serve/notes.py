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

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.formatting import finite
from engine.markdown import first_line
from engine.notes import NotesContext, StageState

PLACE = 25  # after the multi-device validation (20), before performance (30)

# The result's own statuses (docs/stages/serve.md).
RESULT_STATUSES = ("served", "attached", "not_configured", "failed")


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


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _whole(value: Any) -> int | None:
    number = finite(value)
    return int(number) if number is not None and number.is_integer() else None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def ran_twin(state: StageState) -> bool:
    """Whether the engine served the scaled twin (not the release's real weights)."""
    result = state.result or {}
    checkpoint = _mapping(result.get("checkpoint"))
    return bool(checkpoint) and checkpoint.get("kind") != "real"


def serve_section(state: StageState) -> ServeSection:
    """The section of the serve stage's `state` (its stored result, or why it has none)."""
    result = state.result or {}
    status = str(result.get("status") or "")
    if status not in RESULT_STATUSES:
        failed = state.status == "failed"
        return ServeSection(
            status=state.status,
            failure_reason=(first_line(state.reason, 400) or None) if failed else None,
        )
    if status == "not_configured":
        return ServeSection(status=status)
    engine = _mapping(result.get("engine"))
    checkpoint = _mapping(result.get("checkpoint"))
    precision = _mapping(result.get("precision"))
    divergence = _mapping(precision.get("first_divergence"))
    knee = _mapping(result.get("knee"))
    tp = _mapping(result.get("tp"))
    failure = _mapping(result.get("failure"))
    failed = status == "failed" or state.status == "failed"
    if not failed:
        failure = {}
    return ServeSection(
        status="failed" if failed else status,
        engine_name=_text(engine.get("name")),
        engine_version=_text(engine.get("version")),
        launched_command=_text(engine.get("launched_command")),
        command_diff=[
            {key: _text(row.get(key)) for key in ("flag", "planned", "launched", "why")}
            for row in _items(engine.get("command_diff"))
            if isinstance(row, Mapping)
        ],
        load_s=finite(result.get("load_s")),
        peak_memory_bytes=_whole(result.get("peak_memory_bytes")),
        checkpoint_kind="real" if checkpoint.get("kind") == "real" else "twin",
        precision_passed=_flag(precision.get("passed")),
        token_agreement=finite(precision.get("token_agreement")),
        max_abs_logprob_diff=finite(precision.get("max_abs_logprob_diff")),
        kl_top_k=finite(precision.get("kl_top_k")),
        dtype=_text(precision.get("dtype") or checkpoint.get("dtype")),
        first_divergence=(
            {"prompt": divergence.get("prompt"), "position": divergence.get("position")}
            if divergence
            else None
        ),
        knee_concurrency=_whole(knee.get("concurrency")),
        knee_output_tokens_per_s=finite(knee.get("output_tokens_per_s")),
        knee_tpot_s=finite(knee.get("tpot_s_p50")),
        tp_planned=_whole(tp.get("planned")),
        tp_greedy_match=_flag(tp.get("greedy_match")),
        failure_phase=_text(failure.get("phase")) or None,
        failure_reason=(
            (first_line(failure.get("reason") or state.reason, 400) or None) if failed else None
        ),
        engine_lines=[str(line) for line in _items(failure.get("engine_lines"))],
        culprit=_text(failure.get("culprit")) or None,
    )


def section(state: StageState, notes: NotesContext) -> dict[str, Any]:
    """The serve stage's section: `ServeSection`'s fields as a plain dict (stored as JSON)."""
    return asdict(serve_section(state))
