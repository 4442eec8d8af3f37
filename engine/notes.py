"""The release notes' sections: what a stage's `notes.py` reads to build its section of the
notes (the stages' states, the notes' context) and the keys of the labels every figure
carries.

A stage with a section names its function in the registry (`StageDefinition.notes`,
"engine.stages.<name>.notes:section"); the `release_notes` stage
(`engine.stages.release_notes.run`) calls it, in registry order, as `section(state, notes)`
with the stage's `StageState` and the `NotesContext`, and stores the plain dict it returns
under `sections[KEY]`. The stage's `notes` module may set:

- `KEY`: the section's key in `sections` (default: the stage's name; the plan's section is
  "configuration", the analysis's "release", as stored notes have always had them);
- `PLACE`: where the section goes in the document, lower first (default: after the placed
  ones, in registry order);
- `ran_twin(state) -> bool`: whether the stage ran a scaled twin (its figures are the
  twin's, not the full model's); a stage without it ran none.

A stage's `notes` module imports this module, never another stage's package. The Markdown is
written by the app from each section's template (`templates/release_notes/sections/<stage>.md`);
the data here holds values, never prose.

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.markdown import first_line

# How each figure is labelled: the key a section stores ("label"); the document words it
# (`templates/release_notes/label.md`: "measured (twin)", "predicted (full-size)", ...).
MEASURED_TWIN = "measured_twin"
MEASURED_FULL = "measured_full"
# The full-size model on the pool's serving engine with dummy weights (random, from the
# config): speed, memory and scheduling at full size, nothing of precision.
MEASURED_ENGINE_FULL = "measured_engine_full"
PREDICTED_FULL = "predicted_full"
CALIBRATED_FULL = "calibrated_full"

# The status of a stage the job does not have.
NOT_RUN = "not run"


@dataclass(frozen=True)
class StageState:
    """What one earlier stage left: its status ("succeeded", "failed", "skipped",
    "cancelled", "pending", …, or `NOT_RUN` when the job does not have it), the result to
    read (a success's, or what a failed run kept), the reason it did not succeed, and for a
    failed one whose fault it was (`failure_class`: "infrastructure" or "release"; "" when
    not known)."""

    name: str
    status: str
    result: Mapping[str, Any] | None
    reason: str = ""
    failure_class: str = ""

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"


def stage_states(
    names: Sequence[str],
    results: Mapping[str, Mapping[str, Any]],
    states: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, StageState]:
    """The state of every stage in `names` (the stages the notes read, in job order).
    `results` are the succeeded stages' results (`StageContext.previous`); `states`
    ({stage: {"status", "error", "result", "failure_class"}}), where given, says how each of
    the job's stages ended (a failed run's `result` is what it kept, `failure_class` whose
    fault it was). Without `states`, a stage with a result succeeded and any other did not
    run."""
    out: dict[str, StageState] = {}
    for name in names:
        state = (states or {}).get(name)
        if state is not None:
            status = str(state.get("status") or NOT_RUN)
            result = results.get(name) if status == "succeeded" else state.get("result")
            reason = first_line(state.get("error"))
            failure_class = str(state.get("failure_class") or "") if status == "failed" else ""
        elif name in results:
            status, result, reason, failure_class = "succeeded", results[name], "", ""
        else:
            status, result, reason, failure_class = NOT_RUN, None, "", ""
        out[name] = StageState(
            name=name,
            status=status,
            result=result if isinstance(result, Mapping) else None,
            reason=reason,
            failure_class=failure_class,
        )
    return out


@dataclass(frozen=True)
class NotesContext:
    """What a stage's `section` function may read besides its own state.

    `release` is a `ReleaseRef` (`repo_id`, `revision`), `pool` a `PoolSpec`. `states` holds
    every stage the notes read, by name; `sections` the sections of the stages before this
    one in the registry, by stage name (the distributed section reads the plan's). `twin` is
    the scaled twin the first twin stage described (its `twin`: "parameters",
    "weights_source", ...), None when no stage ran one; `real_weights` says whether every
    twin stage that ran did so on the release's real weights at full size."""

    release: Any
    pool: Any
    states: Mapping[str, StageState] = field(default_factory=dict)
    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    twin: Mapping[str, Any] | None = None
    real_weights: bool = False

    def state(self, name: str) -> StageState:
        """The state of stage `name`; `NOT_RUN` when the notes do not read it."""
        return self.states.get(name) or StageState(name=name, status=NOT_RUN, result=None)
