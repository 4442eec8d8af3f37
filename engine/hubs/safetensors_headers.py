"""Every safetensors header of a release, never its weights.

A safetensors file starts with an 8-byte little-endian length and a JSON header naming each
tensor's dtype, shape and byte span; the weights follow. The `fetch` stage reads the header
of every weight file of a release (index or not), so later stages can count and check the
checkpoint's own tensors:

- Hub: one HTTP range request per file (two when its header is over 100 kB), through
  `huggingface_hub`'s `HfApi.parse_safetensors_file_metadata`, `HEADER_WORKERS` files at a
  time. A 429 is waited out here (its `Retry-After`, else 1, 2, 4, 8 s) while the waits of all
  the files together stay within `MAX_RATE_LIMIT_WAIT_S`; past that the error goes up for the
  task to retry later.
  Each header read is kept on disk per revision (`HeaderCache`), so a retried fetch asks
  again only for the files it had not read.
- Mirror folders: `huggingface_hub.parse_local_safetensors_file_metadata`, which reads the
  8-byte length and the header bytes only and refuses a header length over its 25 MB cap.

Which files: those the index names; without an index `model.safetensors`, else every
`*.safetensors` at the repo's top level (the files transformers would load).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from engine import formatting as fmt
from engine.hubs.base import INDEX_FILE, HubError, HubNotFound, tensor_nbytes
from engine.paths import var_dir

# Files whose headers are read at once (threads, each one HTTP request at a time).
HEADER_WORKERS = 8
# Seconds a release's header reads may spend waiting out 429s, all files together, before
# the error goes to the caller (the fetch stage's soft limit is 120 s).
MAX_RATE_LIMIT_WAIT_S = 30.0
# Waits after a 429 that names none (seconds), in turn.
_BACKOFF_S = (1.0, 2.0, 4.0, 8.0)
# Names listed in a summary at most (duplicates), the rest counted.
SHOWN_NAMES = 10

SINGLE_FILE = "model.safetensors"
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")

# One tensor as a header describes it: {"dtype": "BF16", "shape": [4096, 4096]}.
Tensors = dict[str, dict[str, Any]]


def weight_files(names: Iterable[str], index: bytes | None) -> list[str] | None:
    """The safetensors files of a release whose repo holds `names`: the shards the index
    (`index`: its bytes) names, else `model.safetensors`, else every top-level
    `*.safetensors`; sorted. None when the index cannot be parsed (the fetch stage reports
    that file's error). Raises `HubNotFound` naming shards the index lists that the repo
    lacks (an upload in progress)."""
    present = set(names)
    if index is not None:
        try:
            weight_map = json.loads(index.decode("utf-8-sig")).get("weight_map")
        except (UnicodeDecodeError, ValueError, AttributeError):
            return None
        if not isinstance(weight_map, Mapping):
            return None
        shards = sorted({str(shard) for shard in weight_map.values()})
        missing = [shard for shard in shards if shard not in present]
        if missing:
            shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
            raise HubNotFound(
                f"{INDEX_FILE} names {fmt.counted(len(missing), 'shard')} the repo does not hold: "
                f"{shown}"
            )
        return shards
    if SINGLE_FILE in present:
        return [SINGLE_FILE]
    return sorted(n for n in present if n.endswith(".safetensors") and "/" not in n)


def _tensors_of(file_metadata: Any, filename: str, subject: str) -> Tensors:
    """{name: {"dtype", "shape", "data_offsets"}} from a `SafetensorsFileMetadata`, each
    entry checked: a known dtype, non-negative integer dims, a byte span that fits them.
    Raises `HubError` naming the file and the tensor."""
    tensors: Tensors = {}
    for name, info in file_metadata.tensors.items():
        shape = list(info.shape)
        offsets = list(info.data_offsets)
        where = f"{subject}: safetensors header of {filename}, tensor {name!r}"
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise HubError(f"{where}: shape {shape!r} is not a list of non-negative integers.")
        if len(offsets) != 2 or not all(isinstance(o, int) and o >= 0 for o in offsets):
            raise HubError(f"{where}: data_offsets {offsets!r} are not two byte offsets.")
        try:
            nbytes = tensor_nbytes(info.dtype, shape)
        except ValueError as exc:
            raise HubError(f"{where}: {exc}.") from exc
        if offsets[1] - offsets[0] != nbytes:
            raise HubError(
                f"{where}: data_offsets span {offsets[1] - offsets[0]:,} bytes but a "
                f"{info.dtype} tensor of shape {shape} takes {nbytes:,}."
            )
        tensors[name] = {"dtype": info.dtype, "shape": shape, "data_offsets": offsets}
    return tensors


def merge_headers(headers: Mapping[str, Tensors]) -> dict[str, Any]:
    """One release's tensors from its files' headers ({filename: tensors}):
    {"total_size": bytes of every tensor, "shard_count": files, "tensors": {name: {"dtype",
    "shape"}}, "duplicates": {"count", "names"} (a name in more than one file: the later
    file's entry is kept)}."""
    tensors: Tensors = {}
    duplicates: list[str] = []
    total = 0
    for filename in sorted(headers):
        for name, info in headers[filename].items():
            if name in tensors:
                duplicates.append(name)
            start, end = info["data_offsets"]
            total += end - start
            tensors[name] = {"dtype": info["dtype"], "shape": list(info["shape"])}
    merged: dict[str, Any] = {"total_size": total, "shard_count": len(headers), "tensors": tensors}
    if duplicates:
        merged["duplicates"] = {"count": len(duplicates), "names": sorted(duplicates)[:SHOWN_NAMES]}
    return merged


def read_local_headers(repo_id: str, folder: Path, filenames: list[str]) -> dict[str, Any]:
    """`merge_headers` of the safetensors files in `folder`, reading from each only its
    8-byte length and its header. Raises `HubError` naming the file when a header cannot
    be read: too short, a length over the library's 25 MB cap or past the file's end, bad
    JSON, an entry that does not add up."""
    from huggingface_hub import parse_local_safetensors_file_metadata
    from huggingface_hub.errors import SafetensorsParsingError

    headers: dict[str, Tensors] = {}
    for filename in filenames:
        try:
            metadata = parse_local_safetensors_file_metadata(folder / filename)
        except (SafetensorsParsingError, OSError, ValueError) as exc:
            raise HubError(
                f"{repo_id}: cannot read the safetensors header of {filename}: {exc}"
            ) from exc
        headers[filename] = _tensors_of(metadata, filename, repo_id)
    return merge_headers(headers)


class HeaderCache:
    """Header reads of one repo at one commit, kept on disk:
    `<DAY0_VAR_DIR>/safetensors-headers/<key>/<file>.json`, where `<key>` is the sha256 of
    the hub endpoint, repo id and commit. A commit never changes, so an entry never goes
    stale; a `revision` that is not a 40-hex commit sha (a branch) is not cached."""

    def __init__(self, endpoint: str, repo_id: str, revision: str) -> None:
        self.enabled = bool(_SHA_RE.match(revision))
        key = hashlib.sha256(f"{endpoint}\0{repo_id}\0{revision}".encode()).hexdigest()
        self.folder = var_dir("safetensors-headers", key)

    def _path(self, filename: str) -> Path:
        return self.folder / (filename.replace("%", "%25").replace("/", "%2F") + ".json")

    def get(self, filename: str) -> Tensors | None:
        """The cached header of `filename`, or None (not cached, or unreadable)."""
        if not self.enabled:
            return None
        try:
            tensors = json.loads(self._path(filename).read_text())
        except (OSError, ValueError):
            return None
        return tensors if isinstance(tensors, dict) else None

    def put(self, filename: str, tensors: Tensors) -> None:
        """Keep `tensors` (written under a temporary name, then renamed into place). A disk
        that refuses the write costs a re-read later, nothing else."""
        if not self.enabled:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
            with os.fdopen(fd, "w") as handle:
                json.dump(tensors, handle, separators=(",", ":"))
            os.replace(tmp, self._path(filename))
        except OSError:
            pass


def _status_and_headers(exc: BaseException) -> tuple[int | None, Mapping[str, str]]:
    response = getattr(exc, "response", None)
    if response is None:
        return None, {}
    return getattr(response, "status_code", None), getattr(response, "headers", {}) or {}


def read_hub_headers(
    api: Any,
    repo_id: str,
    revision: str,
    filenames: list[str],
    *,
    cache: HeaderCache,
    timeout_s: float,
    workers: int = HEADER_WORKERS,
    max_wait_s: float = MAX_RATE_LIMIT_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """`merge_headers` of `filenames` in `repo_id` at `revision`, read by HTTP range requests
    through `api.parse_safetensors_file_metadata` (`api`: an `HfApi`, whose token rule the
    caller set), `workers` files at a time, cached in `cache`.

    A 429 is retried after its `Retry-After` (else 1, 2, 4, 8 s) while the waits of all the
    files together stay within `max_wait_s` seconds (so the read ends within the fetch
    stage's time limit however many files meet a 429). Raises what the library raised (the
    first failure; the other reads are cancelled, those done are cached) or `HubError` for a
    header that does not add up.
    """
    from huggingface_hub.errors import HfHubHTTPError

    from engine.hubs.http import retry_after_seconds

    waited = [0.0]  # seconds spent waiting, all files together (the budget is shared)
    lock = threading.Lock()

    def take_wait(wait_s: float) -> bool:
        with lock:
            if waited[0] + wait_s > max_wait_s:
                return False
            waited[0] += wait_s
            return True

    def read(filename: str) -> Tensors:
        cached = cache.get(filename)
        if cached is not None:
            return cached
        attempt = 0
        while True:
            try:
                metadata = api.parse_safetensors_file_metadata(
                    repo_id, filename, revision=revision, timeout=timeout_s
                )
                break
            except HfHubHTTPError as exc:
                status, headers = _status_and_headers(exc)
                if status != 429:
                    raise
                wait_s = retry_after_seconds(headers)
                if wait_s is None:
                    if attempt >= len(_BACKOFF_S):
                        raise
                    wait_s = _BACKOFF_S[attempt]
                if not take_wait(wait_s):
                    raise
                sleep(wait_s)
                attempt += 1
        tensors = _tensors_of(metadata, filename, f"{repo_id}@{revision}")
        cache.put(filename, tensors)
        return tensors

    headers: dict[str, Tensors] = {}
    if not filenames:
        return merge_headers(headers)
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(filenames))))
    try:
        futures = {pool.submit(read, name): name for name in filenames}
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in done if f.exception() is not None), None)
        if failed is not None:
            raise failed.exception()  # type: ignore[misc]
        for future, name in futures.items():
            headers[name] = future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return merge_headers(headers)
