"""The `analyze` stage: architecture analysis of the fetched config and weights summary."""

from __future__ import annotations

from typing import Any

from engine.architecture import AnalysisError, analyze_config, compare_with_known
from engine.contract import StageContext, StageFailed


def run(ctx: StageContext) -> dict[str, Any]:
    """Analyse `ctx.previous["fetch"]["config"]` (with its `weights` summary).

    Returns `ArchitectureAnalysis.to_dict()` plus `new_against_known`: what this release has
    that the analyses in `ctx.known_families` do not. A config that cannot be analysed fails
    the stage with `StageFailed` (a user error, never retried).
    """
    fetched = ctx.previous.get("fetch")
    if not isinstance(fetched, dict) or not isinstance(fetched.get("config"), dict):
        raise StageFailed("the fetch stage produced no config.json to analyse")
    try:
        analysis = analyze_config(fetched["config"], weights=fetched.get("weights"))
    except AnalysisError as err:
        raise StageFailed(str(err)) from err
    result = analysis.to_dict()
    result["new_against_known"] = compare_with_known(result, ctx.known_families)
    ctx.log(
        f"{result['family']}: {result['total_params']:,} params "
        f"({result['active_params']:,} active), {result['attention']['kind']}, "
        f"KV {result['kv_cache_bytes_per_token']:,} B/token"
    )
    return result
