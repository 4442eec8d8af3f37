"""The `fetch` stage: get a release's describing files from its hub and parse them.

`config.json`, `generation_config.json`, `model.safetensors.index.json` and `README.md` are
fetched and parsed; the header of every safetensors weight file is read, index or not (never
the weights), and every tensor's name, dtype and shape kept, folded by layer and expert
number, for the `analyze` stage to count and check.
The release's tokenizer files (`tokenizer.json`, `tokenizer_config.json`, a sentencepiece or
tiktoken model, ...) are fetched too and stored content-addressed on the worker's disk for
the `serve` stage (`tokenizer.py`: which files, the caps, where they are kept); the result's
`tokenizer` says where and what.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from engine import formatting as fmt
from engine.architecture.checkpoint_names import fold_tensors
from engine.contract import StageContext, StageFailed, StageTransientError
from engine.hubs import HubSpec, hub_source
from engine.hubs.base import INDEX_FILE, HubError, ReleaseFiles, tensor_nbytes
from engine.hubs.safetensors_headers import MAX_TENSORS, shown, tensor_problem
from engine.json_files import JSONFileError, parse_json_bytes
from engine.stages.fetch.tokenizer import fetch_tokenizer

README_EXCERPT_CHARS = 4000
# Tensor names listed where the index and the headers disagree, at most.
SHOWN_NAMES = 10


def parse_json_file(name: str, raw: bytes) -> Any:
    """Parse one fetched JSON file (`json_files.parse_json_bytes`, the parse the hub sources
    use for the index too).

    Raises `StageFailed` naming the file and the line, column and character offset of the
    first error (from `json.JSONDecodeError`), or saying it is not UTF-8, holds NaN or
    Infinity, or is nested too deeply to read.
    """
    try:
        return parse_json_bytes(name, raw)
    except JSONFileError as exc:
        raise StageFailed(exc.message) from exc


def _index_weight_map(index: Any) -> dict[str, Any]:
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise StageFailed(f"{INDEX_FILE} has no 'weight_map' object.")
    return weight_map


def _index_total(index: dict[str, Any]) -> int | None:
    """The byte count the index's `metadata.total_size` states; None when it states none
    (no `metadata`, no `total_size`, or null). Raises `StageFailed` naming the file for one
    that is not a byte count: not an object, a string, a negative or fractional number, or
    one past any float (`1e400` is parsed as infinity)."""
    metadata = index.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise StageFailed(f"{INDEX_FILE}: 'metadata' is {shown(metadata)}, not an object.")
    total = metadata.get("total_size")
    if total is None:
        return None
    if isinstance(total, float) and math.isfinite(total) and total.is_integer():
        total = int(total)
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        raise StageFailed(f"{INDEX_FILE}: metadata.total_size {shown(total)} is not a byte count.")
    return total


def _names(names: set[str]) -> dict[str, Any]:
    return {"count": len(names), "names": sorted(names)[:SHOWN_NAMES]}


def summarize_weights(
    index: dict[str, Any] | None, safetensors_metadata: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Summarize the checkpoint from its safetensors headers (else from its index alone).

    From headers: {"source": "safetensors_headers", "total_size": bytes of every tensor,
    "shard_count": files read, "tensor_count", "dtypes": {dtype: bytes}, "tensors": every
    tensor folded by layer and expert number (`checkpoint_names.fold_tensors`: a few dozen
    entries for 100,000 tensors)}, plus "duplicates" (a name in two files) and, with an
    index, "index_total_size" (bytes its metadata states) and "index_mismatch" (names in
    the index only or in the headers only: {"index_only", "headers_only"}, each {"count",
    "names"}) when they differ. From an index alone: {"source": "index", "total_size",
    "shard_count", "tensor_count", "dtypes": {}}. None when the release has neither.
    Raises `StageFailed` when the index has no `weight_map` object or a `metadata.total_size`
    that is not a byte count, or when a tensor is not one day0 can store
    (`safetensors_headers.tensor_problem`: an unknown dtype, a name over
    `MAX_NAME_CHARS` characters, a shape past `MAX_RANK` dims or `MAX_DIM` elements a dim)
    or there are over `MAX_TENSORS` of them; the reason names the tensor.
    """
    weight_map = _index_weight_map(index) if index is not None else None
    if safetensors_metadata is not None:
        tensors = safetensors_metadata.get("tensors", {})
        if len(tensors) > MAX_TENSORS:
            raise StageFailed(
                f"the safetensors headers hold {len(tensors):,} tensors; day0 reads at most "
                f"{MAX_TENSORS:,}."
            )
        per_dtype: Counter[str] = Counter()
        for name, info in tensors.items():
            problem = tensor_problem(name, info.get("dtype"), info.get("shape", []))
            if problem is not None:
                raise StageFailed(f"safetensors header of {problem}.")
            per_dtype[info["dtype"]] += tensor_nbytes(info["dtype"], info.get("shape", []))
        summary: dict[str, Any] = {
            "source": "safetensors_headers",
            "total_size": int(safetensors_metadata.get("total_size") or sum(per_dtype.values())),
            "shard_count": int(safetensors_metadata.get("shard_count", 1)),
            "tensor_count": len(tensors),
            "dtypes": dict(per_dtype),
            "tensors": fold_tensors(tensors),
        }
        if safetensors_metadata.get("duplicates"):
            summary["duplicates"] = safetensors_metadata["duplicates"]
        if index is not None and weight_map is not None:
            summary["index_total_size"] = _index_total(index)
            index_only = set(weight_map) - set(tensors)
            headers_only = set(tensors) - set(weight_map)
            if index_only or headers_only:
                summary["index_mismatch"] = {
                    "index_only": _names(index_only),
                    "headers_only": _names(headers_only),
                }
        return summary
    if index is not None and weight_map is not None:
        return {
            "source": "index",
            "total_size": _index_total(index),
            "shard_count": len(set(weight_map.values())),
            "tensor_count": len(weight_map),
            "dtypes": {},
        }
    return None


