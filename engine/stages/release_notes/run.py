"""The `release_notes` stage: what users of a release need to deploy it on a pool, gathered
from the earlier stages' results as data; the app writes the Markdown from templates.

Each earlier stage with a section names its function in the registry
(`StageDefinition.notes`, "engine.stages.<name>.notes:section"; see `engine.notes` for what
it reads and may declare). This stage walks the registry's stages before it, in order,
builds each section from the stage's state, and adds what is its own:

- **stages**: each earlier stage's status and, when it did not succeed, why;
- **limitations**: the release's open known limitations for the pool (or every pool), most
  severe first (`StageContext.limitations`, filled by the runner for a definition with
  `reads_limitations`);
- **not_validated**: stages that failed, were skipped or did not run, and what a twin, the
  split run only on the twin (or not at all), short prompts and a short stability run leave
  unproven (`not_validated`);
- **summary**: one line for the release page.

The result: {"format": `NOTES_FORMAT`, "sections": {"summary", <each stage's KEY>: its
section, "limitations", "not_validated", "stages"}, "summary", "order": [{"stage",
"section"}] (the stages' sections in the document's order)}. The app renders the document
from `templates/release_notes/` when it stores the result
(`adaptation.services.release_notes`), and keeps it on the version it writes.

Plain Python: nothing here imports Django or torch (nor does any stage's `notes` module).
`build_release_notes` is the engine; `run` is the stage (its predecessors all succeeded, or
the stage would have been skipped); `adaptation.services.release_notes.release_notes_regenerate`
calls the engine for any job, with the stages' states, so a job that failed early still
gets notes from what it found.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from engine import formatting as fmt
from engine.contract import StageContext, StageDefinition, resolve_callable
from engine.findings import SEVERITIES
from engine.notes import (
    MEASURED_TWIN,
    NotesContext,
    StageState,
    stage_states,
)
from engine.stages.release_notes.not_validated import not_validated

# 2: the engine returns data only; the app writes the Markdown (format 1 carried it).
NOTES_FORMAT = 2
STAGE = "release_notes"


@dataclass(frozen=True)
class NotesSection:
    """One stage's section as the registry and its `notes` module declare it."""

    stage: str
    key: str
    place: float
    build: Callable[[StageState, NotesContext], dict[str, Any]]
    ran_twin: Callable[[StageState], bool] | None


def read_stages(stages: Sequence[StageDefinition]) -> list[StageDefinition]:
    """The stages the notes read: the registry's stages before this one, in order."""
    names = [definition.name for definition in stages]
    return list(stages[: names.index(STAGE)] if STAGE in names else stages)


def notes_sections(stages: Sequence[StageDefinition]) -> list[NotesSection]:
    """The sections of `stages` that name a `notes` function, in registry order, with the
    `KEY`, `PLACE` and `ran_twin` their module declares (defaults: the stage's name, after
    the placed ones, none). Raises ImportError/AttributeError for a bad `notes` path."""
    out = []
    for definition in stages:
        if definition.notes is None:
            continue
        build = resolve_callable(definition.notes)
        module = importlib.import_module(build.__module__)
        out.append(
            NotesSection(
                stage=definition.name,
                key=getattr(module, "KEY", definition.name),
                place=getattr(module, "PLACE", math.inf),
                build=build,
                ran_twin=getattr(module, "ran_twin", None),
            )
        )
    return out


def _twin_description(
    ran_twin: Sequence[StageState],
) -> tuple[Mapping[str, Any] | None, bool]:
    """(the twin description of the first stage in `ran_twin` that kept one, whether every
    one of them that described its twin ran the release's real weights at full size)."""
    described = [
        state.result["twin"]
        for state in ran_twin
        if state.result is not None and isinstance(state.result.get("twin"), Mapping)
    ]
    if not described:
        return None, False
    real = all(d.get("weights_source") == "real" for d in described)
    return described[0], real


