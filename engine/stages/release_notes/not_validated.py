"""The release notes' "What was not validated": what a job's stages leave unproven about
serving the release on its pool, one Markdown line each (its words are sentences the engine
writes from several sections, stored in `sections["not_validated"]`; the document's template
lists them as they are).

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine import formatting as fmt
from engine.markdown import code, first_line, text
from engine.notes import NOT_RUN, StageState


def not_validated(
    states: Mapping[str, StageState],
    sections: Mapping[str, Mapping[str, Any]],
    ran_twin: Sequence[str],
    twin: Mapping[str, Any] | None,
    real_weights: bool,
) -> list[str]:
    """What the notes leave unproven, one Markdown line each: the stages that failed, were
    skipped or did not run (`states`, in job order); the stages that ran a scaled twin
    (`ran_twin`; `twin` describes it) unless all ran the real weights; and from the
    sections (`sections`, by stage name): serving on several devices, expert parallelism,
    the serving dtype, full-size speed, the planned context, skipped dtypes and a short
    stability run."""
    configuration = sections.get("plan") or {}
    distributed = sections.get("distributed") or {}
    performance = sections.get("performance") or {}
    precision = sections.get("precision") or {}
    stability = sections.get("stability") or {}
    items: list[str] = []
    for name, state in states.items():
        if state.succeeded:
            continue
        if state.status == NOT_RUN:
            items.append(f"`{name}`: not run in this job.")
        else:
            why = f": {text(state.reason).rstrip(':; ')}" if state.reason else ""
            items.append(f"`{name}`: {text(state.status)}{why}.")
    if ran_twin and not real_weights:
        size = f" ({fmt.params(twin.get('parameters'))} parameters" if twin else " ("
        weights = "seeded weights)" if (twin or {}).get("weights_source") != "real" else "real)"
        items.append(
            "The full-size weights were never run: "
            + ", ".join(f"`{n}`" for n in ran_twin)
            + f" ran a scaled twin{size}, {weights} with the release's structure; its speed, "
            "memory and errors are the twin's, not the full model's."
        )
    if configuration.get("available"):
        items.append(_multi_device(configuration, distributed))
        if distributed.get("ep_note"):
            why = text(distributed.get("ep_reason") or "").rstrip(".")
            items.append(f"Expert parallelism was not validated on the twin: {why}.")
        validated = {row["dtype"] for row in precision.get("dtypes") or []}
        dtype = configuration.get("dtype")
        serving = _serving_dtype(str(dtype or ""), str(configuration.get("dtype_label") or ""))
        if dtype and serving not in validated:
            items.append(
                f"The serving dtype {text(configuration.get('dtype_label') or dtype)} was not "
                "checked by `precision` (checked: "
                + (", ".join(sorted(validated)) or "none")
                + ")."
            )
        if not performance.get("available") or performance.get("predicted") is None:
            items.append("No full-size speed was predicted for the recommended batch.")
        else:
            items.append(
                "Full-size speed is predicted by the plan's roofline, never measured here."
            )
        context = configuration.get("context_tokens")
        prompt_lens = performance.get("prompt_lens") or []
        if context and prompt_lens and max(prompt_lens) < context:
            items.append(
                f"Prompts up to {max(prompt_lens):,} tokens were measured; the planned context "
                f"of {context:,} tokens was not exercised."
            )
    for dtype, why in (precision.get("skipped_dtypes") or {}).items():
        why_text = text(first_line(why, 200))
        items.append(f"Precision in {code(dtype)} was not checked: {why_text}.")
    for dtype, why in (performance.get("skipped_dtypes") or {}).items():
        why_text = text(first_line(why, 200))
        items.append(f"Performance in {code(dtype)} was not measured: {why_text}.")
    if stability.get("available") and fmt.finite(stability.get("duration_s")) is not None:
        items.append(
            f"Stability ran for {fmt.seconds(stability['duration_s'])} on the twin, not for hours "
            "at full size under production traffic."
        )
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


def _multi_device(configuration: Mapping[str, Any], distributed: Mapping[str, Any]) -> str:
    """What was not validated of serving on several devices: the plan's split at full size
    always; on the twin, what the distributed stage did not run, pass or validate."""
    devices = configuration.get("devices") or 1
    split = configuration.get("split") or {}
    planned = f"{fmt.split(split)} on {devices} devices"
    if distributed.get("validated") and distributed.get("passed"):
        ran = distributed["split"]
        where = (
            f"{fmt.validated_split(ran)} across {fmt.count(ran.get('processes'))} "
            f"{code(ran.get('backend') or '?')} processes"
        )
        if devices > 1:
            return (
                f"Multi-device serving was validated on the twin only ({where}); the plan's "
                f"split {planned} was not run at full size, its communication and scaling are "
                "predicted only."
            )
        return f"Serving on more than one device was validated on the twin only ({where})."
    if distributed.get("available") and not distributed.get("validated"):
        why = text(distributed.get("reason") or "no reason given").rstrip(".")
        if devices > 1:
            return (
                f"Multi-device serving was not validated: {why}; the split {planned}, its "
                "communication and scaling are predicted only."
            )
        return f"Serving on more than one device was not validated: {why}."
    if distributed.get("validated"):  # it ran and failed: the stage's line above says why
        ran = fmt.validated_split(distributed["split"])
        if devices > 1:
            return (
                f"Multi-device serving did not pass on the twin ({ran}, see `distributed`): "
                f"the split {planned} is not validated."
            )
        return f"Serving on more than one device did not pass on the twin ({ran})."
    if devices > 1:
        return (
            f"Multi-device serving was not run: the split {planned}, its communication and "
            "scaling are predicted only."
        )
    return "Serving on more than one device was not validated."