def parse_release_files(fetched: ReleaseFiles) -> dict[str, Any]:
    """Turn fetched bytes into the stage result. Raises `StageFailed` on bad files."""
    if "config.json" not in fetched.files:
        raise StageFailed(f"{fetched.repo_id}@{fetched.revision} has no config.json.")
    config = parse_json_file("config.json", fetched.files["config.json"])
    if not isinstance(config, dict):
        raise StageFailed("config.json is valid JSON but not an object.")
    generation_config = None
    if "generation_config.json" in fetched.files:
        generation_config = parse_json_file(
            "generation_config.json", fetched.files["generation_config.json"]
        )
    index = None
    if INDEX_FILE in fetched.files:
        index = parse_json_file(INDEX_FILE, fetched.files[INDEX_FILE])
    readme = fetched.files.get("README.md", b"").decode("utf-8", errors="replace")
    return {
        "repo_id": fetched.repo_id,
        "revision": fetched.revision,
        "files": sorted(fetched.files),
        "config": config,
        "generation_config": generation_config,
        "weights": summarize_weights(index, fetched.safetensors_metadata),
        "readme_excerpt": readme[:README_EXCERPT_CHARS],
        "file_count": len(fetched.file_sizes),
    }


def run(ctx: StageContext) -> dict[str, Any]:
    """Fetch and parse the release's files from its hub, then fetch its tokenizer files.

    The result is `parse_release_files`'s with `tokenizer` added (`fetch_tokenizer`'s: the
    folder, the files stored, those skipped and why, the kind).
    """
    release = ctx.release
    spec = HubSpec(kind=release.hub_kind, endpoint=release.hub_endpoint)
    try:
        source = hub_source(spec)
        fetched = source.fetch_release(release.repo_id, release.revision)
    except HubError as exc:
        if exc.transient:
            raise StageTransientError(
                exc.message, retry_after_s=getattr(exc, "retry_after_s", None)
            ) from exc
        raise StageFailed(exc.message) from exc
    except ValueError as exc:  # unknown hub kind
        raise StageFailed(str(exc)) from exc
    ctx.log(f"fetched {', '.join(sorted(fetched.files))} from {release.hub_kind}")
    result = parse_release_files(fetched)
    weights = result.get("weights") or {}
    if weights.get("source") == "safetensors_headers":
        ctx.log(
            f"read the safetensors headers of {fmt.counted(weights['shard_count'], 'file')}: "
            f"{weights['tensor_count']:,} tensors, {weights['total_size']:,} bytes of weights"
        )
    tokenizer = fetch_tokenizer(source, fetched.repo_id, fetched.revision, fetched.file_sizes)
    stored = ", ".join(entry["name"] for entry in tokenizer["files"]) or "none"
    ctx.log(f"tokenizer ({tokenizer['kind']}): {stored}")
    for entry in tokenizer["skipped"]:
        ctx.log(f"tokenizer file {entry['name']} skipped: {entry['reason']}")
    result["tokenizer"] = tokenizer
    return result
