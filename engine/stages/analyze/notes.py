"""The analysis's section of the release notes ("release"): what the release is, from the
`analyze` stage's result, under the document's title (`templates/release_notes/sections/
analyze.md`). The section stands first and exists without an analysis too: the release, its
revision and the pool always head the notes.

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.notes import NotesContext, StageState

KEY = "release"
PLACE = 0


def section(state: StageState, notes: NotesContext) -> dict[str, Any]:
    """{"repo_id", "revision", "pool"} of the release the notes are about, and with a
    succeeded analysis: its architecture, family, total and active parameters, attention
    kind, max context (tokens), checkpoint bytes, KV-cache bytes per token, quantization
    method, experts ({"routed", "per_token"} or None), MTP layers and what is new against
    the families seen before (one line per aspect)."""
    out: dict[str, Any] = {
        "repo_id": getattr(notes.release, "repo_id", ""),
        "revision": getattr(notes.release, "revision", ""),
        "pool": getattr(notes.pool, "name", ""),
    }
    analysis = state.result if state.succeeded else None
    if not analysis:
        return out
    moe = analysis.get("moe") or None
    quant = analysis.get("quantization") or None
    return out | {
        "architecture": analysis.get("architecture"),
        "family": analysis.get("family") or analysis.get("model_type"),
        "total_params": analysis.get("total_params"),
        "active_params": analysis.get("active_params"),
        "attention": (analysis.get("attention") or {}).get("kind"),
        "max_context_tokens": analysis.get("max_position_embeddings"),
        "weight_bytes": analysis.get("weight_bytes"),
        "kv_cache_bytes_per_token": analysis.get("kv_cache_bytes_per_token"),
        "quantization": (quant or {}).get("method") if quant else None,
        "experts": (
            {"routed": moe.get("num_experts"), "per_token": moe.get("experts_per_token")}
            if moe
            else None
        ),
        "mtp_layers": analysis.get("mtp_layers") or 0,
        # Each detail names its aspect already ("attention not seen before: ...").
        "new_against_known": [
            str(item.get("detail") or item.get("aspect"))
            for item in analysis.get("new_against_known") or []
            if isinstance(item, Mapping)
        ],
    }
