"""The analysis's section of the release notes ("release"): what the release is, from the
`analyze` stage's result, under the document's title (`templates/release_notes/sections/
analyze.md`). The section stands first and exists without an analysis too: the release, its
revision and the pool always head the notes. The section reads the result through
`AnalysisResult`.

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from typing import Any

from engine.notes import NotesContext, StageState
from engine.stages.analyze.result import AnalysisResult

KEY = "release"
PLACE = 0


def section(state: StageState, notes: NotesContext) -> dict[str, Any]:
    """{"repo_id", "revision", "pool"} of the release the notes are about, and with a
    succeeded analysis (read through `AnalysisResult`): its architecture, family, total and
    active parameters, attention kind, max context (tokens), checkpoint bytes, KV-cache bytes
    per token, quantization method, experts ({"routed", "per_token"} or None), MTP layers and
    what is new against the families seen before (one line per aspect)."""
    out: dict[str, Any] = {
        "repo_id": getattr(notes.release, "repo_id", ""),
        "revision": getattr(notes.release, "revision", ""),
        "pool": getattr(notes.pool, "name", ""),
    }
    if not state.succeeded or not state.result:
        return out
    analysis = AnalysisResult.from_stored(state.result)
    return out | {
        "architecture": analysis.architecture,
        "family": analysis.family_name,
        "total_params": analysis.total_params,
        "active_params": analysis.active_params,
        "attention": analysis.attention_kind,
        "max_context_tokens": analysis.max_position_embeddings,
        "weight_bytes": analysis.weight_bytes,
        "kv_cache_bytes_per_token": analysis.kv_cache_bytes_per_token,
        "quantization": analysis.quantization_method,
        "experts": (
            {"routed": analysis.experts_routed, "per_token": analysis.experts_per_token}
            if analysis.moe
            else None
        ),
        "mtp_layers": analysis.mtp_layers or 0,
        # Each line names its aspect already ("attention not seen before: ...").
        "new_against_known": [aspect.line for aspect in analysis.new_aspects],
    }
