"""The analysis's known limitations: features of the release that serving or validation
does not cover, noted for every pool. Registered as the stage's `findings` in
`engine.registry`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine import markdown as md
from engine.architecture.rope import TRANSFORMERS_ROPE_TYPES
from engine.findings import MAJOR, MINOR, Finding, cut_key, cut_title
from engine.stages.analyze.checkpoint_findings import checkpoint_findings


def findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """Features of the release that serving or validation does not cover, from its analysis
    (notes for every pool): MTP modules (speculative decoding), a RoPE type transformers
    does not implement, modeling code shipped with the release for a family day0 does not
    know, a layer kind day0 does not know (counted from a guess); and from the checkpoint's
    own tensors (`checkpoint_findings`): its count against the config's, missing, extra and
    wrong-shape tensors, layer and MTP counts. None for a result that is not an analysis.
    `pool` is not read: these notes hold on every pool (`Finding.all_pools`)."""
    if "mtp_layers" not in result and "rope" not in result:
        return None
    found = []
    mtp = result.get("mtp_layers") or 0
    if isinstance(mtp, int) and mtp > 0:
        found.append(
            Finding(
                key="analyze:mtp",
                title=cut_title(
                    f"{fmt.counted(mtp, 'MTP module')} for speculative decoding "
                    f"{'is' if mtp == 1 else 'are'} not validated or planned"
                ),
                body=(
                    "The checkpoint holds "
                    f"{fmt.counted(mtp, 'multi-token-prediction (MTP) module')} "
                    f"({fmt.count(result.get('extra_params'))} params in `extra_params`), which "
                    "serving engines can use as a draft model for speculative decoding. "
                    "transformers' causal-LM class does not build them, so the scaled twin "
                    "runs without them, and the plan does not load them: speculative decoding "
                    "with MTP is neither validated nor sized here. Their bytes are counted in "
                    "the checkpoint's `weight_bytes` (the whole checkpoint, MTP included: "
                    f"{fmt.gib(result.get('weight_bytes'))})."
                ),
                severity=MINOR,
                all_pools=True,
            )
        )
    rope = result.get("rope") or {}
    rope_type = rope.get("type") if isinstance(rope, Mapping) else None
    if rope_type and rope_type not in TRANSFORMERS_ROPE_TYPES:
        found.append(
            Finding(
                key="analyze:rope-type",
                title=cut_title(f"RoPE type {rope_type!s} is not one transformers implements"),
                body=(
                    f"The config's RoPE scaling type is {md.code(rope_type)}; transformers "
                    f"implements {', '.join(md.code(t) for t in sorted(TRANSFORMERS_ROPE_TYPES))}. "
                    "Only the release's own modeling code can run it: the scaled twin cannot "
                    "be built from transformers' class, and serving engines need support "
                    "for this type before they can serve the release."
                ),
                severity=MAJOR,
                all_pools=True,
            )
        )
    keys = result.get("config_keys") or []
    if "auto_map" in keys and result.get("family_known") is False:
        architecture = result.get("architecture") or result.get("model_type") or "?"
        found.append(
            Finding(
                key="analyze:remote-code",
                title=cut_title(f"{architecture} needs the release's own modeling code"),
                body=(
                    f"day0 does not know the family of {md.code(architecture)} and the config "
                    "names modeling code shipped with the release (`auto_map`). Where "
                    "transformers lacks the architecture, it runs only with "
                    "`trust_remote_code`: on a pool whose `trust_remote_code_orgs` lists the "
                    "release's org (day0 runs it in a sandboxed process), and with the same "
                    "trust in the serving engine."
                ),
                severity=MAJOR,
                all_pools=True,
            )
        )
    found += _layer_kind_findings(result)
    return found + checkpoint_findings(result)


# How a guessed layer kind reads in a finding (layer_kinds.py's kinds).
_COUNTED_AS = {
    "full_attention": "full attention",
    "sliding_attention": "sliding-window attention",
    "linear_attention": "linear attention",
}


def _layer_kind_findings(result: Mapping[str, Any]) -> list[Finding]:
    """One minor finding per `layer_types` name day0 does not know (`estimated_layer_kinds`):
    its layers were counted from a guess, so the figures that follow from it are estimates."""
    found = []
    exact_params = result.get("params_source") == "transformers meta-device build" or (
        result.get("params_counted_from") == "checkpoint"
    )
    for guess in result.get("estimated_layer_kinds") or []:
        if not isinstance(guess, Mapping):
            continue
        name = str(guess.get("name"))
        counted = _COUNTED_AS.get(str(guess.get("counted_as")), str(guess.get("counted_as")))
        layers = guess.get("layers") or []
        follows = "the KV-cache figures and the plan sized on them are estimates" + (
            "; the parameter counts are exact (not from the guess)"
            if exact_params
            else ", and so are the parameter counts"
        )
        found.append(
            Finding(
                key=cut_key(f"analyze:layer-kind:{name}"),
                title=cut_title(f"Layer kind {name} is not known to day0: counted as {counted}"),
                body=(
                    f"The config's `layer_types` names {md.code(name)} on "
                    f"{fmt.counted(len(layers), 'layer')}, a kind day0 does not know. Those "
                    f"layers are counted as {counted} from the config's standard keys (the "
                    f"analysis's assumptions say which): {follows}. Teach day0 the kind to "
                    "count it exactly."
                ),
                severity=MINOR,
                all_pools=True,
            )
        )
    return found
