"""The config-derived analysis corrected by the checkpoint's own tensors.

`with_checkpoint` takes an analysis (`ArchitectureAnalysis.to_dict()`) and the fetch stage's
weights summary. When the summary holds the tensors of every safetensors header, the
checkpoint's counts (`checkpoint.count_checkpoint`) replace the config-derived ones: with
headers, `total_params` is exactly the checkpoint's. The config-derived figures stay under
`config_figures`, the two side by side with their differences under
`checkpoint.comparison`, and the checkpoint checked against the config under
`checkpoint_check`. Without tensors the analysis is returned as it was, counted from the
config (`params_counted_from` says which).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import formatting as fmt

from .checkpoint import OUTSIDE_TOTAL, TOWER, classify_for, compare_counts, count_checkpoint
from .checkpoint_check import check_checkpoint
from .checkpoint_expected import ExpectedBuildError, expected_tensors
from .checkpoint_names import unfold_tensors
from .errors import AnalysisError

CHECKPOINT = "checkpoint"
CONFIG = "config"

# Analysis figures the checkpoint's counts replace, and the checkpoint's key for each.
REPLACED = {
    "total_params": "total_params",
    "active_params": "active_params",
    "active_params_including_embedding": "active_params_including_embedding",
    "extra_params": "extra_params",
    "embedding_params": "embedding_params",
    "multimodal_tower_params": "multimodal_tower_params",
    "router_score_bias_params": "buffer_params",
    "weight_bytes": "weight_bytes",
    "weight_bytes_by_dtype": "bytes_by_dtype",
}

CONVENTION = (
    "with safetensors headers, total_params, active_params, extra_params, "
    "embedding_params, multimodal_tower_params, router_score_bias_params, params_by_group "
    "and weight_bytes are the checkpoint's own: every tensor by logical elements (packed "
    "4-bit values unpacked), quantization scales as bytes only, MTP modules in extra_params, "
    "towers and buffers outside total_params; config_figures keeps the config-derived ones "
    "and checkpoint.comparison the differences"
)


def checkpoint_tensors(weights: Mapping[str, Any] | None) -> dict[str, dict[str, Any]] | None:
    """Every tensor `{name: {"dtype", "shape"}}` of the fetch stage's weights summary, None
    when it holds none (an index without headers, or no safetensors). Raises
    `AnalysisError` for a summary whose tensor list is not one."""
    if not isinstance(weights, Mapping) or weights.get("tensors") is None:
        return None
    entries = weights["tensors"]
    if not isinstance(entries, list):
        raise AnalysisError("weights.tensors must be a list of tensor entries")
    try:
        tensors = unfold_tensors(entries)
    except (KeyError, TypeError, ValueError) as exc:
        raise AnalysisError(f"weights.tensors holds an entry that is not one: {exc}") from exc
    return tensors or None


def with_checkpoint(
    result: dict[str, Any], config: Mapping[str, Any], weights: Mapping[str, Any] | None
) -> dict[str, Any]:
    """`result` (an analysis dict, changed in place and returned) with the checkpoint's
    counts and checks when `weights` holds the headers' tensors (see the module). Raises
    `AnalysisError` for a tensor list that is not one or a dtype safetensors does not
    define."""
    tensors = checkpoint_tensors(weights)
    if tensors is None:
        result["params_counted_from"] = CONFIG
        return result
    expected = None
    why_not = None
    try:
        expected = expected_tensors(config)
        if expected is None:
            why_not = "transformers knows neither the model type nor the architecture"
    except ExpectedBuildError as err:
        why_not = str(err)
    buffers = (
        frozenset(
            name
            for name, info in tensors.items()
            if expected.is_buffer(name, tuple(info.get("shape", ())))
        )
        if expected is not None
        else frozenset()
    )
    try:
        counted = classify_for(tensors, result, buffers=buffers)
    except ValueError as exc:
        raise AnalysisError(f"the checkpoint's safetensors headers: {exc}") from exc
    count = count_checkpoint(counted, result)
    comparison = compare_counts(result, count)
    check = check_checkpoint(
        counted,
        result,
        expected,
        why_no_expected=why_not,
        duplicates=weights.get("duplicates") if isinstance(weights, Mapping) else None,
        index_mismatch=weights.get("index_mismatch") if isinstance(weights, Mapping) else None,
    )
    result["config_figures"] = {
        key: result.get(key) for key in (*REPLACED, "params_by_group", "estimated")
    }
    for key, ckpt_key in REPLACED.items():
        result[key] = count[ckpt_key]
    result["params_by_group"] = {
        group: value
        for group, value in count["params_by_group"].items()
        if group not in OUTSIDE_TOTAL or group == TOWER
    }
    result["estimated"] = False
    result["params_counted_from"] = CHECKPOINT
    result[CHECKPOINT] = dict(count, comparison=comparison)
    result["checkpoint_check"] = check
    shards = weights.get("shard_count") if isinstance(weights, Mapping) else None
    notes = result.setdefault("notes", [])
    notes.append(
        f"parameters counted from the checkpoint's {count['tensor_count']:,} tensors "
        f"(safetensors headers of {fmt.counted(shards, 'file')}); the config-derived figures "
        "are in config_figures"
    )
    notes += count["notes"]
    conventions = result.setdefault("conventions", {})
    conventions["params_counted_from"] = CONVENTION
    return result
