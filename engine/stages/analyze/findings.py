"""The analysis's known limitations: features of the release that serving or validation
does not cover, noted for every pool. Registered as the stage's `findings` in
`engine.registry`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt
from engine import markdown as md
from engine.architecture.rope import TRANSFORMERS_ROPE_TYPES
from engine.findings import MAJOR, MINOR, Finding, cut_title
from engine.stages.analyze.checkpoint_findings import checkpoint_findings


def findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """Features of the release that serving or validation does not cover, from its analysis
    (notes for every pool): MTP modules (speculative decoding), a RoPE type transformers
    does not implement, modeling code shipped with the release for a family day0 does not
    know; and from the checkpoint's own tensors (`checkpoint_findings`): its count against
    the config's, missing, extra and wrong-shape tensors, layer and MTP counts. None for a
    result that is not an analysis. `pool` is not read: these notes hold on every pool
    (`Finding.all_pools`)."""
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
    return found + checkpoint_findings(result)
