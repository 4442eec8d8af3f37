"""The `analyze` stage: architecture analysis of the fetched config and weights summary,
corrected by the checkpoint's own tensors where the fetch stage read its safetensors headers
(`engine.architecture.checkpoint_analysis`)."""

from __future__ import annotations

from typing import Any

from engine.architecture import AnalysisError, analyze_config, compare_with_known
from engine.architecture.checkpoint_analysis import CHECKPOINT, with_checkpoint
from engine.contract import StageContext, StageFailed


def run(ctx: StageContext) -> dict[str, Any]:
    """Analyse `ctx.previous["fetch"]["config"]` (with its `weights` summary).

    Returns `ArchitectureAnalysis.to_dict()`, with the checkpoint's counts and checks when
    the fetch stage read its safetensors headers (`with_checkpoint`), plus
    `new_against_known`: what this release has that the analyses in `ctx.known_families` do
    not. A config that cannot be analysed, or a tensor list that is not one, fails the
    stage with `StageFailed` (a user error, never retried).
    """
    fetched = ctx.previous.get("fetch")
    if not isinstance(fetched, dict) or not isinstance(fetched.get("config"), dict):
        raise StageFailed("the fetch stage produced no config.json to analyse")
    weights = fetched.get("weights")
    try:
        analysis = analyze_config(fetched["config"], weights=weights)
        result = with_checkpoint(analysis.to_dict(), fetched["config"], weights)
    except AnalysisError as err:
        raise StageFailed(str(err)) from err
    result["new_against_known"] = compare_with_known(result, ctx.known_families)
    if result.get("params_counted_from") == CHECKPOINT:
        checkpoint = result[CHECKPOINT]
        total = checkpoint["comparison"]["figures"].get("total_params") or {}
        ctx.log(
            f"checkpoint: {checkpoint['tensor_count']:,} tensors, {checkpoint['total_params']:,}"
            f" params; the config gives {total.get('config', 0):,}"
        )
    ctx.log(
        f"{result['family']}: {result['total_params']:,} params "
        f"({result['active_params']:,} active), {result['attention']['kind']}, "
        f"KV {result['kv_cache_bytes_per_token']:,} B/token"
    )
    return result