def _limitations(limitations: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The open limitations, most severe first (then as given: newest first)."""
    rows = [
        {
            "title": str(item.get("title") or ""),
            "body": str(item.get("body") or ""),
            "severity": str(item.get("severity") or "major"),
            "status": str(item.get("status") or "open"),
            "stage": str(item.get("stage") or ""),
            "pool": item.get("pool") or None,
        }
        for item in limitations
        if isinstance(item, Mapping)
    ]
    rank = {name: i for i, name in enumerate(SEVERITIES)}
    return sorted(rows, key=lambda r: rank.get(r["severity"], len(rank)))


def build_release_notes(
    *,
    release: Any,
    pool: Any,
    results: Mapping[str, Mapping[str, Any]],
    stages: Sequence[StageDefinition],
    limitations: Sequence[Mapping[str, Any]] = (),
    states: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The release notes of `release` (a `ReleaseRef`: `repo_id`, `revision`) on `pool` (a
    `PoolSpec`) as data, from the registry's `stages` (`engine.registry.STAGES`), the
    earlier stages' `results` (succeeded ones, by stage name), the open `limitations` (plain
    dicts: title, body, severity, status, stage, pool name or None for every pool) and,
    where known, every stage's `states` (see `stage_states`).

    Returns {"format", "sections", "summary", "order"}: see the module's docstring."""
    read = read_stages(stages)
    by_stage = stage_states([definition.name for definition in read], results, states)
    parts = notes_sections(read)
    ran_twin = [p.stage for p in parts if p.ran_twin is not None and p.ran_twin(by_stage[p.stage])]
    twin, real_weights = _twin_description([by_stage[name] for name in ran_twin])
    built: dict[str, dict[str, Any]] = {}
    for part in parts:
        notes = NotesContext(
            release=release,
            pool=pool,
            states=by_stage,
            sections=MappingProxyType(dict(built)),
            twin=twin,
            real_weights=real_weights,
        )
        built[part.stage] = part.build(by_stage[part.stage], notes)
    document = sorted(parts, key=lambda p: p.place)
    open_limitations = _limitations(limitations)
    summary = _summary(built, open_limitations)
    sections: dict[str, Any] = {"summary": summary}
    sections |= {part.key: built[part.stage] for part in document}
    sections |= {
        "limitations": open_limitations,
        "not_validated": not_validated(by_stage, built, ran_twin, twin, real_weights),
        "stages": [
            {"name": s.name, "status": s.status, "reason": s.reason} for s in by_stage.values()
        ],
    }
    return {
        "format": NOTES_FORMAT,
        "sections": sections,
        "summary": summary,
        "order": [{"stage": part.stage, "section": part.key} for part in document],
    }


def _summary(sections: Mapping[str, Mapping[str, Any]], limitations: Sequence[Any]) -> str:
    """One line from the stages' sections (by stage name): split and dtype (or why none),
    knee, precision, multi-device and stability verdicts, and the count of open
    limitations."""
    configuration = sections.get("plan") or {}
    distributed = sections.get("distributed") or {}
    performance = sections.get("performance") or {}
    precision = sections.get("precision") or {}
    stability = sections.get("stability") or {}
    parts = []
    if configuration.get("available"):
        split = configuration["split"]
        parts.append(
            f"{fmt.split(split)} on {configuration.get('devices')} device(s), "
            f"{configuration.get('dtype_label')}"
        )
    else:
        parts.append("no fitting plan")
    if performance.get("available"):
        parts.append(f"knee batch {performance['knee_batch_size']} ({MEASURED_TWIN})")
        if performance.get("capped_by_plan"):
            parts.append(f"recommended batch {performance['recommended_batch_size']} (plan's fit)")
    if precision.get("available"):
        parts.append("precision " + ("passed" if precision["passed"] else "failed"))
    if distributed.get("validated"):
        split = distributed["split"]
        parts.append(f"multi-device {fmt.validated_split(split)} {distributed['verdict']}")
    elif distributed.get("available"):
        parts.append("multi-device not validated")
    if stability.get("available"):
        parts.append("stability " + stability["verdict"])
    parts.append(f"{len(limitations)} open limitation(s)")
    return "; ".join(parts)


def run(ctx: StageContext) -> dict[str, Any]:
    """Gather the release notes from `ctx.previous` (every earlier stage succeeded, or this
    stage would have been skipped; a stage the job does not have is "not run") through the
    registry's stages (`ctx.stages`) and the release's open known limitations on the pool
    (`ctx.limitations`). Raises ValueError without `ctx.stages`: the notes would be empty."""
    if not ctx.stages:
        raise ValueError(
            "the release notes walk the registry's stages (StageContext.stages), none given"
        )
    notes = build_release_notes(
        release=ctx.release,
        pool=ctx.pool,
        results=ctx.previous,
        stages=ctx.stages,
        limitations=ctx.limitations,
    )
    ctx.log(f"release notes: {notes['summary']}")
    return notes
