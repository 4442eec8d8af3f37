"""The `release_notes` stage: what users of a release need to deploy it on a pool, gathered
from the earlier stages' results as data; the app writes the Markdown from templates.

Each earlier stage with a section names its function in the registry
(`StageDefinition.notes`, "engine.stages.<name>.notes:section"; see `engine.notes` for what
it reads and may declare). This stage walks the registry's stages before it, in order,
builds each section from the stage's state, and adds what is its own:

- **stages**: each earlier stage's status and, when it did not succeed, why;
- **blocked**: the stage that failed and stopped the job ({"stage", "failure_class"
  ("infrastructure", "release" or "" when not known), "reason" (its error's first line),
  "skipped" (the stages skipped after it)}), None when none failed: the notes open with it;
- **full_size**: the full-size figures, measured on the pool's engine with dummy weights (the
  serve stage's `full_size`) beside the plan's prediction for the same workloads and the fit
  it names (`full_size.py`); None when the job has neither;
- **limitations**: the release's open known limitations for the pool (or every pool), most
  severe first (`StageContext.limitations`, filled by the runner for a definition with
  `reads_limitations`);
- **not_validated**: stages that failed, were skipped or did not run, and what a twin, the
  split run only on the twin (or not at all), short prompts and a short stability run leave
  unproven, one item each: a kind and its values (`not_validated`);
- **summary**: what the release page's one line says (the plan's split and dtype, the knee,
  the precision, multi-device and stability verdicts, the open limitations), as values.

The result: {"format": `NOTES_FORMAT`, "sections": {"summary", <each stage's KEY>: its
section, "full_size", "limitations", "not_validated", "stages", "blocked"}, "order":
[{"stage", "section"}] (the stages' sections in the document's order)}. The app writes the document
(`templates/release_notes/document.md`) and the one-line summary
(`templates/release_notes/summary.txt`) when it stores the result
(`adaptation.services.release_notes`), and keeps both on the version it writes.

Plain Python: nothing here imports Django or torch (nor does any stage's `notes` module).
`build_release_notes` is the engine; `run` is the stage, which runs at the end of every job
that ends, failed or not (`StageDefinition.runs_after_failure`: a failed stage skips the
others, not this one), with every stage's state (`StageContext.states`), so a job that failed
early still gets notes from what it found and says what blocked it;
`adaptation.services.release_notes.release_notes_regenerate` calls the engine for any job the
same way.
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
from engine.stages.release_notes.full_size import full_size_section
from engine.stages.release_notes.not_validated import not_validated

# 3: the summary, what was not validated and the figures' labels are values too (format 2
# carried them as sentences and words; format 1 carried the Markdown); the app writes every
# word.
NOTES_FORMAT = 3
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

    Returns {"format", "sections", "order"}: see the module's docstring."""
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
    sections: dict[str, Any] = {"summary": _summary(built, open_limitations)}
    sections |= {part.key: built[part.stage] for part in document}
    full_size = full_size_section(by_stage)
    sections |= {
        "full_size": full_size,
        "limitations": open_limitations,
        "not_validated": not_validated(
            by_stage, built, ran_twin, twin, real_weights, full_size=full_size
        ),
        "stages": [
            {"name": s.name, "status": s.status, "reason": s.reason} for s in by_stage.values()
        ],
        "blocked": blocked_by(by_stage),
    }
    sections["summary"]["blocked"] = (
        {key: sections["blocked"][key] for key in ("stage", "failure_class")}
        if sections["blocked"]
        else None
    )
    return {
        "format": NOTES_FORMAT,
        "sections": sections,
        "order": [{"stage": part.stage, "section": part.key} for part in document],
    }


def blocked_by(states: Mapping[str, StageState]) -> dict[str, Any] | None:
    """What stopped the job: its first failed stage in job order, whose fault it was
    ("infrastructure" or "release"; "" when not known), its reason (the error's first line)
    and the stages skipped after it; None when no stage failed."""
    names = list(states)
    for i, name in enumerate(names):
        state = states[name]
        if state.status != "failed":
            continue
        return {
            "stage": name,
            "failure_class": state.failure_class,
            "reason": state.reason,
            "skipped": [n for n in names[i + 1 :] if states[n].status == "skipped"],
        }
    return None


def _summary(
    sections: Mapping[str, Mapping[str, Any]], limitations: Sequence[Any]
) -> dict[str, Any]:
    """What the one-line summary says, from the stages' sections (by stage name), as values:
    "plan" ({"split", "devices", "dtype_label"}; None without a fitting plan), "knee"
    ({"batch_size", "label", "capped_at": the plan's fit where it caps the recommended
    batch, else None}; None without a knee), "precision_passed" and "stability_verdict"
    (None where the stage left no verdict), "multi_device" ({"validated", "split",
    "verdict"}; None where the distributed stage left nothing) and "open_limitations" (a
    count). `build_release_notes` adds "blocked" ({"stage", "failure_class"} of the stage
    that stopped the job, or None)."""
    configuration = sections.get("plan") or {}
    distributed = sections.get("distributed") or {}
    performance = sections.get("performance") or {}
    precision = sections.get("precision") or {}
    stability = sections.get("stability") or {}
    plan = None
    if configuration.get("available"):
        plan = {
            "split": configuration["split"],
            "devices": configuration.get("devices"),
            "dtype_label": configuration.get("dtype_label"),
        }
    knee = None
    if performance.get("available"):
        knee = {
            "batch_size": performance["knee_batch_size"],
            # The summary calls the knee the twin's, as it always has.
            "label": MEASURED_TWIN,
            "capped_at": (
                performance["recommended_batch_size"] if performance.get("capped_by_plan") else None
            ),
        }
    multi_device = None
    if distributed.get("validated"):
        multi_device = {
            "validated": True,
            "split": distributed["split"],
            "verdict": distributed["verdict"],
        }
    elif distributed.get("available"):
        multi_device = {"validated": False, "split": None, "verdict": None}
    return {
        "plan": plan,
        "knee": knee,
        "precision_passed": precision["passed"] if precision.get("available") else None,
        "multi_device": multi_device,
        "stability_verdict": stability["verdict"] if stability.get("available") else None,
        "open_limitations": len(limitations),
    }


def run(ctx: StageContext) -> dict[str, Any]:
    """Gather the release notes from `ctx.previous` (the earlier stages that succeeded) and
    `ctx.states` (how each of the job's stages ended: a failed one's reason and what it kept;
    without them, a stage with no result is "not run") through the registry's stages
    (`ctx.stages`) and the release's open known limitations on the pool (`ctx.limitations`).
    Raises ValueError without `ctx.stages`: the notes would be empty."""
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
        states=getattr(ctx, "states", None),
    )
    sections = notes["sections"]
    ctx.log(
        f"release notes: {len(notes['order'])} sections, "
        f"{fmt.counted(len(sections['not_validated']), 'item')} not validated, "
        f"{fmt.counted(len(sections['limitations']), 'open limitation')}"
        + (f"; blocked by {sections['blocked']['stage']}" if sections["blocked"] else "")
    )
    return notes
