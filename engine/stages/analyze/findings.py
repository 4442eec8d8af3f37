"""The analysis's known limitations: features of the release that serving or validation
does not cover, noted for every pool. Registered as the stage's `findings` in
`engine.registry`; their words are `templates/limitations/analyze/`. What they say of the
analysis they ask its typed result (`AnalysisResult`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.architecture.rope import TRANSFORMERS_ROPE_TYPES
from engine.findings import MAJOR, MINOR, Finding, cut_key
from engine.stages.analyze.checkpoint_findings import checkpoint_findings
from engine.stages.analyze.result import AnalysisResult


def findings(result: Mapping[str, Any], *, pool: str) -> list[Finding] | None:
    """Features of the release that serving or validation does not cover, from its analysis
    (notes for every pool): MTP modules (speculative decoding), a RoPE type transformers
    does not implement, modeling code shipped with the release for a family day0 does not
    know, a layer kind day0 does not know (counted from a guess); and from the checkpoint's
    own tensors (`checkpoint_findings`): its count against the config's, missing, extra and
    wrong-shape tensors, layer and MTP counts. None for a result that is not an analysis.
    `pool` is not read: these notes hold on every pool (`Finding.all_pools`)."""
    analysis = AnalysisResult.from_stored(result)
    if not analysis.is_analysis:
        return None
    found = []
    if analysis.has_mtp:
        found.append(
            Finding(
                key="analyze:mtp",
                template="analyze/mtp",
                data={
                    "mtp": analysis.mtp_layers,
                    "extra_params": analysis.extra_params,
                    "weight_bytes": analysis.weight_bytes,
                },
                severity=MINOR,
                all_pools=True,
            )
        )
    if analysis.rope_type_unknown:
        found.append(
            Finding(
                key="analyze:rope-type",
                template="analyze/rope-type",
                data={"rope_type": analysis.rope_type, "known": sorted(TRANSFORMERS_ROPE_TYPES)},
                severity=MAJOR,
                all_pools=True,
            )
        )
    if analysis.ships_code_for_unknown_family:
        found.append(
            Finding(
                key="analyze:remote-code",
                template="analyze/remote-code",
                data={"architecture": analysis.architecture or analysis.model_type or "?"},
                severity=MAJOR,
                all_pools=True,
            )
        )
    found += _layer_kind_findings(analysis)
    return found + checkpoint_findings(analysis)


def _layer_kind_findings(analysis: AnalysisResult) -> list[Finding]:
    """One minor finding per `layer_types` name day0 does not know (`layer_kind_estimates`):
    its layers were counted from a guess (`counted_as`: one of `layer_kinds.py`'s kinds), so
    the figures that follow from it are estimates; the parameter counts are exact when
    transformers built the model or the checkpoint was counted (`exact_params`)."""
    return [
        Finding(
            key=cut_key(f"analyze:layer-kind:{estimate.name}"),
            template="analyze/layer-kind",
            data={
                "name": estimate.name,
                "counted_as": estimate.counted_as,
                "layers": estimate.layers,
                "exact_params": analysis.exact_params,
            },
            severity=MINOR,
            all_pools=True,
        )
        for estimate in analysis.layer_kind_estimates
    ]
