"""The release notes' "What was not validated": what a job's stages leave unproven about
serving the release on its pool, one item each, as values (stored in
`sections["not_validated"]`; `templates/release_notes/not_validated.md` writes each item's
sentence by its "kind").

The kinds, with their values:

- "stage_not_run" {"stage"}: the job does not have the stage;
- "stage_not_succeeded" {"stage", "status", "reason"}: it failed, was skipped, ...;
- "twin" {"stages", "twin"}: the full-size weights were never run, the `stages` ran a
  scaled twin (`twin`: {"parameters", "weights_source"}, None when none described it);
- "multi_device" {"outcome", "devices", "plan_split", "split", "reason"}: serving on
  several devices; "outcome" is "passed" (validated on the twin only), "failed" (the twin's
  split did not pass), "not_validated" (the distributed stage could not validate it here:
  "reason") or "not_run"; "devices" and "plan_split" are the plan's, "split" the twin's;
- "expert_parallelism" {"reason"}: the distributed stage left expert parallelism out;
- "serving_dtype" {"dtype", "dtype_label", "checked"}: the precision stage did not check
  the plan's serving dtype (`checked`: the dtypes it did check, sorted);
- "full_size_speed" {"predicted", "measured_on_engine"}: full-size speed is the plan's
  prediction, or none; or, `measured_on_engine`, it was measured on the pool's engine with
  dummy weights only (the real checkpoint at full size was never run);
- "context" {"prompt_tokens", "context_tokens"}: the longest prompt measured (on the twin,
  or at full size on the engine) is shorter than the planned context;
- "skipped_dtype" {"stage", "dtype", "reason"}: the precision or performance stage skipped
  a dtype (`reason`: the stage's, its first line);
- "stability_duration" {"duration_s"}: how long the stability run was.

Reasons are the stages' own text; the items hold no sentence of the engine's.

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine import formatting as fmt
from engine.markdown import first_line
from engine.notes import NOT_RUN, StageState


def not_validated(
    states: Mapping[str, StageState],
    sections: Mapping[str, Mapping[str, Any]],
    ran_twin: Sequence[str],
    twin: Mapping[str, Any] | None,
    real_weights: bool,
    *,
    full_size: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """What the notes leave unproven, one item each (see the module's docstring for the
    kinds): the stages that failed, were skipped or did not run (`states`, in job order);
    the stages that ran a scaled twin (`ran_twin`; `twin` describes it) unless all ran the
    real weights; and from the sections (`sections`, by stage name): serving on several
    devices, expert parallelism, the serving dtype, full-size speed, the planned context,
    skipped dtypes and a short stability run; `full_size` (`sections["full_size"]`) says
    whether the engine measured the full size with dummy weights."""
    configuration = sections.get("plan") or {}
    distributed = sections.get("distributed") or {}
    performance = sections.get("performance") or {}
    precision = sections.get("precision") or {}
    stability = sections.get("stability") or {}
    items: list[dict[str, Any]] = []
    for name, state in states.items():
        if state.succeeded:
            continue
        if state.status == NOT_RUN:
            items.append({"kind": "stage_not_run", "stage": name})
        else:
            items.append(
                {
                    "kind": "stage_not_succeeded",
                    "stage": name,
                    "status": state.status,
                    "reason": state.reason,
                }
            )
    if ran_twin and not real_weights:
        items.append(
            {
                "kind": "twin",
                "stages": list(ran_twin),
                "twin": (
                    {
                        "parameters": twin.get("parameters"),
                        "weights_source": twin.get("weights_source"),
                    }
                    if twin
                    else None
                ),
            }
        )
    if configuration.get("available"):
        items.append(_multi_device(configuration, distributed))
        if distributed.get("ep_note"):
            items.append(
                {"kind": "expert_parallelism", "reason": str(distributed.get("ep_reason") or "")}
            )
        validated = {row["dtype"] for row in precision.get("dtypes") or []}
        dtype = configuration.get("dtype")
        serving = _serving_dtype(str(dtype or ""), str(configuration.get("dtype_label") or ""))
        if dtype and serving not in validated:
            items.append(
                {
                    "kind": "serving_dtype",
                    "dtype": dtype,
                    "dtype_label": configuration.get("dtype_label"),
                    "checked": sorted(validated),
                }
            )
        predicted = bool(performance.get("available")) and performance.get("predicted") is not None
        measured = (full_size or {}).get("status") == "measured"
        items.append(
            {"kind": "full_size_speed", "predicted": predicted, "measured_on_engine": measured}
        )
        context = configuration.get("context_tokens")
        # The longest prompt measured anywhere: the twin's sweep, or the engine's full-size
        # workloads (a prefill-heavy pair sends longer prompts than the twin did).
        prompt_lens = list(performance.get("prompt_lens") or [])
        if measured:
            prompt_lens += [
                w["input_tokens"]
                for w in full_size.get("workloads") or []  # type: ignore[union-attr]
                if isinstance(w, Mapping) and isinstance(w.get("input_tokens"), int)
            ]
        if context and prompt_lens and max(prompt_lens) < context:
            items.append(
                {"kind": "context", "prompt_tokens": max(prompt_lens), "context_tokens": context}
            )
    for stage, section in (("precision", precision), ("performance", performance)):
        for dtype, why in (section.get("skipped_dtypes") or {}).items():
            items.append(
                {
                    "kind": "skipped_dtype",
                    "stage": stage,
                    "dtype": dtype,
                    "reason": first_line(why, 200),
                }
            )
    if stability.get("available") and fmt.finite(stability.get("duration_s")) is not None:
        items.append({"kind": "stability_duration", "duration_s": stability["duration_s"]})
    return items


_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn"}


def _serving_dtype(dtype: str, label: str) -> str:
    """The plan's serving dtype as the precision stage names dtypes (torch names): "fp8" →
    "float8_e4m3fn"; "checkpoint" reads the checkpoint's own from the label ("checkpoint
    (bf16)" → "bfloat16"; a quantized format such as mxfp4 stays as it is)."""
    if dtype == "checkpoint" and "(" in label:
        dtype = label.partition("(")[2].rsplit(")", 1)[0].strip()
    dtype = dtype.lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(dtype, dtype)


def _multi_device(
    configuration: Mapping[str, Any], distributed: Mapping[str, Any]
) -> dict[str, Any]:
    """What was not validated of serving on several devices: the plan's split at full size
    always; on the twin, whether the distributed stage passed, failed, could not validate
    (with its reason) or did not run the split."""
    item = {
        "kind": "multi_device",
        "outcome": "not_run",
        "devices": configuration.get("devices") or 1,
        "plan_split": configuration.get("split") or {},
        "split": None,
        "reason": "",
    }
    if distributed.get("validated") and distributed.get("passed"):
        return item | {"outcome": "passed", "split": distributed["split"]}
    if distributed.get("available") and not distributed.get("validated"):
        return item | {"outcome": "not_validated", "reason": distributed.get("reason") or ""}
    if distributed.get("validated"):  # it ran and failed: the stage's item above says why
        return item | {"outcome": "failed", "split": distributed["split"]}
    return item
