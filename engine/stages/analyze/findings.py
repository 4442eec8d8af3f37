"""The analysis's known limitations: features of the release that serving or validation
does not cover, noted for every pool. Registered as the stage's `findings` in
`engine.registry`; their words are `templates/limitations/analyze/`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.architecture.rope import TRANSFORMERS_ROPE_TYPES
from engine.findings import MAJOR, MINOR, Finding, cut_key
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
                template="analyze/mtp",
                data={
                    "mtp": mtp,
                    "extra_params": result.get("extra_params"),
                    "weight_bytes": result.get("weight_bytes"),
                },
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
                template="analyze/rope-type",
                data={"rope_type": str(rope_type), "known": sorted(TRANSFORMERS_ROPE_TYPES)},
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
                template="analyze/remote-code",
                data={"architecture": str(architecture)},
                severity=MAJOR,
                all_pools=True,
            )
        )
    found += _layer_kind_findings(result)
    return found + checkpoint_findings(result)


def _layer_kind_findings(result: Mapping[str, Any]) -> list[Finding]:
    """One minor finding per `layer_types` name day0 does not know (`estimated_layer_kinds`):
    its layers were counted from a guess (`counted_as`: one of `layer_kinds.py`'s kinds), so
    the figures that follow from it are estimates; the parameter counts are exact when
    transformers built the model or the checkpoint was counted (`exact_params`)."""
    found = []
    exact_params = result.get("params_source") == "transformers meta-device build" or (
        result.get("params_counted_from") == "checkpoint"
    )
    for guess in result.get("estimated_layer_kinds") or []:
        if not isinstance(guess, Mapping):
            continue
        name = str(guess.get("name"))
        found.append(
            Finding(
                key=cut_key(f"analyze:layer-kind:{name}"),
                template="analyze/layer-kind",
                data={
                    "name": name,
                    "counted_as": str(guess.get("counted_as")),
                    "layers": len(guess.get("layers") or []),
                    "exact_params": exact_params,
                },
                severity=MINOR,
                all_pools=True,
            )
        )
    return found
